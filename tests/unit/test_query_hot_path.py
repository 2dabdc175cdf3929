"""The hot query path reads the active generation's spec from the cached ``active()``: no count, no listing of
generations, no spec file re-read per question (issue 13: ``info()`` counted every generation on every query)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kit.fakes import HashTowers

from services.query import QueryOptions, search
from services.store import Store
from services.store.edge.engine import EdgeEngine
from services.store.points import CollectionSpec, Passage, PassagePoint
from services.store.sparse import default_embedder

pytestmark = pytest.mark.unit


class Spy:
    """Any engine, with the calls the hot path must not make counted."""

    watched = ("count", "generations", "read_spec", "index_info", "needs_index")

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._engine, name)
        if name not in self.watched:
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return attr(*args, **kwargs)

        return counted


def test_questions_never_count_or_list_the_store(tmp_path: Path) -> None:
    towers, sparse = HashTowers(), default_embedder()
    spy = Spy(EdgeEngine(tmp_path, "c", idle_release=5))
    store = Store(spy)  # type: ignore[arg-type]
    store.ensure_collection(CollectionSpec(dim=towers.dim, distance="cosine", model=towers.fingerprint))
    texts = ["the Nile is a river in Africa", "cats sleep most of the day", "Paris is the capital of France"]
    vectors = towers.encode_documents(texts)
    store.upsert([
        PassagePoint(Passage(doc_id=f"d{i}", chunk_index=0, text=t), dense=v.tolist(), sparse=sparse.embed_document(t))
        for i, (t, v) in enumerate(zip(texts, vectors, strict=True))
    ])
    search("warm the cache", store=store, towers=towers, sparse=sparse)
    spy.calls.clear()
    for mode in ("dense", "sparse", "hybrid"):
        for fusion in ("rrf", "linear"):
            hits = search("which river is in Africa", store=store, towers=towers, sparse=sparse,
                          options=QueryOptions(k=2, mode=mode, fusion=fusion))  # type: ignore[arg-type]
            assert hits[0].passage.doc_id == "d0" and hits[0].passage.text == texts[0]
    assert spy.calls == []
    store.close()
