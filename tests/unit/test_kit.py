"""The test kit and the suite's own rules: the shared towers behave like towers, a developer's ``DPR_*`` variables
and ``.env`` file never reach a unit test, unmarked tests are refused, our warnings are errors."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from kit.fakes import CountingTowers, HashTowers
from kit.policy import make_settings, scrub_settings_env

from encoders.towers import DualEncoder
from services.core.settings import Settings

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


# --- the shared towers ----------------------------------------------------------------------------------------------


def test_hash_towers_are_deterministic_dual_encoders() -> None:
    a, b = HashTowers(dim=32, name="a"), HashTowers(dim=32, name="b")
    assert isinstance(a, DualEncoder) and a.fingerprint != b.fingerprint
    texts = ["cats purr at night", "cats hunt mice at night", "the Nile flows north"]
    vectors = a.encode_documents(texts)  # (3, dim)
    assert vectors.shape == (3, 32) and vectors.dtype == np.float32 and a.encoded == 3
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0)
    assert np.array_equal(vectors, HashTowers(dim=32, name="a").encode_queries(texts))
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]  # shared words: closer
    assert not np.allclose(vectors, b.encode_documents(texts))  # another name: another model
    assert a.encode_queries([]).shape == (0, 32)
    assert np.isclose(np.linalg.norm(a.encode_queries(["..."])[0]), 1.0)  # no words: still a unit vector


def test_hash_towers_offsets_split_words_and_punctuation() -> None:
    text = "Hello, world!"
    assert [text[s:e] for s, e in HashTowers().passage_token_offsets(text)] == ["Hello", ",", "world", "!"]


def test_counting_towers_pass_through_and_count() -> None:
    inner = HashTowers()
    spy = CountingTowers(inner)
    assert spy.fingerprint == inner.fingerprint and spy.dim == inner.dim
    assert np.array_equal(spy.encode_documents(["a b", "c"]), inner.encode_queries(["a b", "c"]))
    assert spy.encoded == 2


# --- settings come from the test alone ------------------------------------------------------------------------------


def test_unit_tests_run_without_dpr_variables_or_env_file() -> None:
    """Also run by the next test in a child pytest whose shell and working directory carry a developer's setup."""
    assert [k for k in os.environ if k.startswith("DPR_")] == ["DPR_ONNX_CACHE"]  # the session's export cache
    assert Settings.model_config.get("env_file") is None
    for settings in (Settings(), make_settings()):
        assert (settings.broker_url, settings.qdrant_url, settings.collection) == (None, None, "passages")


def test_a_developers_shell_and_env_file_do_not_reach_unit_tests(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("DPR_QDRANT_URL=http://dev-qdrant:6333\nDPR_COLLECTION=dev\n")
    env = {**os.environ, "DPR_BROKER_URL": "redis://dev-broker:6379/0"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    probe = f"{Path(__file__).resolve()}::test_unit_tests_run_without_dpr_variables_or_env_file"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", probe],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout


def test_scrub_hides_what_settings_would_otherwise_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("DPR_QDRANT_URL=http://dev-qdrant:6333\n")
    monkeypatch.setenv("DPR_BROKER_URL", "redis://dev-broker:6379/0")
    monkeypatch.setitem(Settings.model_config, "env_file", ".env")
    leaked = Settings()  # the control: unscrubbed, both reach the settings
    assert (leaked.broker_url, leaked.qdrant_url) == ("redis://dev-broker:6379/0", "http://dev-qdrant:6333")
    scrub_settings_env(monkeypatch)
    for settings in (Settings(), make_settings()):
        assert (settings.broker_url, settings.qdrant_url) == (None, None)


# --- unmarked tests are refused -------------------------------------------------------------------------------------


def test_collection_refuses_a_test_without_a_suite_marker(pytester: pytest.Pytester) -> None:
    pytester.makeconftest((REPO / "tests" / "conftest.py").read_text())  # the suite's own hooks
    pytester.makeini("[pytest]\nmarkers =\n    unit: u\n    integration: i\n    slow: s\n")
    pytester.makepyfile(test_marked="import pytest\n\n\n@pytest.mark.unit\ndef test_marked():\n    pass\n")
    assert pytester.runpytest("-p", "no:cacheprovider").ret == pytest.ExitCode.OK
    pytester.makepyfile(test_unmarked="def test_forgotten():\n    pass\n")
    refused = pytester.runpytest("-p", "no:cacheprovider", "-m", "unit")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["*none of the markers unit, integration, slow*test_unmarked.py::test_forgotten*"])


# --- our warnings are errors, third-party ones are not --------------------------------------------------------------


def test_our_warnings_are_errors_and_third_party_warnings_are_not() -> None:
    with pytest.raises(UserWarning, match="from a test"):
        warnings.warn("from a test", UserWarning, stacklevel=1)
    with pytest.raises(DeprecationWarning, match="ours"):
        warnings.warn_explicit("ours", DeprecationWarning, "services/ingest/pipeline.py", 1, module="services.ingest")
    with warnings.catch_warnings(record=True) as seen:
        warnings.warn_explicit("theirs", UserWarning, "numba/core/errors.py", 1, module="numba.core.errors")
    assert [str(w.message) for w in seen] == ["theirs"]
