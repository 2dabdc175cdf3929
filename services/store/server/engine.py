"""``ServerEngine``: the scale-out engine, qdrant-client against a Qdrant server or cluster, under the store front end.

Generations are real collections named ``{alias}__g0001``, ``__g0002``, ...; the collection users see is a real
Qdrant alias, moved with one ``update_collection_aliases`` request (delete + create applied together, so readers
see the old or the new generation, never neither). Each generation's ``CollectionSpec`` lives in the
collection's ``metadata`` under ``"dpr_spec"``. Cluster options (shards, replication, write consistency,
on-disk vectors, HNSW m / ef_construct, int8 scalar quantization) come from ``settings.qdrant`` and are applied
when a generation is created. ``version()`` is the alias's target (one small request), so the front end's
cached ``active()`` follows another process's swap at once.

The client is handed in, so tests pass ``QdrantClient(":memory:")`` (qdrant-client's in-process engine: same
API, exact search, payload indexes ignored, not thread-safe). Unreachable servers and timeouts raise
``StoreUnavailable`` (transient, retried); requests the server refuses raise ``ConfigError`` (permanent).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Hashable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import httpx
from qdrant_client import QdrantClient, models
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from services.core.errors import ConfigError, DprError, StoreUnavailable
from services.core.store_settings import QdrantSettings
from services.store.common import (
    SPEC_METADATA_KEY,
    Scored,
    Where,
    generation_number,
    missing_generation,
    scored,
)
from services.store.points import (
    DENSE,
    INDEXED_INTEGERS,
    INDEXED_KEYWORDS,
    SPARSE,
    CollectionSpec,
    SparseVector,
    point_records,
)
from services.store.protocol import Branch, PointRecord, Record, Vector
from services.store.server.calibration import Calibrations, ef_params
from services.store.server.convert import to_filter, to_vector, to_where

if TYPE_CHECKING:
    from services.core.settings import Settings

log = logging.getLogger(__name__)

_DISTANCES = {"cosine": models.Distance.COSINE, "dot": models.Distance.DOT, "euclid": models.Distance.EUCLID}


def _is_grpc_unavailable(error: Exception) -> bool:
    try:
        import grpc
    except ImportError:  # pragma: no cover - grpcio ships with qdrant-client
        return False
    if not isinstance(error, grpc.RpcError):
        return False
    code = error.code() if callable(getattr(error, "code", None)) else None
    return code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED)


class ServerEngine:
    """``Engine`` over Qdrant collections + an alias, through a ``QdrantClient`` it is handed."""

    backend = "server"
    upsert_batch = 256

    def __init__(
        self,
        client: QdrantClient,
        alias: str,
        options: QdrantSettings | None = None,
        *,
        owns_client: bool = False,
        location: str = "",
    ) -> None:
        self.client = client
        self.alias = alias
        self.options = options or QdrantSettings()
        self._owns_client = owns_client
        self._location = location or "the Qdrant server"
        self.api_key: str | None = None  # for the snapshot download/upload (plain HTTP beside the client)
        self.http: httpx.Client | None = None  # that HTTP client (server_snapshots.http_for builds it; tests hand one)
        self.calibrations = Calibrations(client, self.options, self.guard)

    @classmethod
    def from_settings(cls, settings: Settings) -> ServerEngine:
        url = settings.qdrant_url or ":memory:"
        if url == ":memory:":
            client = QdrantClient(location=":memory:")
        else:
            key = settings.qdrant_api_key.get_secret_value() if settings.qdrant_api_key is not None else None
            client = QdrantClient(url=url, api_key=key, timeout=max(1, round(settings.qdrant.timeout)))
        engine = cls(client, settings.collection, settings.qdrant, owns_client=True, location=url)
        engine.api_key = settings.qdrant_api_key.get_secret_value() if settings.qdrant_api_key is not None else None
        return engine

    def __repr__(self) -> str:
        return f"ServerEngine({self._location!r}, alias={self.alias!r})"

    def session(self, create: bool = False) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()  # the server serialises concurrent requests itself

    # -- error translation ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def guard(self, what: str, collection: str | None = None) -> Iterator[None]:
        """Errors of a request inside, as the store's (``StoreUnavailable``, ``ConfigError``, missing generation)."""
        try:
            yield
        except DprError:
            raise
        except UnexpectedResponse as e:
            detail = e.content.decode("utf-8", "replace")[:300] if e.content else e.reason_phrase
            if e.status_code == 404 and collection is not None:
                raise missing_generation(self.alias, collection) from e
            if e.status_code is None or e.status_code >= 500 or e.status_code in (408, 429):
                raise StoreUnavailable(
                    f"{self._location} failed to {what} (HTTP {e.status_code}: {detail}); retry later"
                ) from e
            raise ConfigError(f"{self._location} refused to {what} (HTTP {e.status_code}: {detail})") from e
        except (ResponseHandlingException, httpx.TransportError, ConnectionError, TimeoutError) as e:
            raise StoreUnavailable(
                f"{self._location} is unreachable ({what}): {e}; check DPR_QDRANT_URL and that the server is up"
            ) from e
        except ValueError as e:  # the in-process engine reports bad requests and missing collections this way
            if collection is not None and "not found" in str(e).lower():
                raise missing_generation(self.alias, collection) from e
            raise ConfigError(f"Qdrant refused to {what}: {e}") from e
        except Exception as e:
            if _is_grpc_unavailable(e):
                raise StoreUnavailable(f"{self._location} is unreachable ({what}): {e}") from e
            raise

    @property
    def location(self) -> str:
        return self._location

    # -- pointer and generations ---------------------------------------------------------------------------
    def version(self) -> Hashable:
        return self.read_pointer()

    def read_pointer(self) -> str | None:
        with self.guard("list aliases"):
            aliases = self.client.get_aliases().aliases
        return next((a.collection_name for a in aliases if a.alias_name == self.alias), None)

    def write_pointer(self, generation: str, previous: str | None) -> None:
        ops: list[Any] = []
        if previous is not None:
            ops.append(models.DeleteAliasOperation(delete_alias=models.DeleteAlias(alias_name=self.alias)))
        ops.append(
            models.CreateAliasOperation(
                create_alias=models.CreateAlias(collection_name=generation, alias_name=self.alias)
            )
        )
        with self.guard("move the alias", generation):
            self.client.update_collection_aliases(change_aliases_operations=ops)

    def generations(self) -> list[str]:
        with self.guard("list collections"):
            names = [c.name for c in self.client.get_collections().collections]
        return [name for name in names if generation_number(self.alias, name) is not None]

    def read_spec(self, generation: str) -> CollectionSpec:
        with self.guard("read the collection", generation):
            info = self.client.get_collection(generation)
        data = (info.config.metadata or {}).get(SPEC_METADATA_KEY)
        if not isinstance(data, dict):
            raise ConfigError(
                f"collection {generation!r} has no {SPEC_METADATA_KEY!r} metadata: it was not created by dpr-ingest; "
                "use another DPR_COLLECTION name"
            )
        return CollectionSpec.from_json(data)

    def write_spec(self, generation: str, spec: CollectionSpec) -> None:
        with self.guard("update collection metadata", generation):
            self.client.update_collection(generation, metadata={SPEC_METADATA_KEY: spec.to_json()})

    def create(self, generation: str, spec: CollectionSpec) -> bool:
        try:
            with self.guard("create a collection"):
                self.client.create_collection(generation, **self._collection_params(spec))
        except ConfigError:
            if self.exists(generation):  # lost a race for this number: the caller takes the next one
                return False
            raise
        self._create_payload_indexes(generation)
        return True

    def drop(self, generation: str) -> bool:
        if not self.exists(generation):
            return False
        with self.guard("delete a collection", generation):
            self.client.delete_collection(generation)
        return True

    def optimize(self, generation: str) -> bool:
        """A server builds HNSW graphs in the background by itself: check the generation and, once the server has
        indexed its vectors, calibrate the search ef on them (``services.store.calibrate``; kept in the collection's
        metadata, sent as ``hnsw_ef`` by queries that name none)."""
        spec = self.read_spec(generation)
        if self.options.recall_target > 0 and self.calibrations.indexed(generation)[1]:
            self.calibrations.measure(generation, spec)
        return False

    def needs_index(self, generation: str, points: int | None = None) -> bool:
        """The server indexes in the background; a generation whose indexed vectors were never calibrated, or grew
        10x since, is due for a calibration."""
        return self.calibrations.due(generation)

    def search_ef(self, generation: str) -> dict[str, Any]:
        """What `dpr status` says of the generation's search ef (``calibrate.describe``)."""
        return self.calibrations.describe(generation)

    def memory(self, generation: str) -> dict[str, Any] | None:
        return None  # a server's levers are DPR_QDRANT__ settings, applied when a generation is created

    def index_info(self, generation: str) -> dict[str, Any]:
        with self.guard("read the collection", generation):
            info = self.client.get_collection(generation)
        return {
            "points": info.points_count or 0,
            "segments": info.segments_count,
            "indexed_vectors": info.indexed_vectors_count or 0,
        }

    def exists(self, name: str) -> bool:
        with self.guard("check a collection"):
            return bool(self.client.collection_exists(name))

    def _collection_params(self, spec: CollectionSpec) -> dict[str, Any]:
        o = self.options
        params: dict[str, Any] = {
            "vectors_config": {
                DENSE: models.VectorParams(
                    size=spec.dim, distance=_DISTANCES[spec.distance], on_disk=o.on_disk_vectors or None
                )
            },
            "metadata": {SPEC_METADATA_KEY: spec.to_json()},
        }
        if spec.sparse:
            params["sparse_vectors_config"] = {SPARSE: models.SparseVectorParams(modifier=models.Modifier.IDF)}
        for key in ("shard_number", "replication_factor", "write_consistency_factor"):
            if getattr(o, key) is not None:
                params[key] = getattr(o, key)
        if o.hnsw_m is not None or o.hnsw_ef_construct is not None:
            params["hnsw_config"] = models.HnswConfigDiff(m=o.hnsw_m, ef_construct=o.hnsw_ef_construct)
        if o.quantization == "int8":
            params["quantization_config"] = models.ScalarQuantization(
                scalar=models.ScalarQuantizationConfig(type=models.ScalarType.INT8, quantile=0.99, always_ram=True)
            )
        if o.on_disk_payload:
            params["on_disk_payload"] = True
        return params

    def _search_params(self, vector: Vector, fused: bool = False, generation: str | None = None
                       ) -> models.SearchParams | None:
        """Dense search params from ``settings.qdrant`` (HNSW ef, or ``hybrid_ef`` for the dense branch of a hybrid
        query when ``fused``; int8 rescore / oversampling), else the ef ``generation``'s calibration found; None
        when no search lever is set (the server's defaults) and for the sparse branch."""
        o = self.options
        ef = o.search_ef(fused)
        if ef is None and generation is not None and o.recall_target > 0 and not isinstance(vector, SparseVector):
            cal, key = self.calibrations.current(generation), "fused_" if fused else ""
            if cal.get(f"{key}exact"):  # the scan was faster than the graph at the ef the target needs
                return models.SearchParams(exact=True, quantization=ef_params(o, 1).quantization)
            ef = cal.get(f"{key}ef")
        unset = ef is None and o.oversampling is None and o.quantization == "none"
        if unset or isinstance(vector, SparseVector):
            return None
        quantization = None
        if o.quantization != "none" or o.oversampling is not None:
            quantization = models.QuantizationSearchParams(rescore=o.rescore, oversampling=o.oversampling)
        return models.SearchParams(hnsw_ef=ef, quantization=quantization)

    def _create_payload_indexes(self, name: str) -> None:
        fields = [(key, models.PayloadSchemaType.KEYWORD) for key in INDEXED_KEYWORDS]
        fields += [(key, models.PayloadSchemaType.INTEGER) for key in INDEXED_INTEGERS]  # chunk_index, page, page_end
        with warnings.catch_warnings(), self.guard("create payload indexes", name):
            # the in-process engine warns that it ignores payload indexes; a server builds them
            warnings.filterwarnings("ignore", message="Payload indexes have no effect")
            for key, schema in fields:
                self.client.create_payload_index(name, field_name=key, field_schema=schema, wait=True)

    # -- points ----------------------------------------------------------------------------------------------
    def upsert(self, generation: str, points: Sequence[PointRecord]) -> None:
        structs = [
            models.PointStruct(id=pid, vector={n: to_vector(v) for n, v in vectors.items()}, payload=payload)
            for pid, vectors, payload in points
        ]
        with self.guard("upsert points", generation):
            self.client.upsert(generation, points=structs, wait=True)

    def delete(self, generation: str, where: Where) -> None:
        with self.guard("delete points", generation):
            self.client.delete(generation, points_selector=models.FilterSelector(filter=to_where(where)), wait=True)

    def count(self, generation: str, where: Where | None = None) -> int:
        with self.guard("count points", generation):
            return int(self.client.count(generation, count_filter=to_filter(where), exact=True).count)

    def count_if_free(self, generation: str) -> int | None:
        return self.count(generation)  # the server serves readers beside writers: never busy

    def scroll(
        self, generation: str, limit: int, offset: Any, where: Where | None = None, fields: Sequence[str] | bool = True
    ) -> tuple[list[Record], Any]:
        with self.guard("scroll points", generation):
            records, offset = self.client.scroll(
                generation,
                scroll_filter=to_filter(where),
                limit=limit,
                offset=offset,
                with_payload=fields if isinstance(fields, bool) else list(fields),
                with_vectors=False,
            )
        return [(str(r.id), dict(r.payload or {})) for r in records], offset

    def query(self, generation: str, branch: Branch, limit: int, where: Where | None) -> list[Scored]:
        using, vector = branch
        with self.guard("search", generation):
            response = self.client.query_points(
                generation,
                query=to_vector(vector),
                using=using,
                query_filter=to_filter(where),
                search_params=self._search_params(vector, generation=generation),
                limit=limit,
                with_payload=True,
            )
        return scored(response.points)

    def query_batch(
        self, generation: str, branches: Sequence[Branch], limit: int, where: Where | None, with_payload: bool = True
    ) -> list[list[Scored]]:
        flt = to_filter(where)
        requests = [
            models.QueryRequest(query=to_vector(v), using=u, filter=flt, limit=limit, with_payload=with_payload,
                                params=self._search_params(v, fused=True, generation=generation))
            for u, v in branches
        ]
        with self.guard("search", generation):
            responses = self.client.query_batch_points(generation, requests=requests)
        return [scored(r.points) for r in responses]

    def payloads(self, generation: str, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        with self.guard("retrieve points", generation):
            records = self.client.retrieve(generation, ids=list(ids), with_payload=True, with_vectors=False)
        return {str(r.id): dict(r.payload or {}) for r in records}

    def points(self, generation: str, ids: Sequence[str]) -> list[PointRecord]:
        """Whole points (named vectors and payload) for the ``ids`` that exist (BM25 re-weighting reads them)."""
        with self.guard("retrieve points", generation):
            records = self.client.retrieve(generation, ids=list(ids), with_payload=True, with_vectors=True)
        return point_records(records)

    def query_rrf(
        self, generation: str, branches: Sequence[Branch], limit: int, depth: int, rrf_k: int, where: Where | None
    ) -> list[Scored]:
        flt = to_filter(where)
        with self.guard("search", generation):
            response = self.client.query_points(
                generation,
                prefetch=[models.Prefetch(query=to_vector(v), using=u, filter=flt, limit=depth,
                                          params=self._search_params(v, fused=True, generation=generation))
                          for u, v in branches],
                query=models.RrfQuery(rrf=models.Rrf(k=rrf_k)),
                limit=limit,
                with_payload=True,
            )
        return scored(response.points)

    def close(self) -> None:
        if self._owns_client:
            self.client.close()
        if self.http is not None and self._owns_client:
            self.http.close()
