"""The ONNX towers over a tiny hand-built export (a lookup-table "transformer", a word-level tokenizer): pooling,
normalisation, prompts, truncation, batching, stale exports and the fingerprint suffix. No torch, no real model."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from kit.onnx_lookup import HIDDEN, TABLE, WORDS, make_export, tower_spec

from encoders.onnx_towers import ExportMissing, OnnxTowers, export_dir_for, pool, split_fingerprint
from encoders.towers import ONNX_DIR, model_fingerprint

pytestmark = pytest.mark.unit


def expected(words: list[str], mode: str = "mean", normalize: bool = True, skip: int = 0) -> np.ndarray:
    ids = [WORDS.index(w) for w in words]
    emb = TABLE[ids][skip:]
    v = {"mean": emb.mean(axis=0), "cls": emb[0], "max": emb.max(axis=0)}[mode]
    return v / np.linalg.norm(v) if normalize else v


def test_export_lives_in_the_model_dir_and_is_no_part_of_its_fingerprint(tmp_path: Path) -> None:
    model, export = make_export(tmp_path)
    assert export == model / ONNX_DIR
    before = model_fingerprint(model)
    (export / "extra.json").write_text("{}")
    assert model_fingerprint(model) == before
    outside = export_dir_for(tmp_path / "elsewhere", tmp_path / "models", tmp_path / "cache")
    assert outside.parent == tmp_path / "cache" and outside.name.startswith("elsewhere-")


def test_mean_pooling_normalised_like_sentence_transformers(tmp_path: Path) -> None:
    model, export = make_export(tmp_path)
    towers = OnnxTowers(export, model, "onnx")
    got = towers.encode_documents(["alpha beta", "gamma", ""])
    assert got.shape == (3, HIDDEN) and got.dtype == np.float32
    np.testing.assert_allclose(got[0], expected(["[CLS]", "alpha", "beta", "[SEP]"]), rtol=1e-5)
    np.testing.assert_allclose(got[2], expected(["[CLS]", "[SEP]"]), rtol=1e-5)  # empty: the special tokens only
    assert towers.encode_queries([]).shape == (0, HIDDEN)
    assert towers.dim == HIDDEN and towers.similarity == "cosine" and towers.max_passage_tokens == 4


def test_batches_sorted_by_length_give_the_same_vectors_in_input_order(tmp_path: Path) -> None:
    model, export = make_export(tmp_path)
    towers = OnnxTowers(export, model, "onnx")
    texts = ["alpha", "beta gamma delta", "", "delta delta", "gamma beta"]
    one_by_one = np.stack([towers.encode_documents([t])[0] for t in texts])
    np.testing.assert_allclose(towers.encode_documents(texts, batch_size=2), one_by_one, rtol=1e-5, atol=1e-6)


def test_truncation_to_the_towers_max_length(tmp_path: Path) -> None:
    model, export = make_export(tmp_path, query=tower_spec(max_seq_length=4))
    towers = OnnxTowers(export, model, "onnx")
    long, cut = towers.encode_queries(["alpha beta gamma delta delta", "alpha beta"])
    np.testing.assert_allclose(long, cut, rtol=1e-5)  # [CLS] alpha beta [SEP]
    assert towers.passage_token_offsets("alpha beta gamma delta delta")[-1] == (23, 28)  # offsets: never truncated


@pytest.mark.parametrize("include_prompt", [True, False])
def test_prompt_prepended_and_excluded_from_pooling_when_declared(tmp_path: Path, include_prompt: bool) -> None:
    query = tower_spec(prompt="query: ", prompt_length=2, include_prompt=include_prompt, max_seq_length=16)
    model, export = make_export(tmp_path, query=query)
    towers = OnnxTowers(export, model, "onnx")
    words = ["[CLS]", "query:", "alpha", "[SEP]"]
    np.testing.assert_allclose(towers.encode_queries(["alpha"])[0],
                               expected(words, skip=0 if include_prompt else 2), rtol=1e-5)
    np.testing.assert_allclose(towers.encode_documents(["alpha"])[0], expected(["[CLS]", "alpha", "[SEP]"]),
                               rtol=1e-5)  # the passage tower declares no prompt


@pytest.mark.parametrize("mode", ["cls", "max"])
def test_other_pooling_modes_without_normalisation(tmp_path: Path, mode: str) -> None:
    model, export = make_export(tmp_path, document=tower_spec(pooling=[mode], normalize=False))
    got = OnnxTowers(export, model, "onnx").encode_documents(["alpha beta", "gamma"], batch_size=2)
    np.testing.assert_allclose(got[1], expected(["[CLS]", "gamma", "[SEP]"], mode, normalize=False), rtol=1e-5)


def test_pool_ignores_padding() -> None:
    tokens = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2)  # (batch, seq, hidden)
    mask = np.array([[1, 1, 0], [1, 1, 1]], dtype=np.float32)
    np.testing.assert_allclose(pool("mean", tokens, mask)[0], tokens[0, :2].mean(axis=0))
    np.testing.assert_allclose(pool("lasttoken", tokens, mask)[0], tokens[0, 1])
    np.testing.assert_allclose(pool("max", tokens, mask)[0], tokens[0, 1])
    np.testing.assert_allclose(pool("mean_sqrt_len_tokens", tokens, mask)[1], tokens[1].sum(axis=0) / np.sqrt(3))


def test_variant_fingerprints_follow_the_manifest(tmp_path: Path) -> None:
    model, export = make_export(tmp_path, int8_agrees=False)
    fp = model_fingerprint(model)
    assert OnnxTowers(export, model, "onnx").fingerprint == fp
    int8 = OnnxTowers(export, model, "onnx-int8")
    assert int8.fingerprint == f"{fp}-onnx-int8" and int8.model_fingerprint == fp
    assert split_fingerprint(int8.fingerprint) == (fp, "onnx-int8")
    assert split_fingerprint(fp) == (fp, None)


def test_a_changed_model_is_never_served_by_its_old_export(tmp_path: Path) -> None:
    model, export = make_export(tmp_path)
    OnnxTowers(export, model, "onnx")
    (model / "model.safetensors").write_bytes(b"retrained weights")
    with pytest.raises(ExportMissing, match="another version"):
        OnnxTowers(export, model, "onnx")


def test_a_copied_model_with_the_same_bytes_keeps_its_export(tmp_path: Path) -> None:
    model, export = make_export(tmp_path)
    weights = model / "model.safetensors"
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched, not changed: hashed, same bytes
    assert OnnxTowers(export, model, "onnx").fingerprint == model_fingerprint(model)


def test_no_export_names_it(tmp_path: Path) -> None:
    with pytest.raises(ExportMissing, match="no ONNX export"):
        OnnxTowers(tmp_path / "nowhere", tmp_path, "onnx")


@pytest.mark.parametrize(("layers", "expected"), [
    (6, ["layer.0/attention/output", "layer.0/output", "layer.1/output", "layer.2/output"]),
    (12, ["layer.0/attention/output", *(f"layer.{i}/output" for i in range(6))]),
    (1, ["layer.0/attention/output", "layer.0/output"]),
    (0, []),  # a graph without BERT-style projections keeps none in fp32
])
def test_int8_keeps_layer_0_attention_output_and_the_first_half_of_ffn_outputs(
        tmp_path: Path, layers: int, expected: list[str]) -> None:
    import onnx
    from onnx import TensorProto, helper

    from encoders.onnx_graphs import int8_fp32_matmuls

    names = [f"/model/encoder/layer.{i}/{part}/MatMul" for i in range(layers) for part in (
        "attention/self/query", "attention/output/dense", "intermediate/dense", "output/dense")] + ["/other/MatMul"]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1])
    nodes = [helper.make_node("MatMul", ["x", "x"], [f"y{i}"], name=n) for i, n in enumerate(names)]
    outputs = [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [1, 1]) for i in range(len(names))]
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", [x], outputs)), str(tmp_path / "m.onnx"))
    assert int8_fp32_matmuls(tmp_path / "m.onnx") == [f"/model/encoder/{e}/dense/MatMul" for e in expected]
