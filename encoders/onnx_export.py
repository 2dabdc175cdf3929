"""Export a sentence-transformers model's towers to ONNX (fp32, and int8 by dynamic quantisation), once per model.

Where torch is (``dpr train``, ``dpr models activate``, the first use of an onnx backend): each tower's transformer
goes to ONNX with dynamic batch and sequence axes; what its other modules declare (pooling, normalisation, prompt,
max length) is read from the loaded model into the manifest, which ``encoders.onnx_towers`` applies with numpy.
Both variants are measured against torch on a fixed probe set; a variant whose cosines clear its thresholds
(``AGREEMENT``) keeps the model's fingerprint, any other gets ``-<backend>`` appended. The export of a trained
model lives in ``<model>/onnx/``; that of a model elsewhere (the base model in site-packages) under the data dir's
cache (``encoders.onnx_towers.export_dir_for``). The manifest is written last: no manifest, no export.

torch and sentence_transformers are imported inside functions only.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from encoders.onnx_towers import (
    AGREEMENT,
    FORMAT,
    PROBE_VECTORS,
    VARIANT_FILES,
    ExportMissing,
    read_current_manifest,
    variant_agreement,
    write_manifest,
)
from encoders.towers import SentenceTransformerTowers, model_files_key, model_fingerprint

log = logging.getLogger(__name__)

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# int8 leaves these projections in fp32 (``int8_fp32_matmuls``): layer 0's attention output and the FFN output
# projection (the MatMul after GELU, whose input carries the outlier activations that one per-tensor activation
# scale quantises worst) of the first half of the layers. Measured on all-MiniLM-L6-v2 over 150 SciFact abstracts,
# quantising one MatMul at a time: those 4 of 36 carried 53% of the embedding error (1 - cosine to fp32); on 300
# other abstracts the rule took int8's error 6.3e-3 -> 2.9e-3 and its top-10 neighbour overlap with fp32 0.934 ->
# 0.952, for 18% of the projection FLOPs in fp32: the passage tower 1.68x -> 1.55x torch on an AVX2 machine.
_PROJECTION = re.compile(r"layer\.(\d+)/(attention/output|output)/dense/MatMul$")
_SENTENCES = [
    "", "a", "What is the capital of France?", "Paris is the capital and most populous city of France.",
    "how do vaccines train the immune system", "Mitochondria are the powerhouse of the cell.",
    "The quick brown fox jumps over the lazy dog.", "DNA replication is semi-conservative.",
    "Which protein binds oxygen in red blood cells?", "Hemoglobin carries oxygen from the lungs to the tissues.",
    "ÜBER naïve café — résumé façade, 東京 and Москва", "1234 5678 90 3.14159 e=mc^2",
    "Smoking increases the risk of lung cancer by damaging the airways and alveoli.",
    "The Treaty of Westphalia in 1648 ended the Thirty Years' War.", "   leading and trailing spaces   ",
    "COVID-19 is caused by SARS-CoV-2, a coronavirus.", "why is the sky blue", "Rayleigh scattering.",
    "What causes tides on Earth?", "The gravitational pull of the Moon and the Sun causes tides.",
    "Insulin regulates blood glucose.", "who wrote pride and prejudice", "Jane Austen wrote Pride and Prejudice.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
]
PROBES = _SENTENCES + [
    " ".join(_SENTENCES[2:]),  # ~250 tokens: truncated by a short query tower
    " ".join(_SENTENCES[2:] * 4),  # beyond any max length: truncated the same way by both
    "word " * 600,
]


def ensure_export(model_path: Path, export_dir: Path,
                  exporter: Callable[[Path, Path], dict[str, Any]] | None = None) -> dict[str, Any]:
    """The current export's manifest, exporting first when there is none or the model changed (one exporter at a
    time per directory; the others wait and read its result). ``exporter``: ``export`` (the towers) unless given
    (the reranker's: ``encoders.rerank.export_reranker``)."""
    try:
        return read_current_manifest(export_dir, model_path)
    except ExportMissing:
        pass
    export_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(export_dir.parent / f".{export_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return read_current_manifest(export_dir, model_path)
        except ExportMissing as e:
            log.info("exporting towers to ONNX", extra={"model_path": str(model_path), "reason": str(e)})
            return (exporter or export)(model_path, export_dir)


def export(model_path: Path, export_dir: Path) -> dict[str, Any]:
    """Export ``model_path`` into ``export_dir`` (replaced as a whole), measure both variants, write the manifest."""
    started = time.perf_counter()
    files, fingerprint = model_files_key(model_path), model_fingerprint(model_path)
    reference = SentenceTransformerTowers(model_path)
    model = reference.model
    with staging_dir(export_dir) as staging:
        towers = {role: _tower_spec(model, role) for role in ("query", "document")}
        fp32_in_int8 = {directory: _export_transformer(transformer, staging / directory)
                        for directory, transformer in {spec.pop("_directory"): spec.pop("_transformer")
                                                       for spec in towers.values()}.items()}
        towers["document"]["max_passage_tokens"] = reference.max_passage_tokens
        manifest: dict[str, Any] = {
            "format": FORMAT, "model_path": str(model_path), "model_fingerprint": fingerprint,
            "model_files": [list(e) for e in files], "dim": reference.dim, "similarity": reference.similarity,
            "towers": towers, "agreement": AGREEMENT, "int8_fp32_matmuls": fp32_in_int8,
            "variants": {b: {"fingerprint": f"{fingerprint}-{b}"} for b in VARIANT_FILES},  # until measured
        }
        write_manifest(staging, manifest)  # the measurement below loads the export through OnnxTowers
        manifest["variants"] = _measure(reference, staging, model_path, fingerprint)
        manifest["seconds"] = round(time.perf_counter() - started, 1)
        manifest["files"] = {str(f.relative_to(staging)): f.stat().st_size for f in sorted(staging.rglob("*"))
                             if f.is_file() and f.name != "manifest.json" and f.parent.name != "openvino"}
        write_manifest(staging, manifest)
        _replace_dir(staging, export_dir)
    log.info("exported towers to ONNX", extra={"model_path": str(model_path), "variants": manifest["variants"]})
    return manifest


@contextmanager
def staging_dir(export_dir: Path) -> Iterator[Path]:
    """An empty sibling of ``export_dir`` to build an export in (``_replace_dir`` moves it into place); removed on
    the way out whatever happened."""
    staging = export_dir.parent / f".{export_dir.name}.staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _tower_spec(model: Any, role: str) -> dict[str, Any]:
    """What the modules of one tower (a Router route, or the whole model) declare."""
    modules = list(model)
    router = next((m for m in modules if type(m).__name__ == "Router"), None)
    if router is not None:
        route = router._resolve_route(task=role, modality="text")
        modules = [*router.sub_modules[route], *modules[modules.index(router) + 1:]]
    kinds = [type(m).__name__ for m in modules]
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        raise ValueError(
            f"the {role} tower is {' -> '.join(kinds)}; the ONNX towers reproduce Transformer -> Pooling "
            "[-> Normalize] only: use DPR_ENCODER__BACKEND=torch for this model"
        )
    transformer, pooling = modules[0], modules[1]
    prompt = model._resolve_prompt(None, role if role in model.prompts else None) or ""
    mode = pooling.pooling_mode
    return {
        "directory": route if router is not None else "shared",
        "max_seq_length": int(transformer.max_seq_length),
        "pooling": [mode] if isinstance(mode, str) else list(mode),
        "include_prompt": bool(pooling.include_prompt),
        "prompt": prompt,
        "prompt_length": int(transformer._get_prompt_length(prompt) or 0) if prompt else 0,
        "normalize": kinds[-1] == "Normalize",
        "_directory": route if router is not None else "shared",
        "_transformer": transformer,
    }


def _export_transformer(transformer: Any, directory: Path, sample_inputs: list[Any] | None = None,
                        output: str = "last_hidden_state") -> list[str]:
    """The transformer -> ``model.onnx`` (its ``output``: the token embeddings of a tower, the logits of a
    cross-encoder) and ``model.int8.onnx``; its tokenizer.json beside. ``sample_inputs`` trace the graph. Returns
    the MatMuls int8 keeps in fp32 (``int8_fp32_matmuls``)."""
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic

    directory.mkdir(parents=True)
    transformer.tokenizer.backend_tokenizer.save(str(directory / "tokenizer.json"))
    sample = transformer.preprocess(sample_inputs or ["a probe sentence", "another, a little longer probe sentence"])
    names = [n for n in INPUTS if n in sample]
    wrapper = _token_embeddings_module()(transformer.auto_model, names, output).eval()
    output_name = "token_embeddings" if output == "last_hidden_state" else output
    axes = {n: {0: "batch", 1: "sequence"} for n in [*names, output_name]}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer notes
        torch.onnx.export(wrapper, tuple(sample[n] for n in names), str(directory / VARIANT_FILES["onnx"]),
                          input_names=names, output_names=[output_name], dynamic_axes=axes,
                          opset_version=17, dynamo=False)
    _simplify_attention(directory / VARIANT_FILES["onnx"])
    keep = int8_fp32_matmuls(directory / VARIANT_FILES["onnx"])
    quiet = _DropRecordsFrom("onnxruntime")  # the quantiser logs every skipped node on the root logger
    logging.getLogger().addFilter(quiet)
    try:
        quantize_dynamic(directory / VARIANT_FILES["onnx"], directory / VARIANT_FILES["onnx-int8"],
                         weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["MatMul"],
                         nodes_to_exclude=keep)
    finally:
        logging.getLogger().removeFilter(quiet)
    for variant in VARIANT_FILES.values():
        _weights_beside(directory / variant)
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


def _simplify_attention(path: Path) -> None:
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


def _weights_beside(path: Path) -> None:
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


def _token_embeddings_module() -> Any:
    """A module that maps the tokenizer's tensors to one output of the transformer (built where torch is):
    ``last_hidden_state`` (batch, seq, hidden) or a cross-encoder's ``logits`` (batch, labels)."""
    import torch

    class TokenEmbeddings(torch.nn.Module):
        def __init__(self, model: Any, names: list[str], output: str = "last_hidden_state") -> None:
            super().__init__()
            self.model, self.names, self.output = model, names, output

        def forward(self, *inputs: Any) -> Any:
            return getattr(self.model(**dict(zip(self.names, inputs, strict=True))), self.output)

    return TokenEmbeddings


def _measure(reference: SentenceTransformerTowers, staging: Path, model_path: Path,
             fingerprint: str) -> dict[str, Any]:
    """Cosine of each variant against torch on the probes, both towers; the fingerprint each variant carries.
    torch's vectors of the probes stay beside the export (``PROBE_VECTORS``): a runtime installed later is measured
    against them without torch, and every tower checks a few of them when it loads."""
    expected = {"texts": np.array(PROBES), "query": reference.encode_queries(PROBES),
                "document": reference.encode_documents(PROBES)}
    np.savez(staging / PROBE_VECTORS, texts=expected["texts"], query=expected["query"], document=expected["document"])
    return {backend: variant_agreement(staging, model_path, backend, expected, fingerprint)  # type: ignore[arg-type]
            for backend in VARIANT_FILES}


def _replace_dir(staging: Path, target: Path) -> None:
    """Put ``staging`` in place of ``target`` (the old export removed after the rename)."""
    old = target.parent / f".{target.name}.old-{os.getpid()}"
    if target.exists():
        os.replace(target, old)
    os.replace(staging, target)
    shutil.rmtree(old, ignore_errors=True)
