"""ONNX towers of the real base model against its torch towers, the re-export of a replaced model, and a `dpr query`
process that never imports torch, transformers or sentence_transformers."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kit.tiny_models import tiny_sentence_model

from encoders.onnx_export import PROBES, ensure_export
from encoders.onnx_towers import OnnxTowers, export_dir_for
from encoders.towers import SentenceTransformerTowers, base_model_path, model_fingerprint

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TEXT = ("Mitochondria are membrane-bound organelles that generate most of the chemical energy needed to power the "
        "cell's biochemical reactions. Chemical energy produced by the mitochondria is stored in ATP, e.g. 3.5 kJ.")


@pytest.fixture(scope="module")
def base_export(onnx_cache: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """The base model's export in the session's cache (made here if no earlier test made it), its int8 variant
    made too (on first use: this loads it)."""
    export = export_dir_for(base_model_path(), onnx_cache, onnx_cache)
    ensure_export(base_model_path(), export)
    yield onnx_cache, OnnxTowers(export, base_model_path(), "onnx-int8").manifest


@pytest.fixture(scope="module")
def torch_towers() -> SentenceTransformerTowers:
    return SentenceTransformerTowers(base_model_path(), name="base")


def _onnx(cache: Path, backend: str = "onnx") -> OnnxTowers:
    export = export_dir_for(base_model_path(), cache, cache)
    return OnnxTowers(export, base_model_path(), backend, name="base")  # type: ignore[arg-type]


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_onnx_matches_torch_on_the_base_model(base_export: tuple[Path, dict[str, Any]],
                                              torch_towers: SentenceTransformerTowers) -> None:
    data, manifest = base_export
    onnx = _onnx(data)
    texts = [*PROBES, TEXT]
    for encode in ("encode_queries", "encode_documents"):
        got, want = getattr(onnx, encode)(texts), getattr(torch_towers, encode)(texts)
        assert got.shape == want.shape == (len(texts), 384) and got.dtype == np.float32
        assert _cos(got, want).min() >= 0.999
    assert onnx.fingerprint == torch_towers.fingerprint == manifest["model_fingerprint"]
    assert (onnx.dim, onnx.similarity, onnx.max_passage_tokens) == (
        torch_towers.dim, torch_towers.similarity, torch_towers.max_passage_tokens)
    assert onnx.passage_token_offsets(TEXT) == torch_towers.passage_token_offsets(TEXT)
    long = "word " * 600  # truncated to 256 tokens by both
    np.testing.assert_allclose(onnx.encode_documents([long]), torch_towers.encode_documents([long]), atol=1e-4)
    # and padded batches (rows of 2 to 256 tokens side by side) agree too, with the softmax guards gone
    batch = ["", "a", TEXT, long, TEXT[:40]]
    np.testing.assert_allclose(onnx.encode_documents(batch, batch_size=5), torch_towers.encode_documents(batch),
                               atol=1e-4)


def test_the_export_drops_the_attention_guards(base_export: tuple[Path, dict[str, Any]]) -> None:
    """The traced SDPA attention's NaN guards (``Where(IsNaN(p), 0, p)`` per layer) and per-layer mask copies
    are gone from both variants: they cost int8 ~40% of its time."""
    import onnx

    data, _ = base_export
    for name in ("model.onnx", "model.int8.onnx"):
        graph = onnx.load(str(export_dir_for(base_model_path(), data, data) / "shared" / name),
                          load_external_data=False).graph
        ops = [n.op_type for n in graph.node]
        assert "IsNaN" not in ops and ops.count("Where") <= 2, name


def test_int8_keeps_the_sensitive_projections_in_fp32(base_export: tuple[Path, dict[str, Any]]) -> None:
    """Layer 0's attention output and the FFN output projections of layers 0-2 (of 6) stay fp32 MatMuls in the
    int8 graph, and the manifest names them; every other projection is quantised."""
    import onnx

    data, manifest = base_export
    keep = manifest["int8_fp32_matmuls"]["shared"]
    assert sorted(keep) == sorted(["/model/encoder/layer.0/attention/output/dense/MatMul",
                                   *(f"/model/encoder/layer.{i}/output/dense/MatMul" for i in range(3))])
    graph = onnx.load(str(export_dir_for(base_model_path(), data, data) / "shared" / "model.int8.onnx"),
                      load_external_data=False).graph
    plain = {n.name for n in graph.node if n.op_type == "MatMul" and "/dense/" in n.name}
    assert plain == set(keep)
    assert sum(n.op_type == "MatMulInteger" for n in graph.node) == 6 * 6 - len(keep)


def test_int8_is_measured_and_recorded(base_export: tuple[Path, dict[str, Any]],
                                       torch_towers: SentenceTransformerTowers) -> None:
    data, manifest = base_export
    towers = _onnx(data, "onnx-int8")  # quantised and measured on first use, without torch
    int8 = towers.manifest["variants"]["onnx-int8"]
    print("int8 cosine vs torch:", json.dumps(int8["cosine"]), "fingerprint:", int8["fingerprint"])
    assert all(c["mean"] >= 0.98 for c in int8["cosine"].values())
    fp = manifest["model_fingerprint"]
    expect = fp if int8["agrees_with_torch"] else f"{fp}-onnx-int8"
    assert towers.fingerprint == int8["fingerprint"] == expect
    assert _cos(towers.encode_documents([TEXT]), torch_towers.encode_documents([TEXT]))[0] >= 0.98


def test_a_replaced_model_is_exported_again(tmp_path: Path) -> None:
    """A model replaced in place (same directory, new bytes) gets a new fingerprint and a new export. A tiny model
    (tests/kit/tiny_models.py: ~1 s to export, where a copy of the base model took ~40 s per export); what is
    checked is the fingerprint and the export's life cycle, the same for any model."""
    models = tmp_path / "models"
    model = models / "m1"
    shutil.copytree(tiny_sentence_model(tmp_path / "tiny"), model)
    export = export_dir_for(model, models, tmp_path / "cache")
    first = ensure_export(model, export)
    assert export == model / "onnx" and first["model_fingerprint"] == model_fingerprint(model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(config, indent=4))  # replaced in place: same model, new bytes
    second = ensure_export(model, export)
    assert second["model_fingerprint"] == model_fingerprint(model) != first["model_fingerprint"]
    assert OnnxTowers(export, model, "onnx").fingerprint == second["model_fingerprint"]


def test_dpr_query_never_imports_torch(tmp_path: Path) -> None:
    """On the defaults, from a fresh data dir and a fresh user cache (HOME): the first ingest leaves the question
    tower's export behind in the machine's tower cache, so the first query already runs without torch."""
    data = tmp_path / "data"
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "mito.txt").write_text(TEXT)
    (docs / "tides.txt").write_text("The gravitational pull of the Moon and the Sun causes the tides on Earth.")
    env = {"DPR_DATA_DIR": str(data), "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    run = [sys.executable, "-m", "entrypoints.cli.main"]
    subprocess.run([*run, "ingest", str(docs), "--json"], env=env, check=True, capture_output=True, timeout=300)
    manifests = list((tmp_path / ".cache" / "dpr-ingest" / "towers").glob("*/manifest.json"))  # the user's cache
    assert len(manifests) == 1 and (manifests[0].parent / "shared" / "model.onnx.data").is_file()
    question = ["query", "what stores the energy of mitochondria", "--json", "-k", "1"]
    torch_side = ("torch", "transformers", "sentence_transformers")
    ingest_side = ("services.ingest", "services.readers", "services.ingest.chunking", "services.ingest.executor",
                   "entrypoints.cli.ingest", "entrypoints.cli.workers", "entrypoints.cli.train", "rich.progress",
                   "services.jobs", "encoders.multilingual", "entrypoints.status")  # and no job store, no built-ins

    def imported(call: str, watched: tuple[str, ...]) -> list[str]:
        """Run ``call`` in a fresh interpreter; its hits must name mito.txt; returns the watched modules it loaded
        (a name or its top-level package)."""
        probe = (
            f"import sys\nimport entrypoints.cli.main as cli\nsys.argv = ['dpr', *{question!r}]\n"
            f"try:\n    {call}\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            f"print(sorted(m for m in sys.modules if m in {watched!r} or m.split('.')[0] in {watched!r}))\n"
        )
        out = subprocess.run([sys.executable, "-c", probe], env=env, check=True, capture_output=True, text=True,
                             timeout=120).stdout.splitlines()
        assert json.loads(out[0])[0]["doc_id"].endswith("mito.txt")
        return json.loads(out[1].replace("'", '"'))

    assert imported(f"cli.app({question!r})", torch_side) == []  # every command group built
    # As `dpr query` runs (main() builds only the module of the command named): not even the ingest side.
    assert imported("cli.main()", torch_side + ingest_side) == []
