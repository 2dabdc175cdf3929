"""The model registry: trained models under one models directory, the ACTIVE pointer, lookup by fingerprint, and
the one process-wide tower cache.

A model is a directory ``models_dir/<name>-YYYYmmdd-HHMMSS`` holding a sentence-transformers model and
``model_card.json``. ``models_dir/ACTIVE`` names the active model (``base`` or a directory name); it is replaced
atomically (write a temporary file, fsync, rename), and ``encoders.towers.resolve_model_path("active", ...)`` reads it.

Towers are loaded once per process through ``load_towers`` (by model setting: a name, ``base``, ``active`` or a
path) and ``towers_for`` (by the fingerprint a collection records), on a backend (torch, or ONNX Runtime fp32 /
int8 over the model's export: ``encoders.onnx_towers``): both share one small LRU cache, so a process
keeps its configured model plus at most ``MAX_LOADED - 1`` others (the model of the collection it serves, the new
model of a re-embed), whatever mix of callers asks.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from encoders.onnx_towers import (
    ExportCorrupt,
    ExportMissing,
    OnnxTowers,
    RuntimeUnavailable,
    export_dir_for,
    split_fingerprint,
)
from encoders.runtimes import Backend, Choice
from encoders.towers import (
    MULTILINGUAL,
    DualEncoder,
    SentenceTransformerTowers,
    base_model_path,
    model_fingerprint,
    newest_version,
    passage_fingerprint,
    read_model_card,
    resolve_model_path,
)

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

ACTIVE_FILE = "ACTIVE"
BUILTIN = ("base", MULTILINGUAL)  # models that ship in wheels: no training, always listed
MAX_LOADED = 3  # towers one process keeps: its configured model and two others (least recently used goes first)


class ModelNotFound(LookupError):
    """No model of that name (or that fingerprint) under the models directory."""


@dataclass(frozen=True)
class ModelEntry:
    name: str
    path: Path
    active: bool
    card: dict[str, Any]

    def summary(self) -> dict[str, Any]:
        card = self.card
        dev = (card.get("dev_metrics") or {}).get("after") or {}
        return {
            "name": self.name,
            "active": self.active,
            "path": str(self.path),
            "fingerprint": card.get("fingerprint"),
            "towers": card.get("towers"),
            "trained_at": card.get("finished_at"),
            "data": (card.get("training_data") or {}).get("dataset"),
            "dev_ndcg@10": dev.get("ndcg@10"),
            "kind": card.get("kind", "towers"),
            "question_only": bool(card.get("question_only")),
            "partner": (card.get("partner") or {}).get("name"),  # whose passage tower (and points) it shares
        }


# --- the ACTIVE pointer ---------------------------------------------------------------------------------------


def active_name(models_dir: Path) -> str:
    """The ACTIVE model name, ``base`` when none is activated."""
    path = models_dir / ACTIVE_FILE
    if path.is_file():
        name = path.read_text().strip()
        if name:
            return name
    return "base"


def activate(models_dir: Path, name: str) -> ModelEntry:
    """Make ``name`` (or ``base``) the active model; the ACTIVE file is replaced atomically."""
    if name == MULTILINGUAL:
        from encoders import multilingual  # here and below: only where the built-in is named (not on `dpr query`)

        multilingual.multilingual_model_path(models_dir)  # converted now, so the pointer names a model
    entry = show_model(models_dir, name)  # raises ModelNotFound; a bare name means its newest version
    name = entry.name
    if entry.card.get("kind") == "reranker":
        raise ModelNotFound(f"{name} is a reranker, not towers; rerankers are used by `dpr query --rerank N` "
                            "(DPR_RERANK__MODEL), not activated")
    if name != "base" and not (entry.path / "modules.json").is_file():
        raise ModelNotFound(f"{entry.path} holds no sentence-transformers model (no modules.json); retrain it")
    models_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".ACTIVE.", dir=models_dir)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(name + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, models_dir / ACTIVE_FILE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return ModelEntry(entry.name, entry.path, True, entry.card)


# --- listing and lookup ---------------------------------------------------------------------------------------


def list_models(models_dir: Path) -> list[ModelEntry]:
    """Every trained model (directories with a model card), newest first; the built-in models are
    ``builtin_models``."""
    if not models_dir.is_dir():
        return []
    from encoders import multilingual

    active = active_name(models_dir)
    entries = []
    for path in models_dir.iterdir():
        if not path.is_dir() or path.name.startswith(".") or multilingual.is_current_conversion(path):
            continue
        if not (path / "modules.json").is_file() and not (path / "model_card.json").is_file():
            continue
        entries.append(ModelEntry(path.name, path, path.name == active, read_model_card(path)))
    entries.sort(key=lambda e: (str(e.card.get("finished_at") or ""), e.name), reverse=True)
    return entries


def builtin_models(models_dir: Path) -> list[ModelEntry]:
    """``base`` (all-MiniLM-L6-v2) and ``multilingual`` (multilingual-e5-small, converted on first use)."""
    return [show_model(models_dir, name) for name in BUILTIN]


def show_model(models_dir: Path, name: str) -> ModelEntry:
    active = active_name(models_dir) == name
    if name == "base":
        path = base_model_path()
        card = {"name": "base", "base": str(path), "fingerprint": model_fingerprint(path), "towers": "shared"}
        return ModelEntry("base", path, active, card)
    if name == MULTILINGUAL:
        from encoders import multilingual

        path = multilingual.converted_dir(models_dir)
        if multilingual.is_converted(path):
            return ModelEntry(name, path, active, read_model_card(path))
        pending = {"name": name, "towers": "shared", "fingerprint": None, "converted": False,
                   "note": f"multilingual-e5-small from the {multilingual.PACKAGE} wheel; converted on first use"}
        return ModelEntry(name, path, active, pending)
    path = models_dir / name
    if not path.is_dir():
        name = newest_version(models_dir, name) or name  # `dpr train --name ict` made ict-<time>
        path = models_dir / name
    if not path.is_dir() or name.startswith(".") or "/" in name:
        known = ", ".join(e.name for e in list_models(models_dir)) or "none"
        raise ModelNotFound(f"no model {name!r} under {models_dir} (known: {known}); see `dpr models list`")
    card = read_model_card(path)
    if "fingerprint" not in card:
        card = {**card, "fingerprint": model_fingerprint(path)}
    return ModelEntry(name, path, active_name(models_dir) == name, card)


def model_candidates(models_dir: Path) -> list[tuple[Path, str]]:
    """(directory, name) of every loadable model: the base model, then each model under ``models_dir`` (the
    converted multilingual model among them, by its name ``multilingual``)."""
    from encoders import multilingual

    out = [(base_model_path(), "base")]
    if models_dir.is_dir():
        for p in sorted(models_dir.iterdir()):
            if (p.is_dir() and not p.name.startswith(".") and (p / "modules.json").is_file()
                    and read_model_card(p).get("kind") != "reranker"):
                out.append((p, MULTILINGUAL if multilingual.is_current_conversion(p) else p.name))
    return out


def model_for_fingerprint(fingerprint: str, models_dir: Path) -> tuple[Path, str]:
    """The model directory whose fingerprint is ``fingerprint`` (the base model or one under ``models_dir``); else
    a model whose passage tower makes those vectors (a question-only model of that partner: it serves its points)."""
    candidates = model_candidates(models_dir)
    for path, name in candidates:
        if model_fingerprint(path) == fingerprint:
            return path, name
    for path, name in candidates:
        if passage_fingerprint(path) == fingerprint:
            return path, name
    raise ModelNotFound(
        f"no model with fingerprint {fingerprint} under {models_dir} or the base model; the collection was built "
        "by a model that is no longer here: restore it, `dpr rollback`, or re-embed with `dpr reembed --model NAME`"
    )


# --- the one tower cache --------------------------------------------------------------------------------------


def default_onnx_cache(models_dir: Path) -> Path:
    """DATA_DIR/cache/onnx (``models_dir`` is DATA_DIR/models): exports of models outside ``models_dir``."""
    return models_dir.parent / "cache" / "onnx"


def build_towers(path: Path, name: str, *, device: str = "cpu", backend: Backend = "torch",
                 threads: int | None = None, models_dir: Path, cache_dir: Path | None = None) -> DualEncoder:
    """Towers of the model at ``path`` on ``backend``; an ONNX backend exports the model first when its export is
    missing or stale (torch is imported for that, once per model)."""
    if backend == "torch":
        return SentenceTransformerTowers(path, device=device, name=name)
    export_dir = export_dir_for(path, models_dir, cache_dir or default_onnx_cache(models_dir))
    for attempt in range(2):
        try:
            return OnnxTowers(export_dir, path, backend, threads=threads, name=name).load(_first_role(backend))
        except RuntimeUnavailable as e:  # openvino installed but unusable on this CPU: one line, then faithful fp32
            log.warning("the chosen runtime cannot run here; falling back to onnx (fp32)",
                        extra={"backend": backend, "error": str(e)})
            return build_towers(path, name, device=device, backend="onnx", threads=threads,
                                models_dir=models_dir, cache_dir=cache_dir)
        except ExportMissing as e:
            if attempt:
                raise
            if isinstance(e, ExportCorrupt):
                log.warning("a damaged export is made again", extra={"export_dir": str(export_dir), "error": str(e)})
                discard_export(export_dir)
        if export_model(path, models_dir, cache_dir) is None:  # logged there; torch serves what it cannot export
            return SentenceTransformerTowers(path, device=device, name=name)
    raise AssertionError("unreachable")  # pragma: no cover


def runtime_report(path: Path, models_dir: Path, cache_dir: Path | None, choice: Choice,
                   role: str = "document") -> dict[str, Any]:
    """What ``dpr status`` says of one tower: the backend that runs it, why, and what its export measured against
    torch (cosine on the probes, the runtime's version), read from the export's manifest without loading it."""
    import json

    report: dict[str, Any] = choice.to_dict()
    if choice.backend == "torch":
        return report
    export_dir = export_dir_for(path, models_dir, cache_dir or default_onnx_cache(models_dir))
    try:
        variant = json.loads((export_dir / "manifest.json").read_text())["variants"][choice.backend]
    except (OSError, ValueError, KeyError):
        return {**report, "measured": None, "export": str(export_dir)}
    return {**report, "export": str(export_dir), "measured": {
        "runtime": variant.get("runtime"), "cosine_to_fp32": (variant.get("cosine") or {}).get(role),
        "agrees_with_fp32": variant.get("agrees_with_torch")}}


def _first_role(backend: Backend) -> str:
    """The tower checked when towers load: the passage tower, except on fp32 ONNX, which by default only
    questions use (the query path never loads the passage tower)."""
    return "query" if backend == "onnx" else "document"


def discard_export(export_dir: Path) -> None:
    """Take a damaged export out of the way (its manifest first: a reader then sees none), so the next
    ``export_model`` makes it again."""
    import shutil

    (export_dir / "manifest.json").unlink(missing_ok=True)
    shutil.rmtree(export_dir, ignore_errors=True)


def export_model(path: Path, models_dir: Path, cache_dir: Path | None = None,
                 exporter: Callable[[Path, Path], dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """Make the ONNX export of the model at ``path`` now unless a current one exists (after ``dpr train`` and
    ``dpr train-reranker``, whose ``exporter`` is ``encoders.rerank.export_reranker``, on ``dpr models activate``).
    Returns its manifest; a model the export cannot reproduce is logged and left to torch (``None``): the torch
    backend never needs the export."""
    from encoders.onnx_export import ensure_export  # imports no torch: the export itself does

    export_dir = export_dir_for(path, models_dir, cache_dir or default_onnx_cache(models_dir))
    try:
        if "torch" in sys.modules:  # already paid for here (dpr train, the torch backend): export in this process
            return ensure_export(path, export_dir, exporter)
        from encoders.spawned import call_in_child  # the child: torch never loads in this process

        return call_in_child(ensure_export, path, export_dir, exporter)
    except Exception as e:
        log.warning("no ONNX export of this model; the onnx backends cannot serve it (torch can)",
                    extra={"model_path": str(path), "error": str(e)})
        return None


def _model_fingerprint_of(towers: DualEncoder) -> str:
    return str(getattr(towers, "model_fingerprint", towers.fingerprint))


_Key = tuple[str, str, str]  # (model directory, device, backend)


class TowerCache:
    """Towers loaded once per process, keyed by (directory, device, backend); at most ``size`` kept (LRU).
    Thread-safe.

    A hit by name re-checks the directory's fingerprint (a model retrained in place is loaded again); a hit by
    fingerprint touches no file (the hot path of a query whose collection another model built)."""

    def __init__(self, size: int = MAX_LOADED) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._towers: OrderedDict[_Key, DualEncoder] = OrderedDict()
        self._chosen: dict[tuple[str, str, str], _Key] = {}  # (fingerprint, device, backend) -> by_fingerprint's pick

    def by_name(self, spec: str, models_dir: Path, device: str = "cpu", backend: Backend = "torch",
                **options: Any) -> DualEncoder:
        path, name = resolve_model_path(spec, models_dir)
        key = (str(path.resolve()), device, backend)
        with self._lock:
            towers = self._towers.get(key)
            if towers is None or _model_fingerprint_of(towers) != model_fingerprint(path):
                towers = build_towers(path, name, device=device, backend=backend, models_dir=models_dir, **options)
            return self._keep(key, towers)

    def by_fingerprint(self, fingerprint: str, models_dir: Path, device: str = "cpu", backend: Backend = "torch",
                       **options: Any) -> DualEncoder:
        """Towers whose vectors carry ``fingerprint``: on ``backend`` when its vectors agree with the collection's,
        else on the backend that built it (a ``-onnx-int8`` suffix names it; none: torch)."""
        model, built_by = split_fingerprint(fingerprint)
        with self._lock:  # the model that built the points, not a question-only model that shares its passages
            chosen = self._chosen.get((fingerprint, device, backend))
            if chosen is not None and chosen in self._towers and self._towers[chosen].fingerprint == fingerprint:
                return self._keep(chosen, self._towers[chosen])
            for key, towers in self._towers.items():
                if towers.fingerprint == fingerprint and _model_fingerprint_of(towers) == model and key[1] == device:
                    return self._keep(key, towers)
        path, name = model_for_fingerprint(model, models_dir)  # raises ModelNotFound
        for candidate in dict.fromkeys((backend, built_by or "torch")):
            towers = build_towers(path, name, device=device, backend=candidate, models_dir=models_dir, **options)
            if towers.fingerprint == fingerprint:
                if candidate != backend:
                    log.warning("the collection's vectors need another backend", extra={
                        "model": name, "backend": backend, "used": candidate, "fingerprint": fingerprint})
                with self._lock:
                    key = (str(path.resolve()), device, candidate)
                    self._chosen[(fingerprint, device, backend)] = key
                    return self._keep(key, towers)
        raise ModelNotFound(
            f"model {name} gives vectors {towers.fingerprint}, not {fingerprint}, on backend {backend}; set "
            "DPR_ENCODER__BACKEND (and DPR_ENCODER__QUESTION_BACKEND) to the backend that built the collection"
        )

    def clear(self) -> None:
        with self._lock:
            self._towers.clear()
            self._chosen.clear()

    def _keep(self, key: _Key, towers: DualEncoder) -> DualEncoder:
        self._towers[key] = towers
        self._towers.move_to_end(key)
        while len(self._towers) > self.size:
            self._towers.popitem(last=False)
        return towers


_CACHE = TowerCache()


def load_towers(spec: str, models_dir: Path, device: str = "cpu", backend: Backend = "torch", *,
                threads: int | None = None, cache_dir: Path | None = None) -> DualEncoder:
    """The towers a model setting names (``base``, ``active``, a name under ``models_dir``, a path) on ``backend``
    (torch, onnx, onnx-int8), loaded once per process. ``threads``: onnxruntime's intra-op threads;
    ``cache_dir``: where exports of models outside ``models_dir`` go (default DATA_DIR/cache/onnx)."""
    return _CACHE.by_name(spec, models_dir, device, backend, threads=threads, cache_dir=cache_dir)


class SplitTowers:
    """One model with its passage tower on one backend and its question tower on another
    (``DPR_ENCODER__QUESTION_BACKEND``), as one ``DualEncoder``: what ingest and query serve when the two backends
    differ, so an evaluation measures that pair. Everything but ``encode_queries`` is the passage side's."""

    def __init__(self, passages: DualEncoder, questions: DualEncoder) -> None:
        if _model_fingerprint_of(passages) != _model_fingerprint_of(questions):
            raise ValueError("the passage and question towers of a SplitTowers must be one model")
        self.passages = passages
        self.questions = questions
        self.name = passages.name
        self.backend = f"{getattr(passages, 'backend', 'torch')}+questions:{getattr(questions, 'backend', 'torch')}"

    def __getattr__(self, name: str) -> Any:
        return getattr(self.passages, name)

    def encode_queries(self, questions: list[str], batch_size: int = 32) -> np.ndarray:
        return self.questions.encode_queries(questions, batch_size=batch_size)


def towers_for(fingerprint: str, models_dir: Path, device: str = "cpu", backend: Backend = "torch", *,
               threads: int | None = None, cache_dir: Path | None = None) -> DualEncoder:
    """The towers whose vectors carry ``fingerprint`` (a collection's recorded model), loaded once per process.
    Raises ``ModelNotFound`` naming the fixes when no model here has it."""
    return _CACHE.by_fingerprint(fingerprint, models_dir, device, backend, threads=threads, cache_dir=cache_dir)


def clear_tower_cache() -> None:
    """Forget every loaded tower (tests; a process that must free memory)."""
    _CACHE.clear()
