"""A re-embed over workers whose steps cannot succeed ends, failed and named, instead of waiting: a batch that fails
for good stops being pending, and a finalize step that cannot load the new towers records the failure (so
`dpr reembed --wait` returns and the re-embed lock is released)."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kit.fake_redis import FakeRedis
from kit.fakes import FakeRuntime, HashTowers

from encoders.registry import ModelNotFound
from services.core.locks import NoFence
from services.core.settings import ChunkSettings, Settings
from services.ingest.pipeline import IngestPipeline
from services.jobs import JobStore, RedisHashes
from services.lifecycle import distributed, plan
from services.lifecycle import locks as lifecycle_locks
from services.lifecycle.locks import lease_for
from services.lifecycle.progress import ReembedProgress
from services.readers import Document

pytestmark = pytest.mark.unit

V1, V2 = HashTowers(dim=16, name="fake-v1"), HashTowers(dim=16, name="fake-v2")


class NoTowers:
    """A worker that cannot find the new model (say, it is not under its DATA_DIR/models)."""

    sparse = None

    def towers_for(self, fingerprint: str) -> HashTowers:
        raise ModelNotFound(f"no model with fingerprint {fingerprint} under models/: copy it there")


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRedis]:
    fake = FakeRedis()
    monkeypatch.setattr(lifecycle_locks, "redis_client", lambda url: fake)
    jobs = JobStore(RedisHashes(fake, url="redis://127.0.0.1:6399/0"))
    def progress_for(settings: Settings, target: str, alias: str | None = None) -> ReembedProgress:
        return ReembedProgress(jobs, alias or settings.collection, target)

    monkeypatch.setattr(distributed, "progress_for", progress_for)
    yield fake


def test_a_batch_that_fails_for_good_does_not_keep_the_finalize_step_waiting(broker: FakeRedis) -> None:
    rt = FakeRuntime(towers=V1)
    try:
        docs = [Document(doc_id=f"d{i}", text=f"passage {i} about rivers", source=f"d{i}.txt") for i in range(4)]
        assert not IngestPipeline(store=rt.store, towers=V1,  # type: ignore[arg-type]
                                chunking=ChunkSettings(max_tokens=24, overlap=4)).ingest_batch(docs).failed
        settings = rt.settings.model_copy(update={"broker_url": "redis://127.0.0.1:6399/0"})
        lease = lease_for(settings)
        assert lease.acquire()
        state = plan(rt.store, V2, model_name="v2", lock_token=lease.token)  # type: ignore[attr-defined]
        assert state is not None
        progress = distributed.progress_for(settings, state.target, "passages")
        progress.reset()
        progress.sent(["b0"])
        passages = [p.to_payload() for page in rt.store.scroll() for p in page]

        with pytest.raises(ModelNotFound):
            distributed.copy_sent_batch(settings, NoTowers(), rt.store, "passages", state.target, "b0", passages)
        assert progress.pending() == 0  # recorded as failed, not left in flight

        out = distributed.finalize_sent(settings, NoTowers(), rt.store, NoFence(), "passages", state.target,
                                        gate=None, stall=3600)  # stall: what waiting for a lost batch would cost
        assert out is not None and out["outcome"] == "failed" and state.model in out["error"]
        assert progress.result() == out  # what `dpr reembed --wait` follows
        assert lifecycle_locks.reembed_lock_key("passages") not in broker.strings  # the lock is released
        assert rt.store.active().name == state.source  # type: ignore[union-attr]  # nothing swapped
    finally:
        rt.close()


def test_the_source_is_read_from_a_copy_and_taken_only_when_a_file_changed_while_it_was_copied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`dpr serve` answers from the source while a re-embed plans and reads it: the plan reads the records without
    counting (no lock); what to send is read from a copy of its files taken beside its holder, kept when no file
    changed while it was taken (never locked), else copied again under the lock (once); no copy is left behind."""
    from services.core.fsutil import tracks_mapped_writes
    from services.lifecycle.copy import pending_batches
    from services.lifecycle.verify import diff
    from services.store import Store
    from services.store.edge.engine import EdgeEngine
    from services.store.edge.generation_lock import GenerationLock

    store = Store(EdgeEngine(tmp_path, "c", idle_release=0))  # every run of calls ends by unlocking
    docs = [Document(doc_id=f"d{i}", text=f"passage {i} about rivers", source=f"d{i}.txt") for i in range(40)]
    assert not IngestPipeline(store=store, towers=V1,  # type: ignore[arg-type]
                            chunking=ChunkSettings(max_tokens=24, overlap=4)).ingest_batch(docs).failed
    source = store.active().name  # type: ignore[union-attr]
    taken: list[str] = []
    take = GenerationLock.take.__func__  # type: ignore[attr-defined]

    def counting(cls: type[GenerationLock], root: Path, generation: str, *args: Any, **kw: Any) -> GenerationLock:
        taken.append(generation)
        return take(cls, root, generation, *args, **kw)  # type: ignore[no-any-return]

    monkeypatch.setattr(GenerationLock, "take", classmethod(counting))
    state = plan(store, V2, model_name="v2")  # the records read without counts
    assert state is not None and state.source == source
    locked = 0 if tracks_mapped_writes(tmp_path) else 1  # tmpfs: every read copies under the lock
    seen = sum(len(batch) for batch in pending_batches(store, state, batch_size=4))
    assert taken.count(state.source) == locked
    assert len(diff(store, state).stale) == seen  # the same: nothing changed while it was copied
    assert taken.count(state.source) == 2 * locked
    copytree = shutil.copytree

    def touched(src: Path, dst: Path, *args: Any, **kw: Any) -> Any:  # a file changes while the copy is taken
        out = copytree(src, dst, *args, **kw)
        if Path(dst).name == "shard":
            first = next(p for p in Path(src).rglob("*") if p.is_file())
            os.utime(first, ns=(time.time_ns(), time.time_ns()))
        return out

    monkeypatch.setattr(shutil, "copytree", touched)
    assert len(diff(store, state).stale) == seen  # so it is copied again under the lock
    assert taken.count(state.source) == 2 * locked + 1
    monkeypatch.setattr(shutil, "copytree", copytree)
    assert seen == store.count() == 40
    assert not list((tmp_path / "c" / "generations").glob(".*read*"))
    store.close()


def test_a_copy_that_cannot_be_taken_beside_the_holder_is_taken_under_the_lease(tmp_path: Path) -> None:
    """A swap cut short between its renames (no ``shard``, only ``shard.next``) fails the copy taken without the
    lock; the read then copies under the lease (which finishes the swap first) and a dead reader's copy goes."""
    from services.store import Store
    from services.store.edge.engine import EdgeEngine

    store = Store(EdgeEngine(tmp_path, "c", idle_release=0))
    docs = [Document(doc_id=f"d{i}", text=f"passage {i} about rivers", source=f"d{i}.txt") for i in range(10)]
    assert not IngestPipeline(store=store, towers=V1,  # type: ignore[arg-type]
                            chunking=ChunkSettings(max_tokens=24, overlap=4)).ingest_batch(docs).failed
    name = store.active().name  # type: ignore[union-attr]
    store.close()
    gens = tmp_path / "c" / "generations"
    os.replace(gens / name / "shard", gens / name / "shard.next")
    (gens / f".{name}.read.999999999.x").mkdir()  # no such pid
    assert sum(len(page) for page in store.scan(4, generation=name)) == store.count() == 10
    assert not list(gens.glob(".*read*"))
    store.close()
