"""The machine-wide tower cache (issue 68): a tower converted once per machine is shared by every process that
asks at once (one export, the others wait and read it), and an entry that is damaged or not the model's own is
made again, never loaded. The real base model, its real export."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from encoders.onnx_export import ensure_export
from encoders.onnx_towers import export_dir_for
from encoders.registry import build_towers
from encoders.towers import base_model_path

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TEXT = "Hemoglobin carries oxygen from the lungs to the tissues."
CHILD = """
import json, sys
from pathlib import Path
from encoders.registry import load_towers
towers = load_towers("base", Path(sys.argv[1]) / "models", backend=sys.argv[2], cache_dir=Path(sys.argv[1]) / "cache")
print(json.dumps({"fingerprint": towers.fingerprint, "vector": towers.encode_documents([sys.argv[3]])[0].tolist()}))
"""


def _load(cache: Path, backend: str = "onnx") -> np.ndarray:
    towers = build_towers(base_model_path(), "base", backend=backend,  # type: ignore[arg-type]
                          models_dir=cache / "models", cache_dir=cache)
    return towers.encode_documents([TEXT])[0]


def test_processes_that_ask_at_once_share_one_export(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    children = [subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), backend, TEXT], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for backend in ("openvino-bf16", "onnx-int8", "openvino-fp32", "onnx")]
    answers = []
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err[-2000:]
        answers.append(json.loads(out.splitlines()[-1]))
    entries = [p.name for p in (tmp_path / "cache").iterdir()]
    assert len([e for e in entries if not e.startswith(".")]) == 1, entries  # one entry, no staging left behind
    assert not [e for e in entries if ".staging-" in e or ".old-" in e]
    assert len({a["fingerprint"] for a in answers}) == 1  # every faithful path keeps the model's fingerprint
    vectors = np.array([a["vector"] for a in answers])
    assert (vectors @ vectors[3]).min() > 0.99  # bf16 and int8 against fp32, one passage
    assert vectors[2] @ vectors[3] > 0.99999  # OpenVINO fp32 (the path without AMX) is ONNX Runtime fp32's
    manifest = json.loads(next(p for p in (tmp_path / "cache").iterdir() if not p.name.startswith("."))
                          .joinpath("manifest.json").read_text())
    assert set(manifest["variants"]) >= {"onnx", "onnx-int8", "openvino-bf16", "openvino-fp32"}
    assert all(v.get("runtime") for v in manifest["variants"].values())  # each measured with its runtime


@pytest.fixture()
def cached(tmp_path: Path, onnx_cache: Path) -> tuple[Path, Path]:
    """A copy of the session's export of the base model in a cache of this test's own."""
    source = export_dir_for(base_model_path(), onnx_cache, onnx_cache)
    ensure_export(base_model_path(), source)
    cache = tmp_path / "cache"
    entry = export_dir_for(base_model_path(), cache, cache)
    shutil.copytree(source, entry, ignore=shutil.ignore_patterns("openvino"))
    return cache, entry


def test_a_truncated_entry_is_made_again(cached: tuple[Path, Path]) -> None:
    cache, entry = cached
    before = _load(cache)
    os.truncate(entry / "shared" / "model.onnx.data", 1000)
    after = _load(cache)
    np.testing.assert_allclose(after, before, atol=1e-5)
    assert (entry / "shared" / "model.onnx.data").stat().st_size > 1_000_000


def test_weights_changed_in_place_are_caught_by_the_probes_and_made_again(cached: tuple[Path, Path]) -> None:
    cache, entry = cached
    before = _load(cache)
    weights = entry / "shared" / "model.onnx.data"
    size = weights.stat().st_size
    with open(weights, "r+b") as f:  # same size: only the probe check can tell
        f.seek(size // 3)
        f.write(np.random.default_rng(0).standard_normal(size // 8, dtype=np.float32).tobytes()[: size // 3])
    after = _load(cache)
    np.testing.assert_allclose(after, before, atol=1e-5)


def test_an_entry_of_another_model_is_made_again(cached: tuple[Path, Path]) -> None:
    cache, entry = cached
    manifest = json.loads((entry / "manifest.json").read_text())
    manifest["model_files"] = [["model.safetensors", 1, 1]]
    manifest["model_fingerprint"] = "0123456789abcdef"  # as if another model's export sat under this key
    (entry / "manifest.json").write_text(json.dumps(manifest))
    towers = build_towers(base_model_path(), "base", backend="onnx", models_dir=cache / "models", cache_dir=cache)
    assert towers.fingerprint != "0123456789abcdef"
    assert json.loads((entry / "manifest.json").read_text())["model_fingerprint"] == towers.fingerprint
