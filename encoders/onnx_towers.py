"""ONNX Runtime towers: the question and passage towers of a sentence-transformers model, exported once to ONNX
(``encoders.onnx_export``), run on onnxruntime + tokenizers + numpy. No torch, transformers or sentence_transformers
is imported here: ``dpr query`` loads this and starts in a fraction of a second.

An export is a directory with ``manifest.json`` and, per tower (``query``, ``document``; one ``shared`` tower for a
model without a Router), the transformer as ONNX (fp32 and int8) and its ``tokenizer.json``. The manifest records
what the model's sentence-transformers modules declare (max length, pooling, prompt, normalisation), measured at
export from the loaded model itself, the model's fingerprint and files, and each variant's fingerprint: a variant
whose vectors agree with torch (cosine on a probe set) keeps the model's fingerprint, any other carries a suffix
so the store never pairs it with vectors it does not match.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from encoders.batching import length_slices
from encoders.runtimes import OPENVINO_PRECISION, Backend, OpenVinoSession, runtime_version
from encoders.towers import ONNX_DIR, Similarity, model_files_key, model_fingerprint, passage_fingerprint

log = logging.getLogger(__name__)

OnnxBackend = Literal["onnx", "onnx-int8", "openvino-bf16", "openvino-fp32"]  # the backends an export serves
BACKENDS: tuple[Backend, ...] = ("torch", "onnx", "onnx-int8", "openvino-bf16", "openvino-fp32")
MANIFEST = "manifest.json"
PROBE_VECTORS = "probes.npz"  # torch's vectors of the probes (``encoders.onnx_export.PROBES``), both towers
FORMAT = 5  # bumped when the export changes: an older export is made again (2: weights in .data files; 3: no
# softmax NaN guards, one attention mask; 4: int8 keeps the most sensitive projections in fp32; 5: openvino-bf16,
# torch's probe vectors kept for checks without torch, each file's size, each variant's runtime version)
# The graph each backend runs: OpenVINO compiles the fp32 graph itself (in bf16 where the CPU has AMX).
VARIANT_FILES: dict[str, str] = {"onnx": "model.onnx", "onnx-int8": "model.int8.onnx", "openvino-bf16": "model.onnx",
                                 "openvino-fp32": "model.onnx"}
# A variant keeps the model's fingerprint when its cosine to torch clears these on the probes, in both towers:
# fp32 on every probe; int8 (per-channel weights, dynamic activations: noise that short inputs average out least)
# on the mean, with a floor for the worst probe; bf16 (8 bits of mantissa, fp32 accumulation) on the mean, as
# tightly as the fifth wave's fidelity floor (0.999). Measured on all-MiniLM-L6-v2: fp32 1.0000, int8 mean 0.995,
# bf16 mean 0.99998.
AGREEMENT: dict[str, dict[str, float]] = {"onnx": {"min": 0.999}, "onnx-int8": {"mean": 0.99, "min": 0.95},
                                          "openvino-bf16": {"mean": 0.999, "min": 0.99},
                                          "openvino-fp32": {"min": 0.999}}
CHECKED_PROBES = (2, 3)  # the probes a tower encodes when it loads, against torch's vectors: a corrupt or foreign
# export is caught before it serves (a few ms), and made again
POOLING_MODES = ("cls", "mean", "mean_sqrt_len_tokens", "max", "weightedmean", "lasttoken")


class ExportMissing(LookupError):
    """No current ONNX export for a model (none yet, an older format, or the model changed since)."""


class RuntimeUnavailable(RuntimeError):
    """A runtime that is installed but cannot run the towers on this CPU (measured at export)."""


class ExportCorrupt(ExportMissing):
    """An export whose files are not those it recorded (truncated, replaced, from another model): made again."""


def split_fingerprint(fingerprint: str) -> tuple[str, Backend | None]:
    """``"<model fp>-onnx-int8"`` -> (model fp, "onnx-int8"); a plain model fingerprint -> (fp, None)."""
    base, sep, suffix = fingerprint.partition("-")
    if sep and suffix in BACKENDS:
        return base, suffix  # type: ignore[return-value]
    return fingerprint, None


def export_dir_for(model_path: Path, models_dir: Path, cache_dir: Path) -> Path:
    """Where a model's export lives: ``<model>/onnx`` for a model under ``models_dir``; for any other (the base
    model lives in read-only site-packages) ``cache_dir/<name>-<hash of its path>``, so finding it hashes no
    weights. The manifest inside ties either to the model's fingerprint."""
    model_path = model_path.resolve()
    if models_dir.resolve() in model_path.parents:
        return model_path / ONNX_DIR
    key = hashlib.sha256(str(model_path).encode()).hexdigest()[:12]
    return cache_dir / f"{model_path.name}-{key}"


def read_current_manifest(export_dir: Path, model_path: Path) -> dict[str, Any]:
    """The export's manifest if it was made from ``model_path`` as it is now; else ``ExportMissing``.

    The model's files (names, sizes, mtimes) as recorded at export stand for its fingerprint, so an unchanged model
    is not hashed again; a model whose files changed is hashed and compared."""
    path = export_dir / MANIFEST
    if not path.is_file():
        raise ExportMissing(f"no ONNX export of {model_path} under {export_dir}")
    manifest = dict(json.loads(path.read_text()))
    if manifest.get("format") != FORMAT:
        raise ExportMissing(f"the ONNX export under {export_dir} has an older format; it is made again")
    for name, size in dict(manifest.get("files") or {}).items():
        try:
            got = (export_dir / name).stat().st_size
        except OSError:
            got = -1
        if got != size:
            raise ExportCorrupt(f"the ONNX export under {export_dir} is damaged ({name}: {got} bytes, recorded "
                                f"{size}); it is made again")
    if manifest.get("model_files") == [list(e) for e in model_files_key(model_path)]:
        return manifest
    if manifest.get("model_fingerprint") != model_fingerprint(model_path):
        raise ExportMissing(f"the ONNX export under {export_dir} is of another version of {model_path}")
    return manifest


@dataclass(frozen=True)
class TowerSpec:
    """What one tower's sentence-transformers modules declare, as recorded in the manifest."""

    directory: str
    max_seq_length: int
    pooling: tuple[str, ...]
    include_prompt: bool
    prompt: str
    prompt_length: int
    normalize: bool

    @classmethod
    def from_manifest(cls, data: dict[str, Any]) -> TowerSpec:
        pooling = tuple(data["pooling"])
        unknown = [m for m in pooling if m not in POOLING_MODES]
        if unknown:
            raise ValueError(f"pooling {unknown} is not supported by the ONNX towers; use DPR_ENCODER__BACKEND=torch")
        return cls(data["directory"], int(data["max_seq_length"]), pooling, bool(data["include_prompt"]),
                   str(data["prompt"]), int(data["prompt_length"]), bool(data["normalize"]))


def cpu_session(model_file: Path, threads: int | None) -> Any:
    """An onnxruntime session on the CPU: ``threads`` intra-op threads (None or 0: one per core), one inter-op.

    Its threads sleep between runs instead of spinning (onnxruntime's default): spinning burnt the CPU the other
    half of the work needs (`dpr serve` searches while it encodes; a worker parses). Measured on 2 busy cores, the
    question tower (int8) one question at a time: 9.9-10.3 -> 5.8-6.0 ms of CPU a question, wall 24-33 -> 14-15 ms;
    passages in batches of 32: 61-69 -> 51-53 ms of CPU a passage, 14-15 -> 16-17 passages/s (issue 58)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or 0
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"])


class OnnxTower:
    """One tower: tokenizer (truncated to the tower's max length) -> ONNX transformer -> pooling -> normalise."""

    def __init__(self, root: Path, spec: TowerSpec, backend: OnnxBackend, threads: int | None) -> None:
        from tokenizers import Tokenizer

        self.spec = spec
        directory = root / spec.directory
        self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(spec.max_seq_length)
        self._tokenizer_path = directory / "tokenizer.json"
        self._raw_tokenizer: Any = None
        if backend in OPENVINO_PRECISION:  # its compiled blob beside the graph: the machine-wide cache holds both
            self.session = OpenVinoSession(directory / VARIANT_FILES[backend], threads, root / "openvino",
                                           OPENVINO_PRECISION[backend])
        else:
            self.session = cpu_session(directory / VARIANT_FILES[backend], threads)
        self.inputs = [i.name for i in self.session.get_inputs()]

    @property
    def raw_tokenizer(self) -> Any:
        """The tokenizer without truncation (passage offsets), loaded on first use: a question tower never needs
        it, and loading a tokenizer costs a query process ~30 ms."""
        if self._raw_tokenizer is None:
            from tokenizers import Tokenizer

            raw = Tokenizer.from_file(str(self._tokenizer_path))
            raw.no_padding()
            raw.no_truncation()
            self._raw_tokenizer = raw
        return self._raw_tokenizer

    def encode(self, texts: Sequence[str], batch_size: int) -> np.ndarray:
        prompt = self.spec.prompt
        encodings = self.tokenizer.encode_batch([prompt + t if prompt else t for t in texts])
        out: list[np.ndarray] = [np.empty(0)] * len(texts)
        for chosen in length_slices([len(e.ids) for e in encodings], batch_size):  # similar lengths share a batch
            vectors = self._run([encodings[i] for i in chosen])
            for i, v in zip(chosen, vectors, strict=True):
                out[i] = v
        return np.stack(out).astype(np.float32, copy=False)  # (n, dim)

    def _run(self, encodings: list[Any]) -> np.ndarray:
        width = max(len(e.ids) for e in encodings)
        feeds = {name: np.zeros((len(encodings), width), dtype=np.int64) for name in self.inputs}
        for row, e in enumerate(encodings):
            n = len(e.ids)
            feeds["input_ids"][row, :n] = e.ids
            if "attention_mask" in feeds:
                feeds["attention_mask"][row, :n] = e.attention_mask
            if "token_type_ids" in feeds:
                feeds["token_type_ids"][row, :n] = e.type_ids
        mask = np.zeros((len(encodings), width), dtype=np.float32)
        for row, e in enumerate(encodings):
            mask[row, :len(e.ids)] = 1.0
        tokens = self.session.run(None, feeds)[0]  # (batch, seq, hidden)
        if not self.spec.include_prompt and self.spec.prompt_length:
            mask[:, :self.spec.prompt_length] = 0.0
        pooled = np.concatenate([pool(mode, tokens, mask) for mode in self.spec.pooling], axis=-1)  # (batch, dim)
        if self.spec.normalize:
            pooled = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return pooled


def pool(mode: str, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """sentence-transformers' Pooling over right-padded ``tokens`` (batch, seq, hidden) and ``mask`` (batch, seq)."""
    m = mask[..., None]  # (batch, seq, 1)
    if mode == "cls":
        return tokens[np.arange(len(tokens)), mask.argmax(axis=1)]
    if mode == "max":
        return np.where(m > 0, tokens, -np.inf).max(axis=1)
    if mode == "lasttoken":
        last = mask.shape[1] - 1 - mask[:, ::-1].argmax(axis=1)
        return (tokens * m)[np.arange(len(tokens)), last]
    if mode == "weightedmean":
        w = m * np.arange(1, mask.shape[1] + 1, dtype=np.float32)[None, :, None]
        return (tokens * w).sum(axis=1) / np.maximum(w.sum(axis=1), 1e-9)
    total = np.maximum(m.sum(axis=1), 1e-9)  # (batch, 1)
    return (tokens * m).sum(axis=1) / (total if mode == "mean" else np.sqrt(total))


class OnnxTowers:
    """DualEncoder over an ONNX export (``encoders.onnx_export``) of one sentence-transformers model."""

    def __init__(self, export_dir: Path, model_path: Path, backend: OnnxBackend = "onnx", *,
                 threads: int | None = None, name: str | None = None) -> None:
        """Reads the manifest (``ExportMissing`` when it is not current; ``ExportCorrupt`` when a tower's check
        fails); each tower's session is made on its first use, so a process that only asks questions never loads
        the passage tower. A variant not yet measured with the installed runtime (openvino installed after the
        export, a new version) is measured now against torch's probe vectors, without torch."""
        if backend not in VARIANT_FILES:
            raise ValueError(f"backend {backend!r} is not an ONNX backend; use one of {', '.join(VARIANT_FILES)}")
        self.path = Path(model_path)
        self.export_dir = Path(export_dir)
        self.name = name or self.path.name
        self.backend = backend
        self._threads = threads
        self._towers: dict[str, OnnxTower] = {}
        self._lock = threading.Lock()
        self.manifest = read_current_manifest(self.export_dir, self.path)  # raises ExportMissing
        variant = self.manifest["variants"].get(backend) or {}
        if variant.get("runtime") != runtime_version(backend):
            self.manifest = measure_variant(self.export_dir, self.path, backend)
        if self.manifest["variants"][backend].get("available") is False:
            raise RuntimeUnavailable(f"{backend} cannot run here: {self.manifest['variants'][backend].get('error')}")
        self.model_fingerprint = str(self.manifest["model_fingerprint"])
        variant = str(self.manifest["variants"][backend]["fingerprint"])  # "<model fp>" or "<model fp>-<backend>"
        # a question-only model's passage tower is its partner's: its points carry the partner's passage fingerprint
        self._fingerprint = passage_fingerprint(self.path) + variant[len(self.model_fingerprint):]
        self._reference: dict[str, np.ndarray] | None = None

    def _tower(self, role: str) -> OnnxTower:
        with self._lock:
            tower = self._towers.get(role)
            if tower is None:
                spec = TowerSpec.from_manifest(self.manifest["towers"][role])
                shared = next((t for t in self._towers.values() if t.spec == spec), None)
                tower = shared or self._checked(role, spec)
                self._towers[role] = tower
            return tower

    def load(self, role: str) -> OnnxTowers:
        """Make and check the ``role`` tower now (``ExportCorrupt`` if its export is damaged): the loader calls
        this so a damaged export is made again before it serves, not on the first passage."""
        self._tower(role)
        return self

    def _checked(self, role: str, spec: TowerSpec) -> OnnxTower:
        """The tower, once its vectors of ``CHECKED_PROBES`` match torch's as closely as the export measured."""
        try:
            tower = OnnxTower(self.export_dir, spec, self.backend, self._threads)
            reference = self._probe_vectors()
        except Exception as e:  # a graph or weights file the runtime cannot read
            raise ExportCorrupt(f"the export under {self.export_dir} cannot be loaded ({e}); it is made again") from e
        if reference is None:
            return tower
        texts = [str(reference["texts"][i]) for i in CHECKED_PROBES]
        got = tower.encode(texts, len(texts))
        want = reference[role][list(CHECKED_PROBES)]
        cos = (got * want).sum(axis=1) / np.maximum(
            np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1), 1e-12)
        variant = self.manifest["variants"][self.backend]
        floor = min(float(variant["cosine"][role]["min"]) - 0.002, 0.99)
        if float(cos.min()) < floor:
            raise ExportCorrupt(f"the {role} tower under {self.export_dir} no longer gives the vectors it was "
                                f"measured with (cosine {float(cos.min()):.4f} < {floor:.4f}); it is made again")
        return tower

    def _probe_vectors(self) -> dict[str, np.ndarray] | None:
        if self._reference is None:
            path = self.export_dir / PROBE_VECTORS
            if not path.is_file():
                return None
            with np.load(path) as data:
                self._reference = {k: data[k] for k in data.files}
        return self._reference

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    @property
    def dim(self) -> int:
        return int(self.manifest["dim"])

    @property
    def similarity(self) -> Similarity:
        return self.manifest["similarity"]  # type: ignore[no-any-return]

    @property
    def max_passage_tokens(self) -> int:
        return int(self.manifest["towers"]["document"]["max_passage_tokens"])

    def passage_token_offsets(self, text: str) -> list[tuple[int, int]]:
        enc = self._tower("document").raw_tokenizer.encode(text, add_special_tokens=False)
        return [(int(a), int(b)) for a, b in enc.offsets]

    def encode_queries(self, questions: list[str], batch_size: int = 32) -> np.ndarray:
        return self._encode("query", questions, batch_size)

    def encode_documents(self, passages: list[str], batch_size: int = 32) -> np.ndarray:
        return self._encode("document", passages, batch_size)

    def _encode(self, role: str, texts: list[str], batch_size: int) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return self._tower(role).encode(texts, batch_size)


def measure_variant(export_dir: Path, model_path: Path, backend: OnnxBackend) -> dict[str, Any]:
    """Measure ``backend``'s variant of an export against torch's probe vectors (``PROBE_VECTORS``; no torch
    needed) and record it in the manifest (one measurer at a time per export; the others read its result).
    Returns the manifest."""
    import fcntl

    with open(export_dir.parent / f".{export_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        manifest = read_current_manifest(export_dir, model_path)
        if (manifest["variants"].get(backend) or {}).get("runtime") == runtime_version(backend):
            return manifest  # another process measured it meanwhile
        with np.load(export_dir / PROBE_VECTORS) as data:
            reference = {k: data[k] for k in data.files}
        if backend == "onnx-int8":
            _add_int8(export_dir, manifest)
        manifest["variants"][backend] = variant_agreement(export_dir, model_path, backend, reference,
                                                          str(manifest["model_fingerprint"]))
        write_manifest(export_dir, manifest)
        log.info("measured a runtime's towers against torch", extra={
            "model_path": str(model_path), "backend": backend, "variant": manifest["variants"][backend]})
        return manifest


def _add_int8(export_dir: Path, manifest: dict[str, Any]) -> None:
    """Quantise each tower's fp32 graph to int8 where the export has none yet (no torch), recorded in the
    manifest (its files' sizes, the MatMuls kept in fp32)."""
    from encoders.onnx_graphs import make_int8  # onnx's quantiser: loaded only by the process that needs int8

    for directory in sorted({t["directory"] for t in manifest["towers"].values()}):
        graph = export_dir / directory / VARIANT_FILES["onnx-int8"]
        if graph.is_file() and manifest.get("files", {}).get(f"{directory}/{graph.name}"):
            continue
        manifest.setdefault("int8_fp32_matmuls", {})[directory] = make_int8(export_dir / directory)
        for f in (graph, graph.with_name(graph.name + ".data")):
            if f.is_file():
                manifest.setdefault("files", {})[f"{directory}/{f.name}"] = f.stat().st_size


def variant_agreement(export_dir: Path, model_path: Path, backend: OnnxBackend, reference: dict[str, np.ndarray],
                      fingerprint: str) -> dict[str, Any]:
    """Cosine of ``backend``'s vectors of the probes against torch's (``reference``: texts, query, document), both
    towers; the fingerprint the variant carries: the model's when it clears ``AGREEMENT``, else suffixed. A
    runtime that cannot run here (openvino on a CPU it cannot use) gets ``available: false`` and the suffix."""
    texts = [str(t) for t in reference["texts"]]
    record: dict[str, Any] = {"runtime": runtime_version(backend)}
    try:
        towers = _Unchecked(export_dir, model_path, backend)
        got = {"query": towers.encode_queries(texts), "document": towers.encode_documents(texts)}
    except Exception as e:
        log.warning("this runtime cannot run the towers here; it will not be chosen",
                    extra={"backend": backend, "error": str(e)})
        return {**record, "fingerprint": f"{fingerprint}-{backend}", "agrees_with_torch": False,
                "available": False, "error": str(e)}
    cosine = {role: cosines(reference[role], got[role]) for role in got}
    agrees = all(c[stat] >= bound for c in cosine.values() for stat, bound in AGREEMENT[backend].items())
    return {**record, "fingerprint": fingerprint if agrees else f"{fingerprint}-{backend}",
            "agrees_with_torch": agrees, "cosine": cosine}


def cosines(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    cos = (a * b).sum(axis=1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)
    return {"min": round(float(cos.min()), 6), "mean": round(float(cos.mean()), 6)}


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest.json`` atomically (a reader sees the old one or the new one)."""
    tmp = directory / f".{MANIFEST}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, directory / MANIFEST)


class _Unchecked(OnnxTowers):
    """An export's towers before their variant is measured: what the measurement itself encodes with."""

    def __init__(self, export_dir: Path, model_path: Path, backend: OnnxBackend) -> None:
        self.path, self.export_dir, self.name, self.backend = Path(model_path), Path(export_dir), "probe", backend
        self._threads, self._towers, self._lock, self._reference = None, {}, threading.Lock(), None
        self.manifest = json.loads((self.export_dir / MANIFEST).read_text())

    def _checked(self, role: str, spec: TowerSpec) -> OnnxTower:
        return OnnxTower(self.export_dir, spec, self.backend, self._threads)

    @property
    def dim(self) -> int:
        return int(self.manifest["dim"])
