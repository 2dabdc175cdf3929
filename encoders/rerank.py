"""A cross-encoder reranker: scores (question, passage) pairs jointly, to reorder a first stage's top N.

Inference on the towers' backends: ``torch`` (a sentence-transformers ``CrossEncoder``) or ONNX Runtime (``onnx``
fp32, ``onnx-int8``) over the reranker's export (``export_reranker``, made with ``encoders.onnx_export``'s
machinery, stored in ``<model>/onnx`` and tied to the model's files like the towers' exports). The ONNX path needs
only onnxruntime + tokenizers + numpy: no torch import here at module level or on that path.

A reranker is a model directory under the models dir whose ``model_card.json`` says ``"kind": "reranker"``
(``services.lab.reranker.trainer`` makes them). Scores are the classifier's raw logit: higher is more relevant.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from encoders.onnx_towers import (
    FORMAT,
    VARIANT_FILES,
    Backend,
    ExportMissing,
    OnnxBackend,
    cpu_session,
    export_dir_for,
    read_current_manifest,
    write_manifest,
)
from encoders.runtimes import OPENVINO_PRECISION, OpenVinoSession
from encoders.towers import model_fingerprint, offline, read_model_card, resolve_model_path

log = logging.getLogger(__name__)

RERANKER_KIND = "reranker"
DEFAULT_MAX_LENGTH = 320  # question (<= 64 tokens) + a passage window (256) + specials
# Pairs the export is checked on (fp32 must agree with torch; int8's agreement is recorded).
PROBE_PAIRS = [
    ("What is the capital of France?", "Paris is the capital and most populous city of France."),
    ("What is the capital of France?", "Mitochondria are the powerhouse of the cell."),
    ("how do vaccines train the immune system", "Vaccines expose the immune system to an antigen."),
    ("Which protein binds oxygen in red blood cells?", "Hemoglobin carries oxygen from the lungs to the tissues."),
    ("why is the sky blue", "Rayleigh scattering."),
    ("", "an empty question"),
    ("who wrote pride and prejudice", "Jane Austen wrote Pride and Prejudice. " * 60),  # truncated
    ("ÜBER naïve café — 東京 and Москва " * 20, "word " * 600),  # both sides truncated
]
FP32_MAX_ABS_DIFF = 1e-3  # the fp32 export must reproduce torch's logits this closely on the probes
INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # the order of the encodings' fields below


WEIGHTS = tuple(round(0.1 * i, 1) for i in range(1, 11))  # the reranker weights a dev split chooses among


def fuse_scores(first: Sequence[float], rerank: Sequence[float], weight: float) -> list[float]:
    """The order a reranked list takes: ``weight`` x the reranker's score + (1 - ``weight``) x the first stage's,
    each min-max scaled over the candidates (first-stage scores are cosines, fused or BM25 by mode; logits are
    unbounded). ``weight`` 1: the reranker's scores as they are; a weaker reranker can still add to a strong first
    stage at a lower weight, chosen on a dev split (``services.lab.reranker.trainer.dev_rerank_metrics``)."""
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"rerank weight {weight} is out of range; use 0..1 (1: the reranker's order alone)")
    if weight >= 1.0:
        return [float(r) for r in rerank]

    def scaled(xs: Sequence[float]) -> list[float]:
        lo, hi = min(xs, default=0.0), max(xs, default=0.0)
        return [(float(x) - lo) / (hi - lo) if hi > lo else 0.0 for x in xs]

    return [weight * r + (1.0 - weight) * f for r, f in zip(scaled(rerank), scaled(first), strict=True)]


class RerankerError(LookupError):
    """No usable reranker (none trained, or the model named is not a reranker)."""


class Reranker(Protocol):
    """Scores passages for one question: higher is more relevant."""

    name: str
    backend: str

    @property
    def fingerprint(self) -> str: ...

    def score(self, question: str, passages: Sequence[str], batch_size: int = 32) -> np.ndarray:
        """(n,) float32 scores of ``passages`` for ``question``."""
        ...


class TorchReranker:
    """A sentence-transformers CrossEncoder directory (loaded on first use)."""

    backend: str = "torch"

    def __init__(self, path: Path, name: str | None = None, max_length: int | None = None) -> None:
        self.path = Path(path)
        self.name = name or self.path.name
        self.max_length = max_length
        self._fingerprint = model_fingerprint(self.path)
        self._model: Any = None
        self._lock = threading.Lock()

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    @property
    def model(self) -> Any:
        with self._lock:
            if self._model is None:
                offline()
                from sentence_transformers import CrossEncoder

                self._model = CrossEncoder(str(self.path), device="cpu", local_files_only=True,
                                           max_length=self.max_length)
            return self._model

    def score(self, question: str, passages: Sequence[str], batch_size: int = 32) -> np.ndarray:
        return score_with_model(self.model, question, passages, batch_size)


def score_with_model(model: Any, question: str, passages: Sequence[str], batch_size: int = 32) -> np.ndarray:
    """Raw logits of a CrossEncoder in memory (training's dev evaluation and ``TorchReranker``)."""
    import torch

    if not passages:
        return np.zeros(0, dtype=np.float32)
    scores = model.predict([(question, p) for p in passages], batch_size=batch_size, show_progress_bar=False,
                           activation_fn=torch.nn.Identity(), convert_to_numpy=True)
    return np.asarray(scores, dtype=np.float32).reshape(-1)  # (n,)


class OnnxReranker:
    """The reranker's ONNX export on onnxruntime + tokenizers + numpy."""

    def __init__(self, export_dir: Path, model_path: Path, backend: OnnxBackend = "onnx", *,
                 threads: int | None = None, name: str | None = None) -> None:
        from tokenizers import Tokenizer

        if backend not in VARIANT_FILES:
            raise ValueError(f"backend {backend!r} is not an ONNX backend; use one of {', '.join(VARIANT_FILES)}")
        self.path, self.export_dir = Path(model_path), Path(export_dir)
        self.name = name or self.path.name
        self.backend: str = backend
        self.manifest = read_current_manifest(self.export_dir, self.path)  # raises ExportMissing
        if self.manifest.get("kind") != RERANKER_KIND:
            raise ExportMissing(f"the ONNX export under {export_dir} is not a reranker's; it is made again")
        self._fingerprint = str(self.manifest["model_fingerprint"])
        self.tokenizer = Tokenizer.from_file(str(self.export_dir / "reranker" / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(int(self.manifest["max_length"]), strategy="longest_first")
        graph = self.export_dir / "reranker" / VARIANT_FILES[backend]
        self.session = (OpenVinoSession(graph, threads, self.export_dir / "openvino", OPENVINO_PRECISION[backend])
                        if backend in OPENVINO_PRECISION else cpu_session(graph, threads))
        self.inputs = [i.name for i in self.session.get_inputs()]

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    def score(self, question: str, passages: Sequence[str], batch_size: int = 32) -> np.ndarray:
        if not passages:
            return np.zeros(0, dtype=np.float32)
        encodings = self.tokenizer.encode_batch([(question, p) for p in passages])
        out = np.empty(len(passages), dtype=np.float32)
        for start in range(0, len(encodings), max(1, batch_size)):
            batch = encodings[start:start + batch_size]
            width = max(len(e.ids) for e in batch)
            feeds = {name: np.zeros((len(batch), width), dtype=np.int64) for name in self.inputs}
            for row, e in enumerate(batch):
                n = len(e.ids)
                for name, values in zip(INPUTS, (e.ids, e.attention_mask, e.type_ids), strict=True):
                    if name in feeds:
                        feeds[name][row, :n] = values
            logits = self.session.run(None, feeds)[0]  # (batch, 1)
            out[start:start + len(batch)] = logits[:, 0]
        return out


# --- loading --------------------------------------------------------------------------------------------------


def reranker_path(spec: str | None, models_dir: Path) -> tuple[Path, str]:
    """(directory, name) of a reranker: a name under ``models_dir`` (its newest version), a path, or (``None``) the
    newest reranker there."""
    if spec is None:
        return newest_reranker(models_dir)
    try:
        path, name = resolve_model_path(spec, models_dir)
    except FileNotFoundError as e:
        raise RerankerError(
            f"no reranker {spec!r} under {models_dir}; train one with `dpr train-reranker DATA` "
            "(or set DPR_RERANK__MODEL to a reranker's name)"
        ) from e
    if read_model_card(path).get("kind") != RERANKER_KIND:
        raise RerankerError(
            f"model {name!r} is not a reranker (its model card has no kind 'reranker'); name one made by "
            "`dpr train-reranker` (`dpr models list` shows the kind)"
        )
    return path, name


def newest_reranker(models_dir: Path) -> tuple[Path, str]:
    found = [(str(card.get("finished_at") or ""), p) for p in (models_dir.iterdir() if models_dir.is_dir() else [])
             if p.is_dir() and not p.name.startswith(".")
             and (card := read_model_card(p)).get("kind") == RERANKER_KIND]
    if not found:
        raise RerankerError(f"no reranker under {models_dir}; train one with `dpr train-reranker DATA`")
    path = max(found)[1]
    return path, path.name


_LOADED: dict[tuple[str, str], Reranker] = {}  # (directory, backend) -> the reranker of its current files
_LOAD_LOCK = threading.Lock()


def load_reranker(spec: str | None, models_dir: Path, backend: Backend = "torch", *, threads: int | None = None,
                  cache_dir: Path | None = None) -> Reranker:
    """The reranker ``spec`` names (None: the newest) on ``backend``, loaded once per process (loaded again, in
    place of the old one, when its files change); an ONNX backend exports it first when its export is missing or
    stale (torch is imported once), and a reranker the export cannot reproduce is served by torch."""
    path, name = reranker_path(spec, models_dir)
    key = (str(path.resolve()), backend)
    with _LOAD_LOCK:
        loaded = _LOADED.get(key)
        if loaded is None or loaded.fingerprint != model_fingerprint(path):
            _LOADED[key] = loaded = _build(path, name, backend, threads, models_dir, cache_dir)
        return loaded


def _build(path: Path, name: str, backend: Backend, threads: int | None, models_dir: Path,
           cache_dir: Path | None) -> Reranker:
    """As ``encoders.registry.build_towers`` does for towers."""
    from encoders.registry import default_onnx_cache, export_model

    max_length = int(read_model_card(path).get("max_length") or DEFAULT_MAX_LENGTH)
    if backend == "torch":
        return TorchReranker(path, name, max_length)
    export_dir = export_dir_for(path, models_dir, cache_dir or default_onnx_cache(models_dir))
    try:
        return OnnxReranker(export_dir, path, backend, threads=threads, name=name)  # type: ignore[arg-type]
    except ExportMissing:
        pass
    if export_model(path, models_dir, cache_dir, exporter=export_reranker) is None:  # logged there
        return TorchReranker(path, name, max_length)
    return OnnxReranker(export_dir, path, backend, threads=threads, name=name)  # type: ignore[arg-type]


# --- export ---------------------------------------------------------------------------------------------------


def export_reranker(model_path: Path, export_dir: Path) -> dict[str, Any]:
    """Export the reranker at ``model_path`` (fp32 and int8) into ``export_dir`` and measure both against torch on
    ``PROBE_PAIRS``; an fp32 export that does not reproduce torch is refused (the torch backend still serves)."""
    import time

    from encoders.dirswap import rebuilt_dir
    from encoders.onnx_export import _export_transformer
    from encoders.towers import model_files_key

    started = time.perf_counter()
    card = read_model_card(model_path)
    max_length = int(card.get("max_length") or DEFAULT_MAX_LENGTH)
    reference = TorchReranker(model_path, max_length=max_length)
    transformer = reference.model[0]
    with rebuilt_dir(export_dir) as staging:
        keep = _export_transformer(transformer, staging / "reranker", sample_inputs=list(PROBE_PAIRS[:2]),
                                   output="logits")
        manifest: dict[str, Any] = {
            "format": FORMAT, "kind": RERANKER_KIND, "model_path": str(model_path), "int8_fp32_matmuls": keep,
            "model_fingerprint": model_fingerprint(model_path),
            "model_files": [list(e) for e in model_files_key(model_path)], "max_length": max_length,
        }
        write_manifest(staging, manifest)
        manifest["variants"] = _measure(reference, staging, model_path)
        if not manifest["variants"]["onnx"]["agrees_with_torch"]:
            raise ValueError(f"the ONNX export of reranker {model_path} does not reproduce torch "
                             f"({manifest['variants']['onnx']}); use DPR_RERANK__BACKEND=torch")
        manifest["seconds"] = round(time.perf_counter() - started, 1)
        write_manifest(staging, manifest)
    log.info("exported reranker to ONNX", extra={"model_path": str(model_path), "variants": manifest["variants"]})
    return manifest


def _measure(reference: TorchReranker, staging: Path, model_path: Path) -> dict[str, Any]:
    expected = np.concatenate([reference.score(q, [p]) for q, p in PROBE_PAIRS])  # (probes,)
    variants: dict[str, Any] = {}
    for backend in VARIANT_FILES:
        onnx = OnnxReranker(staging, model_path, backend)  # type: ignore[arg-type]
        got = np.concatenate([onnx.score(q, [p]) for q, p in PROBE_PAIRS])
        diff = float(np.abs(got - expected).max())
        corr = float(np.corrcoef(got, expected)[0, 1]) if expected.std() > 0 and got.std() > 0 else 1.0
        variants[backend] = {"max_abs_diff": round(diff, 6), "pearson": round(corr, 6),
                             "agrees_with_torch": diff <= FP32_MAX_ABS_DIFF}
    return variants

