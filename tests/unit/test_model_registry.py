"""The model registry: ACTIVE pointer, lookup by fingerprint, and the one bounded tower cache (no model is loaded:
towers read their weights lazily, so fake model directories are enough)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from encoders import registry
from encoders.towers import model_fingerprint

pytestmark = pytest.mark.unit


def fake_model(models_dir: Path, name: str) -> Path:
    path = models_dir / name
    path.mkdir(parents=True)
    (path / "modules.json").write_text("[]")
    (path / "config.json").write_text(json.dumps({"name": name}))
    return path


@pytest.fixture(autouse=True)
def empty_cache() -> None:
    registry.clear_tower_cache()


def test_a_model_is_found_by_its_fingerprint_and_a_missing_one_names_the_fixes(tmp_path: Path) -> None:
    path = fake_model(tmp_path, "m1")
    assert registry.model_for_fingerprint(model_fingerprint(path), tmp_path) == (path, "m1")
    with pytest.raises(registry.ModelNotFound, match="dpr rollback"):
        registry.model_for_fingerprint("0" * 16, tmp_path)


def test_towers_are_loaded_once_per_process_by_name_or_by_fingerprint(tmp_path: Path) -> None:
    path = fake_model(tmp_path, "m1")
    by_name = registry.load_towers("m1", tmp_path)
    assert registry.load_towers("m1", tmp_path) is by_name  # the one cache: loaded once
    assert registry.towers_for(by_name.fingerprint, tmp_path) is by_name
    (path / "config.json").write_text(json.dumps({"name": "retrained"}))  # retrained in place: loaded again
    assert registry.load_towers("m1", tmp_path) is not by_name


def test_the_cache_keeps_a_bounded_number_of_models(tmp_path: Path) -> None:
    for i in range(registry.MAX_LOADED + 1):
        fake_model(tmp_path, f"m{i}")
    first = registry.load_towers("m0", tmp_path)
    for i in range(1, registry.MAX_LOADED + 1):
        registry.load_towers(f"m{i}", tmp_path)
    assert registry.load_towers("m0", tmp_path) is not first  # the least recently used was dropped


def test_activate_replaces_the_active_pointer(tmp_path: Path) -> None:
    fake_model(tmp_path, "m1")
    assert registry.active_name(tmp_path) == "base"
    registry.activate(tmp_path, "m1")
    assert registry.active_name(tmp_path) == "m1"
    with pytest.raises(registry.ModelNotFound, match="dpr models list"):
        registry.activate(tmp_path, "nope")


def test_the_name_given_to_dpr_train_means_its_newest_version_everywhere(tmp_path: Path) -> None:
    from encoders.towers import resolve_model_path

    models = tmp_path / "models"
    for name in ("ict-20261101-090000", "ict-20261123-120000", "ictx-20261201-000000"):
        fake_model(models, name)
    assert resolve_model_path("ict", models) == (models / "ict-20261123-120000", "ict-20261123-120000")
    assert resolve_model_path("ict-20261101-090000", models)[1] == "ict-20261101-090000"  # an exact pick
    assert registry.show_model(models, "ict").name == "ict-20261123-120000"
    assert registry.activate(models, "ict").name == "ict-20261123-120000"
    assert registry.active_name(models) == "ict-20261123-120000"  # pinned to the version activated
    with pytest.raises(registry.ModelNotFound):
        registry.show_model(models, "ic")
    with pytest.raises(FileNotFoundError):
        resolve_model_path("ic", models)


def test_split_towers_encode_questions_on_one_backend_and_passages_on_another(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`dpr eval` measures what ingest and query serve: with DPR_ENCODER__QUESTION_BACKEND unlike the passage
    backend, questions go through the question backend's towers and everything else through the passage ones."""
    import numpy as np
    from kit.fakes import HashTowers
    from kit.policy import make_settings

    import services.lab.evaluation.store_retriever as evaluation
    from encoders.registry import SplitTowers
    from services.core.settings import EncoderSettings

    class Backended(HashTowers):
        def __init__(self, backend: str, salt: str) -> None:
            super().__init__(name=salt)
            self.fingerprint = "one-model"  # both backends of one model keep its fingerprint
            self.backend = backend

    loaded: list[str] = []

    def fake_load(spec: str, models_dir: object, *, backend: str, **_: object) -> HashTowers:
        loaded.append(backend)
        return Backended(backend, salt=backend)

    monkeypatch.setattr(evaluation, "load_towers", fake_load)
    same = evaluation._served_towers(
        make_settings(encoder=EncoderSettings(backend="onnx-int8", question_backend="onnx-int8")), "base")
    assert isinstance(same, Backended) and loaded == ["onnx-int8"]
    split = evaluation._served_towers(  # int8 passages: fp32 questions (the choice without AMX)
        make_settings(encoder=EncoderSettings(backend="onnx-int8")), "base")
    assert isinstance(split, SplitTowers) and loaded[1:] == ["onnx-int8", "onnx"]
    passages, questions = split.passages, split.questions
    text = ["lava flows from the crater"]
    np.testing.assert_array_equal(split.encode_queries(text), questions.encode_queries(text))
    np.testing.assert_array_equal(split.encode_documents(text), passages.encode_documents(text))
    assert not np.allclose(questions.encode_queries(text), passages.encode_queries(text))  # the salts differ
    assert split.fingerprint == "one-model" and split.dim == passages.dim and split.name == passages.name
    assert split.backend == "onnx-int8+questions:onnx"
    assert split.passage_token_offsets("a b") == passages.passage_token_offsets("a b")
    other = HashTowers(name="another-model")
    with pytest.raises(ValueError, match="one model"):
        SplitTowers(passages, other)


@pytest.mark.parametrize(("backend", "question", "served"), [
    ("onnx-int8", None, "onnx"),  # the default: fp32 questions beside int8 passages
    ("onnx", None, "onnx"),
    ("torch", None, "torch"),
    ("onnx-int8", "onnx-int8", "onnx-int8"),  # an explicit choice wins
    ("onnx", "torch", "torch"),
])
def test_question_backend_follows_the_passage_backend_except_fp32_beside_int8(
        backend: str, question: str | None, served: str) -> None:
    from kit.policy import make_settings

    from services.core.settings import EncoderSettings
    from services.runtime import Runtime

    encoder = EncoderSettings(backend=backend, question_backend=question)  # type: ignore[arg-type]
    assert encoder.questions == served
    assert Runtime(make_settings(encoder=encoder)).question_backend == served
    assert EncoderSettings().backend == "auto"  # chosen from the CPU: tests/unit/test_runtimes.py
