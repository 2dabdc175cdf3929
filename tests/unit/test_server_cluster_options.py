"""The server engine's own behaviour: cluster options (``settings.qdrant``) reach collection creation, and an
unreachable server is a transient error.

qdrant-client's in-process engine accepts every option but keeps only ``on_disk``; so the calls the adapter makes
are recorded on the way to the real in-process client (which must accept them), and, with ``QDRANT_URL`` set,
a real server is asked what it created.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest
from qdrant_client import QdrantClient

from services.core.errors import StoreUnavailable
from services.core.store_settings import QdrantSettings
from services.store import Store
from services.store.points import CollectionSpec
from services.store.server.engine import ServerEngine

SPEC = CollectionSpec(dim=8, distance="cosine", model="m@1")
CLUSTER = QdrantSettings(
    shard_number=3, replication_factor=2, write_consistency_factor=2, on_disk_vectors=True, hnsw_m=32,
    hnsw_ef_construct=200, quantization="int8",
)


class Recording:
    """The real client, with every ``create_collection`` call's arguments kept."""

    def __init__(self, client: QdrantClient) -> None:
        self._client = client
        self.created: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def create_collection(self, *args: Any, **kwargs: Any) -> Any:
        self.created.append(kwargs)
        return self._client.create_collection(*args, **kwargs)


@pytest.mark.unit
def test_cluster_options_sent_on_creation_and_accepted_by_the_engine() -> None:
    client = Recording(QdrantClient(":memory:"))
    store = Store(ServerEngine(client, "passages", CLUSTER))  # type: ignore[arg-type]
    generation = store.ensure_collection(SPEC)
    [sent] = client.created
    assert (sent["shard_number"], sent["replication_factor"], sent["write_consistency_factor"]) == (3, 2, 2)
    assert (sent["hnsw_config"].m, sent["hnsw_config"].ef_construct) == (32, 200)
    assert sent["quantization_config"].scalar.type.value == "int8"
    params = client.get_collection(generation).config.params
    assert params.vectors["dense"].on_disk is True  # the one option the in-process engine keeps
    assert store.info().active is not None and store.info().active.name == generation


@pytest.mark.unit
def test_defaults_leave_the_server_to_decide() -> None:
    client = Recording(QdrantClient(":memory:"))
    Store(ServerEngine(client, "passages")).ensure_collection(SPEC)  # type: ignore[arg-type]
    [sent] = client.created
    assert not {"shard_number", "replication_factor", "write_consistency_factor", "hnsw_config",
                "quantization_config"} & set(sent)


@pytest.mark.integration
@pytest.mark.skipif(not os.environ.get("QDRANT_URL"), reason="needs a real Qdrant server at $QDRANT_URL")
def test_real_server_creates_what_was_asked() -> None:
    client = QdrantClient(url=os.environ["QDRANT_URL"])
    alias = f"dpr_test_{uuid.uuid4().hex[:8]}"
    options = QdrantSettings(shard_number=2, hnsw_m=32, hnsw_ef_construct=200, quantization="int8")
    store = Store(ServerEngine(client, alias, options))
    generation = store.ensure_collection(SPEC)
    try:
        config = client.get_collection(generation).config
        assert config.params.shard_number == 2
        assert (config.hnsw_config.m, config.hnsw_config.ef_construct) == (32, 200)
        assert config.quantization_config is not None
    finally:
        client.delete_collection(generation)  # its alias goes with it


@pytest.mark.unit
def test_collection_params_carry_the_spec() -> None:
    params = ServerEngine(QdrantClient(":memory:"), "c")._collection_params(SPEC)
    dense = params["vectors_config"]["dense"]
    assert (dense.size, dense.distance.value) == (SPEC.dim, "Cosine")
    assert params["sparse_vectors_config"]["bm25"].modifier.value == "idf"
    assert params["metadata"]["dpr_spec"] == SPEC.to_json()


@pytest.mark.integration
def test_unreachable_server_is_a_transient_error() -> None:
    url = "http://127.0.0.1:1"
    store = Store(ServerEngine(QdrantClient(url=url, timeout=2, check_compatibility=False), "c", location=url))
    with pytest.raises(StoreUnavailable, match="unreachable"):
        store.count()
    with pytest.raises(StoreUnavailable):
        store.ensure_collection(SPEC)
