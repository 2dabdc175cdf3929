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
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from encoders.dirswap import rebuilt_dir
from encoders.onnx_graphs import make_int8, simplify_attention, weights_beside
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
    """Export ``model_path`` into ``export_dir`` (replaced as a whole): the fp32 graph of each tower, measured
    against torch, and torch's probe vectors. The other variants (int8, OpenVINO bf16) are made and measured on
    their first use, without torch (``encoders.onnx_towers.measure_variant``): a machine that never runs int8
    never pays its quantisation, and a first ``dpr ingest`` waits ~6 s less."""
    started = time.perf_counter()
    files, fingerprint = model_files_key(model_path), model_fingerprint(model_path)
    reference = SentenceTransformerTowers(model_path)
    model = reference.model
    with rebuilt_dir(export_dir) as staging:
        towers = {role: _tower_spec(model, role) for role in ("query", "document")}
        for spec in towers.values():
            _export_transformer(spec.pop("_transformer"), staging / spec.pop("_directory"), int8=False,
                                exist_ok=True)  # a shared tower's directory is made once
        shared = towers["query"] == towers["document"]  # one tower: torch's probe vectors computed once
        towers["document"]["max_passage_tokens"] = reference.max_passage_tokens
        manifest: dict[str, Any] = {
            "format": FORMAT, "model_path": str(model_path), "model_fingerprint": fingerprint,
            "model_files": [list(e) for e in files], "dim": reference.dim, "similarity": reference.similarity,
            "towers": towers, "agreement": AGREEMENT, "int8_fp32_matmuls": {},
            "variants": {b: {"fingerprint": f"{fingerprint}-{b}"} for b in VARIANT_FILES},  # until measured
        }
        write_manifest(staging, manifest)  # the measurement below loads the export through OnnxTowers
        manifest["variants"] = _measure(reference, staging, model_path, fingerprint, shared)
        manifest["seconds"] = round(time.perf_counter() - started, 1)
        manifest["files"] = {str(f.relative_to(staging)): f.stat().st_size for f in sorted(staging.rglob("*"))
                             if f.is_file() and f.name != "manifest.json" and f.parent.name != "openvino"}
        write_manifest(staging, manifest)
    log.info("exported towers to ONNX", extra={"model_path": str(model_path), "variants": manifest["variants"]})
    return manifest


def prompt_tokens(tokenizer: Any, prompt: str) -> int:
    """The prompt's length in tokens, less a trailing special token ([SEP], EOS): what sentence-transformers leaves
    out of the mean when a pooling excludes the prompt."""
    if not prompt:
        return 0
    ids = tokenizer(prompt)["input_ids"]
    return len(ids) - (1 if ids and ids[-1] in tokenizer.all_special_ids else 0)


def _tower_spec(model: Any, role: str) -> dict[str, Any]:
    """What the modules of one tower (a Router route, or the whole model) declare."""
    modules = list(model)
    router = next((m for m in modules if type(m).__name__ == "Router"), None)
    if router is not None:
        route = role if role in router.sub_modules else router.default_route  # the routes of for_query_document
        if route not in router.sub_modules:
            raise ValueError(f"the model's Router has no {role!r} route and no default one (routes: "
                             f"{', '.join(router.sub_modules)}); use DPR_ENCODER__BACKEND=torch for this model")
        modules = [*router.sub_modules[route], *modules[modules.index(router) + 1:]]
    kinds = [type(m).__name__ for m in modules]
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        raise ValueError(
            f"the {role} tower is {' -> '.join(kinds)}; the ONNX towers reproduce Transformer -> Pooling "
            "[-> Normalize] only: use DPR_ENCODER__BACKEND=torch for this model"
        )
    transformer, pooling = modules[0], modules[1]
    prompt_name = role if role in model.prompts else model.default_prompt_name  # as encode(prompt_name=role) does
    prompt = model.prompts.get(prompt_name, "") if prompt_name else ""
    mode = pooling.pooling_mode
    return {
        "directory": route if router is not None else "shared",
        "max_seq_length": int(transformer.max_seq_length),
        "pooling": [mode] if isinstance(mode, str) else list(mode),
        "include_prompt": bool(pooling.include_prompt),
        "prompt": prompt,
        "prompt_length": prompt_tokens(transformer.tokenizer, prompt),
        "normalize": kinds[-1] == "Normalize",
        "_directory": route if router is not None else "shared",
        "_transformer": transformer,
    }


def _export_transformer(transformer: Any, directory: Path, sample_inputs: list[Any] | None = None,
                        output: str = "last_hidden_state", *, int8: bool = True,
                        exist_ok: bool = False) -> list[str] | None:
    """The transformer -> ``model.onnx`` (its ``output``: the token embeddings of a tower, the logits of a
    cross-encoder) and, with ``int8``, ``model.int8.onnx``; its tokenizer.json beside. ``sample_inputs`` trace the
    graph. Returns the MatMuls int8 keeps in fp32 (``int8_fp32_matmuls``; None without int8). ``exist_ok``: a
    directory exported already (a tower both roles share) is left as it is."""
    import torch

    if exist_ok and (directory / VARIANT_FILES["onnx"]).is_file():
        return None
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
    simplify_attention(directory / VARIANT_FILES["onnx"])
    keep = make_int8(directory) if int8 else None
    weights_beside(directory / VARIANT_FILES["onnx"])
    return keep


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


def _measure(reference: SentenceTransformerTowers, staging: Path, model_path: Path, fingerprint: str,
             shared: bool) -> dict[str, Any]:
    """The fp32 variant's cosine against torch on the probes, both towers (``shared``: one tower serves both, so
    torch encodes the probes once). torch's vectors of the probes stay beside the export (``PROBE_VECTORS``):
    the other variants are measured against them on first use, and every tower checks a few when it loads."""
    query = reference.encode_queries(PROBES)
    document = query if shared else reference.encode_documents(PROBES)
    expected = {"texts": np.array(PROBES), "query": query, "document": document}
    np.savez(staging / PROBE_VECTORS, texts=expected["texts"], query=query, document=document)
    return {"onnx": variant_agreement(staging, model_path, "onnx", expected, fingerprint)}

