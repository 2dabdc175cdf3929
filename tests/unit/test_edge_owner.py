"""``edge/owner.py`` and ``services.store.Answers``: the serving process answers other processes' Store calls on the
generations it has open."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.core.errors import StoreUnavailable
from services.store import Answers, Store
from services.store.edge import owner as edge_owner
from services.store.edge.engine import EdgeEngine
from services.store.points import CollectionSpec, Passage, PassagePoint

pytestmark = [pytest.mark.unit, pytest.mark.skipif(not edge_owner.supported(), reason="abstract sockets: Linux")]
SPEC = CollectionSpec(dim=4, distance="cosine", model="m@1", sparse=False)
COUNT: edge_owner.Call = (Store.count, (), {})


class _Unpicklable(Exception):
    def __init__(self, path: str, needed: int) -> None:
        super().__init__(f"{path} needs {needed}")


def test_an_error_that_cannot_cross_the_socket_becomes_store_unavailable() -> None:
    kept = StoreUnavailable("the lock is held")
    assert edge_owner._portable(kept, "upsert") is kept
    crossed = edge_owner._portable(_Unpicklable("/x", 3), "upsert")
    assert isinstance(crossed, StoreUnavailable) and "_Unpicklable: /x needs 3" in str(crossed)


def test_with_no_owner_a_call_runs_here_and_the_socket_is_not_asked_again_at_once(tmp_path: Path) -> None:
    client = edge_owner.OwnerClient(tmp_path, timeout_s=1)
    assert client.call("c", "c__g0001", COUNT) == (False, None)
    assert client._absent_until > 0  # the next calls do not reconnect for a while


def test_an_owner_answers_only_for_generations_it_has_open_and_only_whitelisted_calls(tmp_path: Path) -> None:
    store = Store(EdgeEngine(tmp_path, "c", idle_release=3600))
    store.ensure_collection(SPEC)
    owner = edge_owner.Owner(tmp_path, Answers(lambda alias: EdgeEngine(tmp_path, alias, idle_release=3600)))
    assert owner.start()
    try:
        client = edge_owner.OwnerClient(tmp_path, timeout_s=5)
        edge_owner._OWNED_HERE.discard(owner.address)  # ask it as another process would
        store.engine.close()  # nothing open: the caller takes the generation itself
        assert client.call("c", "c__g0001", COUNT) == (False, None)
        store.upsert([PassagePoint(Passage(doc_id="d", chunk_index=0, text="t"), dense=[1.0, 0.0, 0.0, 0.0])])
        assert client.call("c", "c__g0001", COUNT) == (True, 1)  # open now: counted there
        with pytest.raises(StoreUnavailable, match="does not run 'drop_generation'"):
            client.call("c", "c__g0001", (Store.drop_generation, (), {}))
        pid_before = client._local.pid
        assert pid_before == os.getpid()
        client._local.pid = -1  # as if inherited through a fork: a fresh connection, not the parent's
        assert client.call("c", "c__g0001", COUNT) == (True, 1) and client._local.pid == os.getpid()
    finally:
        edge_owner._OWNED_HERE.add(owner.address)
        owner.close()
        store.close()
