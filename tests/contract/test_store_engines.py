"""The store contract (``store_contract.StoreContract``) run against every engine, plus ``open_store``.

- ``edge``: ``EdgeEngine`` over qdrant-edge shards in ``tmp_path`` (the embedded default);
- ``server-memory``: ``ServerEngine`` over ``QdrantClient(":memory:")`` (qdrant-client's in-process engine);
- ``server-remote``: ``ServerEngine`` over a real Qdrant at ``$QDRANT_URL`` (marked ``integration``; skipped when
  unset).

Engine-specific behaviour lives beside it: the edge lease in ``tests/unit/test_edge_lease.py`` and
``tests/integration/test_edge_locking.py``, the server's cluster options and errors in
``tests/unit/test_server_cluster_options.py``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from qdrant_client import QdrantClient, models
from store_contract import SPEC, EngineFactory, StoreContract

from services.core.settings import Settings
from services.store import Store, VectorStore, open_store
from services.store.common import linear_fusion, min_max
from services.store.edge.engine import EdgeEngine
from services.store.server.engine import ServerEngine


@pytest.fixture(
    params=[
        pytest.param("edge", marks=pytest.mark.unit),
        pytest.param("server-memory", marks=pytest.mark.unit),
        pytest.param("server-remote", marks=pytest.mark.integration),
    ]
)
def engine_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EngineFactory]:
    alias = "passages"
    if request.param == "edge":
        yield lambda: EdgeEngine(tmp_path / "store", alias, lock_timeout=10, idle_release=0.05)
        return
    if request.param == "server-memory":
        client = QdrantClient(":memory:")
        yield lambda: ServerEngine(client, alias)
        return
    url = os.environ.get("QDRANT_URL")
    if not url:
        pytest.skip("set QDRANT_URL=http://host:6333 to run the contract suite against a real Qdrant server")
    client = QdrantClient(url=url, api_key=os.environ.get("QDRANT_API_KEY"), timeout=30)
    alias = f"dpr_contract_{uuid.uuid4().hex[:10]}"
    yield lambda: ServerEngine(client, alias)
    _drop_remote(client, alias)


def _drop_remote(client: QdrantClient, alias: str) -> None:
    for a in client.get_aliases().aliases:
        if a.alias_name == alias:
            client.update_collection_aliases(
                change_aliases_operations=[
                    models.DeleteAliasOperation(delete_alias=models.DeleteAlias(alias_name=alias))
                ]
            )
    for c in client.get_collections().collections:
        if c.name.startswith(alias + "__g"):
            client.delete_collection(c.name)


class TestStoreContract(StoreContract):
    """Every contract test, once per engine."""


@pytest.mark.unit
def test_open_store_picks_the_engine(tmp_path: Path) -> None:
    edge = open_store(Settings(data_dir=tmp_path, collection="c1", _env_file=None))  # type: ignore[call-arg]
    server = open_store(Settings(data_dir=tmp_path, qdrant_url=":memory:", collection="c2", _env_file=None))  # type: ignore[call-arg]
    try:
        assert isinstance(edge, Store) and isinstance(edge.engine, EdgeEngine)
        assert isinstance(server, Store) and isinstance(server.engine, ServerEngine)
        assert (edge.backend, edge.alias, server.backend, server.alias) == ("edge", "c1", "server", "c2")
        assert isinstance(edge, VectorStore) and isinstance(server, VectorStore)
        assert edge.ensure_collection(SPEC) == "c1__g0001"
        assert (tmp_path / "store" / "c1" / "CURRENT").read_text().strip() == "c1__g0001"
        assert server.ensure_collection(SPEC) == "c2__g0001"
    finally:
        edge.close()
        server.close()


@pytest.mark.unit
def test_linear_fusion_is_min_max_weighted() -> None:
    dense = [("a", 0.9, {}), ("b", 0.5, {}), ("c", 0.1, {})]
    sparse = [("c", 12.0, {}), ("d", 2.0, {})]
    fused = dict((pid, score) for pid, score, _ in linear_fusion(dense, sparse, weight=0.7, k=10))
    assert fused == pytest.approx({"a": 0.7, "b": 0.35, "c": 0.3, "d": 0.0})
    assert min_max([3.0, 1.0, 2.0], higher_is_better=False) == [0.0, 1.0, 0.5]  # euclid distances
    assert min_max([4.0]) == [1.0]
