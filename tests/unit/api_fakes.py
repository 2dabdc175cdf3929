"""Test doubles for the API unit tests: deterministic hashing towers (no model) and a runtime over a real
in-process store (``Store(ServerEngine(QdrantClient(":memory:")))``) with the real BM25 sparse embedder."""

from __future__ import annotations

import hashlib
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from qdrant_client import QdrantClient

from services.runtime import Runtime
from services.settings import Settings
from services.sparse import default_embedder
from services.store import Store
from services.store.engines.server import ServerEngine

_WORD = re.compile(r"\w+|[^\w\s]")


class HashTowers:
    """Bag-of-words vectors hashed into ``dim`` buckets: similar wording -> similar vectors. Both towers alike."""

    similarity = "cosine"
    max_passage_tokens = 64

    def __init__(self, dim: int = 64, name: str = "hash-a") -> None:
        self.dim = dim
        self.fingerprint = f"{name}@{dim}"
        self.encoded = 0

    def passage_token_offsets(self, text: str) -> list[tuple[int, int]]:
        return [(m.start(), m.end()) for m in _WORD.finditer(text)]

    def _vec(self, text: str) -> np.ndarray:
        v = np.zeros(self.dim, dtype=np.float32)
        for w in _WORD.findall(text.lower()):
            v[int(hashlib.md5(w.encode()).hexdigest(), 16) % self.dim] += 1.0
        n = float(np.linalg.norm(v))
        return v / n if n else v + 1.0 / np.sqrt(self.dim)

    def encode_queries(self, questions: list[str], batch_size: int = 32) -> np.ndarray:
        return np.stack([self._vec(q) for q in questions])  # (n, dim)

    def encode_documents(self, passages: list[str], batch_size: int = 32) -> np.ndarray:
        self.encoded += len(passages)
        return np.stack([self._vec(p) for p in passages])  # (n, dim)


class FakeRuntime(Runtime):
    """A real ``services.runtime.Runtime`` over hashing towers, the real BM25 embedder and an in-process store
    (the server engine on ``QdrantClient(":memory:")``); jobs go to a temporary job folder."""

    def __init__(self, towers: Any | None = None, store: Any | None = None, alias: str = "passages") -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="dpr-fake-runtime-")
        super().__init__(
            Settings(_env_file=None, data_dir=Path(self._tmp.name), collection=alias),  # type: ignore[call-arg]
            serialize_store=True,
            towers=towers or HashTowers(),
            sparse=default_embedder(),
            store=store or Store(ServerEngine(QdrantClient(location=":memory:"), alias, owns_client=True)),
        )
        self.closed = False

    def use_towers(self, towers: Any) -> None:
        """Swap the model (e.g. a question tower that is not the passage tower's partner)."""
        self._models.towers = towers

    def close(self) -> None:
        self.closed = True
        super().close()
