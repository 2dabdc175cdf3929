"""The one set of test towers: deterministic hashing towers (no model), a counting spy over any towers, and a
runtime: a real ``services.runtime.Runtime`` over those towers, the real BM25 sparse embedder and an in-process
store (``Store(ServerEngine(QdrantClient(":memory:")))``). The Redis stand-in is ``kit.fake_redis``."""

from __future__ import annotations

import hashlib
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from qdrant_client import QdrantClient

from encoders.towers import DualEncoder, Similarity
from kit.policy import make_settings
from services.runtime import Runtime
from services.store import Store
from services.store.server.engine import ServerEngine
from services.store.sparse import default_embedder

# A tokenizer's shape without a tokenizer: words, and each punctuation mark on its own.
_TOKEN = re.compile(r"\w+|[^\w\s]")
_WORD = re.compile(r"\w+")


class HashTowers:
    """``encoders.towers.DualEncoder`` without a model: bag of words hashed into ``dim`` buckets, L2-normalised,
    so shared words mean similar vectors. Both towers alike. ``name`` salts the hash and the fingerprint: two names
    are two models (different vectors, different fingerprints). ``encoded`` counts passages the passage tower saw."""

    similarity: Similarity = "cosine"

    def __init__(self, dim: int = 64, name: str = "hash-a", max_passage_tokens: int = 64) -> None:
        self.dim = dim
        self.name = name
        self.fingerprint = f"{name}@{dim}"
        self.max_passage_tokens = max_passage_tokens
        self.encoded = 0

    def passage_token_offsets(self, text: str) -> list[tuple[int, int]]:
        return [m.span() for m in _TOKEN.finditer(text)]

    def encode_queries(self, questions: list[str], batch_size: int = 32) -> np.ndarray:
        return self._encode(questions)

    def encode_documents(self, passages: list[str], batch_size: int = 32) -> np.ndarray:
        self.encoded += len(passages)
        return self._encode(passages)

    def _encode(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)  # (n, dim)
        for i, text in enumerate(texts):
            for word in _WORD.findall(text.lower()):
                digest = hashlib.md5(f"{self.name}:{word}".encode()).digest()
                out[i, int.from_bytes(digest[:8], "big") % self.dim] += 1.0
            norm = float(np.linalg.norm(out[i]))
            out[i] = out[i] / norm if norm else 1.0 / np.sqrt(self.dim)  # no words: a valid unit vector
        return out


class CountingTowers:
    """A spy over any towers (the real ones included): everything passes through, ``encoded`` counts passages."""

    def __init__(self, towers: DualEncoder) -> None:
        self._towers = towers
        self.encoded = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._towers, name)

    def encode_documents(self, passages: list[str], batch_size: int = 32) -> np.ndarray:
        self.encoded += len(passages)
        return self._towers.encode_documents(passages, batch_size=batch_size)


class FakeRuntime(Runtime):
    """A real ``services.runtime.Runtime`` over hashing towers, the real BM25 embedder and an in-process store
    (the server engine on ``QdrantClient(":memory:")``); jobs go to a temporary job folder."""

    def __init__(self, towers: Any | None = None, store: Any | None = None, alias: str = "passages") -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="dpr-fake-runtime-")
        super().__init__(
            make_settings(data_dir=Path(self._tmp.name), collection=alias),
            serialize_store=True,
            towers=towers or HashTowers(),
            sparse=default_embedder(),
            store=store or Store(ServerEngine(QdrantClient(location=":memory:"), alias, owns_client=True)),
        )
        self.closed = False

    def use_towers(self, towers: Any) -> None:
        """Swap the model (e.g. a question tower that is not the passage tower's partner)."""
        self._models.towers = self._models.question_towers = towers

    def close(self) -> None:
        self.closed = True
        super().close()
        self._tmp.cleanup()


def ingest_items(pipeline: Any, items: Any) -> Any:
    """``items`` through the product's one batch loop in this process (``executor.ingest_here``), the batches'
    reports summed; the job recorded in a throw-away job folder."""
    from services.ingest.executor import ingest_here
    from services.jobs import FileHashes, JobStore

    with tempfile.TemporaryDirectory(prefix="dpr-jobs-") as folder:
        return ingest_here(pipeline, items, JobStore(FileHashes(Path(folder))))
