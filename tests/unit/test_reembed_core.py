"""Re-embed logic over the real embedded store (qdrant-edge in tmp_path) with a tiny deterministic fake tower."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from kit.fakes import HashTowers

from services.core.locks import FileFence, FileLease
from services.core.settings import ChunkSettings
from services.ingest.pipeline import IngestPipeline, delete_documents
from services.lifecycle import (
    GateDecision,
    ReembedError,
    copy_batch,
    current_state,
    finalize,
    pending_batches,
    plan,
    run_gate,
    run_in_process,
)
from services.lifecycle.gc import gc
from services.lifecycle.rollback import rollback
from services.lifecycle.verify import verify
from services.query import search
from services.readers import Document
from services.store import Store
from services.store.edge.engine import EdgeEngine

pytestmark = pytest.mark.unit

V1, V2 = (HashTowers(dim=16, name=f"fake-v{v}", max_passage_tokens=40) for v in (1, 2))  # two models
TOWERS = {V1.fingerprint: V1, V2.fingerprint: V2}
CHUNK = ChunkSettings(max_tokens=24, overlap=4, max_title_tokens=4)


def doc(i: int, extra: str = "") -> Document:
    words = " ".join(f"word{(i * 7 + j) % 97}" for j in range(30))
    return Document(doc_id=f"doc-{i}", text=f"{words} {extra}".strip(), title=f"title {i}", source=f"doc-{i}.txt")


def ingest(store: Store, towers: HashTowers, docs: list[Document], **kw: object) -> None:
    report = IngestPipeline(store=store, towers=towers, chunking=CHUNK, **kw).ingest_batch(docs)  # type: ignore[arg-type]
    assert not report.failed, report.failed


@pytest.fixture(params=["edge", "server-memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "edge":
        s = Store(EdgeEngine(tmp_path / "store", "c", lock_timeout=10, idle_release=0.05))
    else:
        from qdrant_client import QdrantClient

        from services.store.server.engine import ServerEngine

        s = Store(ServerEngine(QdrantClient(":memory:"), "c"))
    ingest(s, V1, [doc(i) for i in range(12)])
    yield s
    s.close()


def test_reembed_swaps_to_a_verified_generation_with_one_fingerprint(store: Store) -> None:
    source = store.info().active
    state = plan(store, V2, model_name="v2")
    assert state is not None and state.source == source.name
    assert store.info().active.name == source.name  # nothing visible until verified
    result = run_in_process(store, state, V2, None, batch_size=7)
    assert result.outcome == "activated" and result.verification.ok
    info = store.info()
    assert info.active.name == state.target and info.active.spec.model == V2.fingerprint
    target_ids = {p.id for b in store.scroll(generation=state.target) for p in b}
    assert target_ids == {p.id for b in store.scroll(generation=source.name) for p in b}
    assert {p.model for b in store.scroll(generation=state.target) for p in b} == {V2.fingerprint}
    assert info.active.spec.settings["previous"] == source.name
    assert current_state(store).status == "active"
    assert plan(store, V2, model_name="v2") is None  # already embedded by this model


def test_interrupted_copy_resumes_without_redoing_or_duplicating(store: Store) -> None:
    state = plan(store, V2, model_name="v2")
    total = store.count()
    batches = pending_batches(store, state, batch_size=5)
    first = next(batches)
    copy_batch(store, state, first, V2, None)
    batches.close()  # "Ctrl-C"
    resumed = plan(store, V2, model_name="v2")
    assert resumed.target == state.target  # the same target generation, not a new one
    todo = sum(len(b) for b in pending_batches(store, resumed, batch_size=5))
    assert todo == total - len(first)
    result = run_in_process(store, resumed, V2, None, batch_size=5)
    assert result.copied == todo  # nothing copied twice
    assert store.count() == total and result.verification.ok


def test_writes_during_the_reembed_reach_the_new_generation_and_deletes_stay_deleted(store: Store) -> None:
    state = plan(store, V2, model_name="v2")
    for batch in pending_batches(store, state, batch_size=100):
        copy_batch(store, state, batch, V2, None)
    # meanwhile, on the still-active source: a new document, a changed one, a deleted one
    ingest(store, V1, [doc(100), doc(3, extra="changed words here")])
    delete_documents(["doc-5"], store=store)
    result = finalize(store, state, V2, None)
    assert result.outcome == "activated"
    passages = {p.id: p for b in store.scroll() for p in b}
    docs = {p.doc_id for p in passages.values()}
    assert "doc-100" in docs and "doc-5" not in docs
    assert any("changed words here" in p.text for p in passages.values() if p.doc_id == "doc-3")
    assert {p.model for p in passages.values()} == {V2.fingerprint}
    assert {p.id for b in store.scroll() for p in b} == {p.id for b in store.scroll(generation=state.source) for p in b}


def test_ingest_and_query_follow_the_collection_after_the_swap(store: Store) -> None:
    state = plan(store, V2, model_name="v2")
    run_in_process(store, state, V2, None)
    # a process still configured with the old towers writes and reads with the collection's towers
    ingest(store, V1, [doc(200)], towers_for=TOWERS.__getitem__)
    assert {p.model for b in store.scroll() for p in b if p.doc_id == "doc-200"} == {V2.fingerprint}
    hits = search("word3 word10", store=store, towers=V1, towers_for=TOWERS.__getitem__)  # type: ignore[arg-type]
    assert hits and {h.passage.model for h in hits} == {V2.fingerprint}


def test_rollback_restores_the_previous_generation_and_toggles(store: Store) -> None:
    first = store.info().active.name
    state = plan(store, V2, model_name="v2")
    run_in_process(store, state, V2, None)
    back = rollback(store)
    assert (back.from_generation, back.to_generation, back.model) == (state.target, first, V1.fingerprint)
    assert store.info().active.spec.model == V1.fingerprint
    forward = rollback(store)
    assert forward.to_generation == state.target


class _SlowTowers(HashTowers):
    """V2 whose tower notes when each batch of passages starts encoding."""

    def __init__(self) -> None:
        super().__init__(dim=16, name="fake-v2", max_passage_tokens=40)
        self.started: list[float] = []

    def encode_documents(self, passages: list[str], batch_size: int = 32):  # type: ignore[no-untyped-def]
        self.started.append(time.perf_counter())
        time.sleep(0.05)
        return super().encode_documents(passages, batch_size)


def test_a_batch_is_written_while_the_next_one_encodes(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    towers = _SlowTowers()
    assert towers.fingerprint == V2.fingerprint
    state = plan(store, towers, model_name="v2")
    writes: list[tuple[float, float, str]] = []
    upsert = store.upsert

    def slow_upsert(points, generation=None):  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        time.sleep(0.1)
        upsert(points, generation=generation)
        writes.append((start, time.perf_counter(), threading.current_thread().name))

    monkeypatch.setattr(store, "upsert", slow_upsert)
    result = run_in_process(store, state, towers, None, batch_size=5)
    monkeypatch.undo()
    assert result.outcome == "activated" and result.verification.ok
    copies = [w for w in writes if w[2].startswith("dpr-reembed-write")]
    assert len(copies) >= 2  # 12 documents of several passages, 5 a batch
    # the first batch's write was under way when the second batch started encoding
    assert copies[0][0] < towers.started[1] < copies[0][1]
    assert store.count(generation=state.target) == store.count(generation=state.source)


def test_a_failed_write_stops_the_reembed_and_nothing_is_swapped(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    source = store.info().active.name
    state = plan(store, V2, model_name="v2")
    upsert = store.upsert
    calls = []

    def failing(points, generation=None):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk full")
        upsert(points, generation=generation)

    monkeypatch.setattr(store, "upsert", failing)
    with pytest.raises(OSError, match="disk full"):
        run_in_process(store, state, V2, None, batch_size=5)
    monkeypatch.undo()
    assert store.info().active.name == source  # still the old generation
    resumed = plan(store, V2, model_name="v2")
    assert resumed.target == state.target
    result = run_in_process(store, resumed, V2, None, batch_size=5)
    assert result.outcome == "activated" and store.count() == store.count(generation=source)


def test_gc_keeps_the_newest_inactive_generations_and_never_the_active(store: Store) -> None:
    g1 = store.info().active.name
    s2 = plan(store, V2, model_name="v2")
    run_in_process(store, s2, V2, None)
    s3 = plan(store, V1, model_name="v1")
    run_in_process(store, s3, V1, None)
    assert [g.name for g in store.info().generations] == [g1, s2.target, s3.target]
    assert gc(store, keep=1) == [g1]
    assert gc(store, keep=0) == [s2.target]
    assert [g.name for g in store.info().generations] == [s3.target]


def test_gate_rejects_a_worse_model_and_records_both_scores(store: Store) -> None:
    active = store.info().active.name
    state = plan(store, V2, model_name="v2")
    scores = {V1.fingerprint: 0.6, V2.fingerprint: 0.5}

    def scorer(s: Store, generation: str, towers: HashTowers) -> float:
        assert s.info().generations  # scored through the real store
        return scores[towers.fingerprint]

    def gate() -> GateDecision:
        return run_gate(store, state, V2, V1, scorer, data="dev.jsonl")  # type: ignore[arg-type]

    result = run_in_process(store, state, V2, None, gate=gate)
    assert result.outcome == "rejected"
    assert store.info().active.name == active
    recorded = current_state(store)
    assert recorded.status == "rejected" and recorded.gate["candidate"] == 0.5 and recorded.gate["active"] == 0.6
    scores[V2.fingerprint] = 0.6  # ties promote
    again = plan(store, V2, model_name="v2")
    assert again.target != state.target
    assert run_in_process(store, again, V2, None, gate=gate).outcome == "activated"


def test_finalize_refuses_when_verification_fails(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    state = plan(store, V2, model_name="v2")
    import services.lifecycle.verify as catch_up_module

    monkeypatch.setattr(catch_up_module, "copy_batch", lambda *a, **k: 0)  # a catch-up that silently writes nothing
    with pytest.raises(ReembedError, match="failed verification"):
        finalize(store, state, V2, None)
    assert store.info().active.name == state.source
    assert not verify(store, state).ok


def test_fence_holds_writers_while_the_swap_runs(tmp_path: Path) -> None:
    fence = FileFence(tmp_path / "fence", timeout=5)
    events: list[str] = []
    with fence.shared():
        t = threading.Thread(target=lambda: _exclusive(fence, events))
        t.start()
        time.sleep(0.2)
        assert events == []  # the swap waits for the in-flight writer
        events.append("writer done")
    time.sleep(0.1)
    writer = threading.Thread(target=lambda: _shared(fence, events))
    writer.start()
    t.join(5)
    writer.join(5)
    assert events == ["writer done", "swap start", "swap end", "second writer"]


def _exclusive(fence: FileFence, events: list[str]) -> None:
    with fence.exclusive():
        events.append("swap start")
        time.sleep(0.3)
        events.append("swap end")


def _shared(fence: FileFence, events: list[str]) -> None:
    with fence.shared():
        events.append("second writer")


def test_file_lease_is_exclusive(tmp_path: Path) -> None:
    a, b = FileLease(tmp_path / "l"), FileLease(tmp_path / "l")
    assert a.acquire() and not b.acquire(wait=0.1)
    a.release()
    assert b.acquire()
    b.release()
