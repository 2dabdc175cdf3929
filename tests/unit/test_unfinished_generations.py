"""A re-embed's target generation is not one of the collection's generations until it is verified and swapped:
`dpr status` shows it apart ("unfinished": its builder, alive or dead), the next `dpr reembed` resumes it, and
`dpr gc` drops it once its builder is dead (a `dpr reembed` killed with SIGKILL). A half-made generation
directory (a crash mid-creation) is removed by the next creation."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from kit.fake_redis import FakeRedis
from kit.fakes import FakeRuntime, HashTowers

from entrypoints.status import collection_status
from services.core.settings import ChunkSettings
from services.ingest.pipeline import IngestPipeline
from services.lifecycle import locks as lifecycle_locks
from services.lifecycle import plan, save_state
from services.lifecycle.builder import builder_alive
from services.lifecycle.gc import gc, gc_collection
from services.lifecycle.locks import lease_for
from services.lifecycle.progress import reembed_job_id
from services.lifecycle.state import ReembedState
from services.readers import Document
from services.store import Store
from services.store.edge.engine import EdgeEngine
from services.store.points import CollectionSpec
from workers import executor as workers_executor

pytestmark = pytest.mark.unit

V1, V2 = HashTowers(dim=16, name="fake-v1"), HashTowers(dim=16, name="fake-v2")


@pytest.fixture
def runtime() -> Iterator[FakeRuntime]:
    rt = FakeRuntime(towers=V1)
    docs = [Document(doc_id=f"d{i}", text=f"passage {i} about rivers and cells", source=f"d{i}.txt") for i in range(6)]
    report = IngestPipeline(store=rt.store, towers=V1,  # type: ignore[arg-type]
                          chunking=ChunkSettings(max_tokens=24, overlap=4)).ingest_batch(docs)
    assert not report.failed
    yield rt
    rt.close()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _status(rt: FakeRuntime) -> dict:  # type: ignore[type-arg]
    return collection_status(rt.settings, rt.store.info())


def test_a_building_generation_is_listed_apart_with_its_builder_and_gc_drops_it_once_the_builder_is_dead(
    runtime: FakeRuntime,
) -> None:
    store = runtime.store
    source = store.info().active.name  # type: ignore[union-attr]
    state = plan(store, V2, model_name="v2", owned_here=True)
    assert state is not None and state.target != source

    status = _status(runtime)
    assert [g["name"] for g in status["generations"]] == [source]  # never shown as a normal inactive generation
    [building] = status["unfinished"]
    assert building["name"] == state.target and building["status"] == "building"
    assert building["owner"]["alive"] is True and building["owner"]["pid"] > 0
    assert status["generation"] == source
    assert gc(store, keep=0) == []  # its builder runs: kept

    save_state(store, replace(state, pid=_dead_pid()))  # the builder was killed (SIGKILL)
    [orphan] = _status(runtime)["unfinished"]
    assert orphan["owner"]["alive"] is False and "dpr reembed" in orphan["next"] and "dpr gc" in orphan["next"]

    resumed = plan(store, V2, model_name="v2", owned_here=True)  # the next re-embed resumes into it
    assert resumed is not None and resumed.target == state.target
    assert _status(runtime)["unfinished"][0]["owner"]["alive"] is True  # and owns it now

    save_state(store, replace(resumed, pid=_dead_pid()))
    assert plan(store, V2, model_name="v2").pid == 0  # type: ignore[union-attr]  # workers resume it: theirs now
    save_state(store, replace(resumed, pid=_dead_pid()))
    assert gc(store, keep=5, drop_orphans=False) == []  # a re-embed may be resuming it: kept
    assert gc(store, keep=5) == [state.target]
    status = _status(runtime)
    assert status["unfinished"] == [] and [g["name"] for g in status["generations"]] == [source]


def test_a_generation_of_an_older_record_without_owner_fields_is_kept_as_unknown(runtime: FakeRuntime) -> None:
    state = plan(runtime.store, V2, model_name="v2")  # neither a process nor a lease token recorded
    assert state is not None and state.pid == 0 and not state.lock_token
    [building] = _status(runtime)["unfinished"]
    assert building["owner"] == {"pid": None, "host": None, "job": None, "lease": None, "alive": None}
    assert gc(runtime.store, keep=0) == []


def test_a_generation_built_by_workers_shows_their_job_and_is_dropped_or_resumed_once_their_lease_expired(
    runtime: FakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = FakeRedis()
    monkeypatch.setattr(lifecycle_locks, "redis_client", lambda url: broker)
    monkeypatch.setattr(workers_executor, "queue_depth", lambda settings: 0)  # `dpr status` reads them with a broker
    monkeypatch.setattr(workers_executor, "broker_refusal", lambda settings: None)
    settings = runtime.settings.model_copy(update={"broker_url": "redis://127.0.0.1:6399/0"})
    store = runtime.store
    lease = lease_for(settings)  # what `dpr reembed` through a broker takes before planning
    assert lease.acquire()
    state = plan(store, V2, model_name="v2", lock_token=lease.token)  # type: ignore[attr-defined]
    assert state is not None and state.pid == 0 and state.lock_token == lease.token  # type: ignore[attr-defined]

    def status() -> dict:  # type: ignore[type-arg]
        return collection_status(settings, store.info())

    [building] = status()["unfinished"]
    owner = building["owner"]
    assert owner["job"] == reembed_job_id("passages", state.target) and owner["lease"] == "dpr:lock:reembed:passages"
    assert owner["alive"] is True and building["next"] == "being built (re-embed in progress)"
    assert gc_collection(settings, keep=0, store=store)[0] == []  # the workers hold the lease: kept

    broker.strings.clear()  # no step refreshed the lease for lock_ttl: it expired (the workers were stopped)
    [orphan] = status()["unfinished"]
    assert orphan["owner"]["alive"] is False and "dpr reembed" in orphan["next"] and "dpr gc" in orphan["next"]
    assert builder_alive(settings, ReembedState.from_generation(  # type: ignore[arg-type]
        next(g for g in store.info().generations if g.name == state.target))) is False

    again = lease_for(settings)  # the next `dpr reembed` resumes it, under its own lease
    assert again.acquire()
    resumed = plan(store, V2, model_name="v2", lock_token=again.token)  # type: ignore[attr-defined]
    assert resumed is not None and resumed.target == state.target and resumed.lock_token == again.token  # type: ignore[attr-defined]
    assert status()["unfinished"][0]["owner"]["alive"] is True
    again.release()

    dropped, _ = gc_collection(settings, keep=5, store=store)  # its lease is gone: gc takes the lease, drops it
    assert dropped == [state.target]
    assert status()["unfinished"] == []
    assert broker.strings == {}  # gc let go of the lease


def test_a_broker_that_cannot_be_read_leaves_the_workers_generation_unknown_and_kept(
    runtime: FakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lifecycle_locks, "redis_client", lambda url: FakeRedis(down=True))
    monkeypatch.setattr(workers_executor, "queue_depth", lambda settings: 0)
    monkeypatch.setattr(workers_executor, "broker_refusal", lambda settings: None)
    settings = runtime.settings.model_copy(update={"broker_url": "redis://127.0.0.1:6399/0"})
    state = plan(runtime.store, V2, model_name="v2", lock_token="tok 1@host")
    assert state is not None
    [building] = collection_status(settings, runtime.store.info())["unfinished"]
    assert building["owner"]["alive"] is None and building["owner"]["job"]
    assert gc(runtime.store, keep=0, alive=lambda st: builder_alive(settings, st)) == []


def test_a_half_made_generation_directory_is_removed_by_the_next_creation(tmp_path: Path) -> None:
    store = Store(EdgeEngine(tmp_path / "store", "c", lock_timeout=10, idle_release=0))
    spec = CollectionSpec(dim=4, distance="cosine", model="m", sparse=False)
    try:
        g1 = store.ensure_collection(spec)
        generations = tmp_path / "store" / "c" / "generations"
        (generations / "c__g0002" / "shard").mkdir(parents=True)  # SIGBUS after mkdir, before spec.json
        (generations / "c__g0002" / "shard" / "wal").write_bytes(b"\0" * 4096)
        (generations / ".c__g0001.dropping.99").mkdir()  # a drop killed mid-delete
        assert [g.name for g in store.info().generations] == [g1]
        assert store.create_generation(spec) == "c__g0003"  # numbers are never reused
        assert sorted(p.name for p in generations.iterdir()) == [g1, "c__g0003"]
    finally:
        store.close()


def test_an_abandoned_generation_is_listed_apart_and_gc_drops_it(runtime: FakeRuntime) -> None:
    state = plan(runtime.store, V2, model_name="v2", owned_here=True)
    assert state is not None
    assert plan(runtime.store, V1, model_name="v1") is None  # another model asked for: the v2 target is abandoned
    [abandoned] = _status(runtime)["unfinished"]
    assert (abandoned["name"], abandoned["status"]) == (state.target, "abandoned")
    assert gc(runtime.store, keep=5) == [state.target]
