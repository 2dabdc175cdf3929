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
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from encoders.batching import length_slices
from encoders.towers import ONNX_DIR, Similarity, model_files_key, model_fingerprint, passage_fingerprint

Backend = Literal["torch", "onnx", "onnx-int8"]
OnnxBackend = Literal["onnx", "onnx-int8"]
BACKENDS: tuple[Backend, ...] = ("torch", "onnx", "onnx-int8")
MANIFEST = "manifest.json"
FORMAT = 4  # bumped when the export changes: an older export is made again (2: weights in .data files; 3: no
# softmax NaN guards, one attention mask; 4: int8 keeps the most sensitive projections in fp32)
VARIANT_FILES: dict[str, str] = {"onnx": "model.onnx", "onnx-int8": "model.int8.onnx"}
POOLING_MODES = ("cls", "mean", "mean_sqrt_len_tokens", "max", "weightedmean", "lasttoken")


class ExportMissing(LookupError):
    """No current ONNX export for a model (none yet, an older format, or the model changed since)."""


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
        """Reads the manifest (``ExportMissing`` when it is not current); each tower's session is made on its first
        use, so a process that only asks questions never loads the passage tower."""
        if backend not in VARIANT_FILES:
            raise ValueError(f"backend {backend!r} is not an ONNX backend; use onnx or onnx-int8")
        self.path = Path(model_path)
        self.export_dir = Path(export_dir)
        self.name = name or self.path.name
        self.backend = backend
        self._threads = threads
        self.manifest = read_current_manifest(self.export_dir, self.path)  # raises ExportMissing
        self.model_fingerprint = str(self.manifest["model_fingerprint"])
        variant = str(self.manifest["variants"][backend]["fingerprint"])  # "<model fp>" or "<model fp>-<backend>"
        # a question-only model's passage tower is its partner's: its points carry the partner's passage fingerprint
        self._fingerprint = passage_fingerprint(self.path) + variant[len(self.model_fingerprint):]
        self._towers: dict[str, OnnxTower] = {}
        self._lock = threading.Lock()

    def _tower(self, role: str) -> OnnxTower:
        with self._lock:
            tower = self._towers.get(role)
            if tower is None:
                spec = TowerSpec.from_manifest(self.manifest["towers"][role])
                shared = next((t for t in self._towers.values() if t.spec == spec), None)
                tower = shared or OnnxTower(self.export_dir, spec, self.backend, self._threads)
                self._towers[role] = tower
            return tower

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
