"""Rewrites of an exported transformer graph with the onnx package alone (no torch, no project imports): the
attention clean-up after the torch export, the weights moved beside the graph, and the int8 variant by dynamic
quantisation. ``encoders.onnx_export`` calls them at export; ``encoders.onnx_towers`` makes int8 on its first use.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

FP32_FILE = "model.onnx"  # encoders.onnx_towers.VARIANT_FILES names the same files
INT8_FILE = "model.int8.onnx"
# int8 leaves these projections in fp32 (``int8_fp32_matmuls``): layer 0's attention output and the FFN output
# projection (the MatMul after GELU, whose input carries the outlier activations that one per-tensor activation
# scale quantises worst) of the first half of the layers. Measured on all-MiniLM-L6-v2 over 150 SciFact abstracts,
# quantising one MatMul at a time: those 4 of 36 carried 53% of the embedding error (1 - cosine to fp32); on 300
# other abstracts the rule took int8's error 6.3e-3 -> 2.9e-3 and its top-10 neighbour overlap with fp32 0.934 ->
# 0.952, for 18% of the projection FLOPs in fp32: the passage tower 1.68x -> 1.55x torch on an AVX2 machine.
_PROJECTION = re.compile(r"layer\.(\d+)/(attention/output|output)/dense/MatMul$")
def make_int8(directory: Path) -> list[str]:
    """``model.int8.onnx`` from the directory's ``model.onnx`` by dynamic quantisation (per-channel weights;
    ``int8_fp32_matmuls`` stay fp32), its weights beside it. Needs onnx and onnxruntime only, no torch. Returns the
    MatMuls kept in fp32."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    keep = int8_fp32_matmuls(directory / FP32_FILE)
    quiet = _DropRecordsFrom("onnxruntime")  # the quantiser logs every skipped node on the root logger
    logging.getLogger().addFilter(quiet)
    try:
        quantize_dynamic(directory / FP32_FILE, directory / INT8_FILE,
                         weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["MatMul"],
                         nodes_to_exclude=keep)
    finally:
        logging.getLogger().removeFilter(quiet)
    weights_beside(directory / INT8_FILE)
    return keep


def int8_fp32_matmuls(path: Path) -> list[str]:
    """The MatMuls of the exported graph at ``path`` that int8 leaves in fp32 (``_PROJECTION``): layer 0's
    attention output and the FFN output projections of the first half of the layers (BERT-family node names, as
    the torch exporter writes them; a graph without them keeps none)."""
    import onnx

    found = [(n.name, m) for n in onnx.load(str(path), load_external_data=False).graph.node
             if n.op_type == "MatMul" and (m := _PROJECTION.search(n.name))]
    if not found:
        return []
    half = (max(int(m.group(1)) for _, m in found) + 2) // 2  # 6 layers -> 0-2; 12 -> 0-5
    return [name for name, m in found
            if int(m.group(1)) == 0 and m.group(2) == "attention/output"
            or int(m.group(1)) < half and m.group(2) == "output"]


def simplify_attention(path: Path) -> None:
    """Remove what the traced SDPA attention spends on rows that cannot occur, in place.

    Each layer's softmax output goes through ``Where(IsNaN(p), 0, p)``: a guard for a query row whose keys are all
    masked, which never happens here (a tokenizer's special tokens leave every sequence at least one key; the
    export's probes include the empty string). Each layer also turns the same boolean mask into the same additive
    0 / -inf mask again. The guards go (their consumers read the softmax) and the mask is made once. Measured on
    all-MiniLM-L6-v2, 2 cores: fp32 23 -> 32 passages/s, int8 34 -> 58, outputs unchanged (cosine 1.0). ``_measure``
    checks every export against torch afterwards, this rewrite included."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    constants = {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in graph.node
                 if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"}
    constants.update({t.name: numpy_helper.to_array(t) for t in graph.initializer})
    rename: dict[str, str] = {}
    dropped: set[int] = set()
    first_mask: dict[tuple[str, bytes, bytes], str] = {}
    for node in graph.node:
        if node.op_type != "Where" or node.input[1] not in constants:
            continue
        guard = producer.get(node.input[0])
        if (guard is not None and guard.op_type == "IsNaN" and guard.input[0] == node.input[2]
                and not constants[node.input[1]].any()):
            rename[node.output[0]] = node.input[2]
            dropped.update((id(node), id(guard)))
        elif node.input[2] in constants:
            key = (node.input[0], constants[node.input[1]].tobytes(), constants[node.input[2]].tobytes())
            if key in first_mask:
                rename[node.output[0]] = first_mask[key]
                dropped.add(id(node))
            else:
                first_mask[key] = node.output[0]
    if not dropped:
        return
    kept = [n for n in graph.node if id(n) not in dropped]
    for node in kept:
        node.input[:] = [rename.get(i, i) for i in node.input]
    used = {i for n in kept for i in n.input} | {o.name for o in graph.output}
    kept = [n for n in kept if n.op_type != "Constant" or n.output[0] in used]
    del graph.node[:]
    graph.node.extend(kept)
    onnx.save_model(model, str(path))


def weights_beside(path: Path) -> None:
    """Move the graph's weights into ``<file>.data`` beside it: onnxruntime maps that file instead of copying the
    weights out of the protobuf, so a query process pays for the pages it touches (~100 MB less resident for
    MiniLM; most of a large vocabulary's embedding rows are never read) at the same speed."""
    import onnx

    model = onnx.load(str(path))
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=f"{path.name}.data", size_threshold=1024)
    os.chmod(path.parent / f"{path.name}.data", 0o644)  # onnx writes it 0600: readable like the graph beside it


class _DropRecordsFrom(logging.Filter):
    def __init__(self, package: str) -> None:
        super().__init__()
        self.marker = f"{os.sep}{package}{os.sep}"

    def filter(self, record: logging.LogRecord) -> bool:
        return self.marker not in record.pathname
