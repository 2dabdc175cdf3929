"""A tiny ONNX export built by hand, no torch: a lookup-table "transformer" (``token_embeddings = TABLE[input_ids]``)
and a word-level tokenizer over ``WORDS``, with the manifest ``encoders.onnx_towers`` reads. Its vectors are
known without running a model (tests/unit/test_onnx_towers.py), and a `dpr query` process can load it as its
question tower (tests/unit/test_query_imports.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from encoders.onnx_towers import FORMAT, MANIFEST, VARIANT_FILES, export_dir_for
from encoders.runtimes import runtime_version
from encoders.towers import model_files_key, model_fingerprint

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "query:", "alpha", "beta", "gamma", "delta"]
HIDDEN = 4
TABLE = np.random.default_rng(0).normal(size=(len(WORDS), HIDDEN)).astype(np.float32)  # token id -> embedding


def write_onnx(path: Path) -> None:
    """token_embeddings = TABLE[input_ids]: a transformer whose output is known without running one."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "input_ids"], ["token_embeddings"], axis=0)],
        "lookup",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("token_embeddings", TensorProto.FLOAT, ["batch", "sequence", HIDDEN])],
        [numpy_helper.from_array(TABLE, "table")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def write_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2),
                                                                                                 ("[SEP]", 3)])
    tok.save(str(path))


def tower_spec(**overrides: Any) -> dict[str, Any]:
    spec = {"directory": "shared", "max_seq_length": 6, "pooling": ["mean"], "include_prompt": True, "prompt": "",
            "prompt_length": 0, "normalize": True}
    return {**spec, **overrides}


def make_export(tmp_path: Path, query: dict[str, Any] | None = None, document: dict[str, Any] | None = None,
                int8_agrees: bool = False) -> tuple[Path, Path]:
    """A model directory and its export (both variants are the same lookup graph)."""
    model = tmp_path / "models" / "tiny"
    model.mkdir(parents=True)
    (model / "model.safetensors").write_bytes(b"weights")
    (model / "config.json").write_text("{}")
    export = export_dir_for(model, tmp_path / "models", tmp_path / "cache")
    (export / "shared").mkdir(parents=True)
    for name in VARIANT_FILES.values():
        write_onnx(export / "shared" / name)
    write_tokenizer(export / "shared" / "tokenizer.json")
    fp = model_fingerprint(model)
    manifest = {
        "format": FORMAT, "model_fingerprint": fp, "model_files": [list(e) for e in model_files_key(model)],
        "dim": HIDDEN, "similarity": "cosine",
        "towers": {"query": query or tower_spec(), "document": {**(document or tower_spec()), "max_passage_tokens": 4}},
        "variants": {"onnx": {"fingerprint": fp, "runtime": runtime_version("onnx")},
                     "onnx-int8": {"fingerprint": fp if int8_agrees else f"{fp}-onnx-int8",
                                   "runtime": runtime_version("onnx-int8")}},
    }
    (export / MANIFEST).write_text(json.dumps(manifest))
    return model, export
