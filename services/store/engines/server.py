"""``ServerStore``: the scale-out adapter, over qdrant-client against a Qdrant server or cluster.

Generations are real collections named ``{alias}__g0001``, ``__g0002``, ...; the collection users see is a real
Qdrant alias, moved with one ``update_collection_aliases`` request (delete + create applied together, so readers
see the old or the new generation, never neither). Each generation's ``CollectionSpec`` lives in the
collection's ``metadata`` under ``"dpr_spec"``. Cluster options (shards, replication, write consistency,
on-disk vectors, HNSW m / ef_construct, int8 scalar quantization) come from ``settings.qdrant`` and are applied
when a generation is created.

The client is handed in, so tests pass ``QdrantClient(":memory:")`` (qdrant-client's in-process engine: same
API, exact search, payload indexes ignored, not thread-safe). Unreachable servers and timeouts raise
``StoreUnavailable`` (transient, retried); requests the server refuses raise ``ConfigError`` (permanent).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import httpx
from qdrant_client import QdrantClient, models
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from services.errors import ConfigError, DprError, StoreUnavailable
from services.settings import QdrantSettings
from services.store.common import (
    SPEC_METADATA_KEY,
    DocStateGroups,
    Scored,
    add_doc_state,
    check_compatible,
    check_dense_dim,
    doc_states_from,
    filter_clauses,
    generation_name,
    generation_number,
    linear_fusion,
    missing_collection,
    missing_generation,
    validate_request,
    validate_spec,
)
from services.store.points import (
    DENSE,
    INDEXED_KEYWORDS,
    SPARSE,
    CollectionInfo,
    CollectionSpec,
    DocState,
    GenerationInfo,
    Hit,
    Passage,
    PassagePoint,
    SearchRequest,
    SparseVector,
)

if TYPE_CHECKING:
    from services.settings import Settings

log = logging.getLogger(__name__)

_DISTANCES = {"cosine": models.Distance.COSINE, "dot": models.Distance.DOT, "euclid": models.Distance.EUCLID}
_STATE_FIELDS = ["doc_id", "doc_hash", "model", "ingested_at"]
_UPSERT_BATCH = 256
_SCAN_BATCH = 1024
_CREATE_ATTEMPTS = 5


def _is_grpc_unavailable(error: Exception) -> bool:
    try:
        import grpc
    except ImportError:  # pragma: no cover - grpcio ships with qdrant-client
        return False
    if not isinstance(error, grpc.RpcError):
        return False
    code = error.code() if callable(getattr(error, "code", None)) else None
    return code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED)


class ServerStore:
    """``VectorStore`` over Qdrant collections + an alias, through a ``QdrantClient`` it is handed."""

    backend = "server"

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

    @classmethod
    def from_settings(cls, settings: Settings) -> ServerStore:
        url = settings.qdrant_url or ":memory:"
        if url == ":memory:":
            client = QdrantClient(location=":memory:")
        else:
            key = settings.qdrant_api_key.get_secret_value() if settings.qdrant_api_key is not None else None
            client = QdrantClient(url=url, api_key=key, timeout=max(1, round(settings.qdrant.timeout)))
        return cls(client, settings.collection, settings.qdrant, owns_client=True, location=url)

    def __repr__(self) -> str:
        return f"ServerStore({self._location!r}, alias={self.alias!r})"

    # -- error translation ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _engine(self, what: str, collection: str | None = None) -> Iterator[None]:
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

    # -- resolution -----------------------------------------------------------------------------------------
    def _active(self) -> str | None:
        with self._engine("list aliases"):
            aliases = self.client.get_aliases().aliases
        return next((a.collection_name for a in aliases if a.alias_name == self.alias), None)

    def _generations(self) -> list[str]:
        with self._engine("list collections"):
            names = [c.name for c in self.client.get_collections().collections]
        numbered = sorted((n, name) for name in names if (n := generation_number(self.alias, name)) is not None)
        return [name for _, name in numbered]

    def _spec(self, name: str) -> CollectionSpec:
        if generation_number(self.alias, name) is None:  # only this alias's generations
            raise missing_generation(self.alias, name)
        with self._engine("read the collection", name):
            info = self.client.get_collection(name)
        data = (info.config.metadata or {}).get(SPEC_METADATA_KEY)
        if not isinstance(data, dict):
            raise ConfigError(
                f"collection {name!r} has no {SPEC_METADATA_KEY!r} metadata: it was not created by dpr-ingest; "
                "use another DPR_COLLECTION name"
            )
        return CollectionSpec.from_json(data)

    def _resolve(self, generation: str | None) -> tuple[str, CollectionSpec]:
        name = generation or self._active()
        if name is None:
            raise missing_collection(self.alias, self.backend)
        return name, self._spec(name)

    # -- collection and generations -------------------------------------------------------------------------
    def info(self) -> CollectionInfo:
        active = self._active()
        generations = []
        for name in self._generations():
            spec = self._spec(name)
            generations.append(GenerationInfo(name=name, spec=spec, count=self.count(name), active=name == active))
        active_info = next((g for g in generations if g.active), None)
        return CollectionInfo(alias=self.alias, backend=self.backend, active=active_info, generations=generations)

    def ensure_collection(self, spec: CollectionSpec) -> str:
        validate_spec(spec)
        active = self._active()
        if active is None:
            created = self.create_generation(spec)
            try:
                self._point_alias(created, previous=None)
            except DprError:
                # another process created the collection at the same moment: keep theirs
                active = self._active()
                if active is None or active == created:
                    raise
                self.drop_generation(created)
            else:
                log.info("created collection", extra={"alias": self.alias, "generation": created})
                return created
        check_compatible(self.alias, active, self._spec(active), spec)
        return active

    def create_generation(self, spec: CollectionSpec) -> str:
        validate_spec(spec)
        for _ in range(_CREATE_ATTEMPTS):
            numbers = [generation_number(self.alias, n) or 0 for n in self._generations()]
            name = generation_name(self.alias, max(numbers, default=0) + 1)
            try:
                with self._engine("create a collection"):
                    self.client.create_collection(name, **self._collection_params(spec))
            except ConfigError:
                if self._exists(name):  # lost a race for this number: take the next one
                    continue
                raise
            self._create_payload_indexes(name)
            log.info("created generation", extra={"alias": self.alias, "generation": name})
            return name
        raise StoreUnavailable(f"could not pick a free generation name for {self.alias!r}; retry")

    def _exists(self, name: str) -> bool:
        with self._engine("check a collection"):
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
                scalar=models.ScalarQuantizationConfig(type=models.ScalarType.INT8, always_ram=True)
            )
        return params

    def _create_payload_indexes(self, name: str) -> None:
        fields = [(key, models.PayloadSchemaType.KEYWORD) for key in INDEXED_KEYWORDS]
        fields.append(("chunk_index", models.PayloadSchemaType.INTEGER))
        with warnings.catch_warnings(), self._engine("create payload indexes", name):
            # the in-process engine warns that it ignores payload indexes; a server builds them
            warnings.filterwarnings("ignore", message="Payload indexes have no effect")
            for key, schema in fields:
                self.client.create_payload_index(name, field_name=key, field_schema=schema, wait=True)

    def _point_alias(self, generation: str, previous: str | None) -> None:
        ops: list[Any] = []
        if previous is not None:
            ops.append(models.DeleteAliasOperation(delete_alias=models.DeleteAlias(alias_name=self.alias)))
        ops.append(
            models.CreateAliasOperation(
                create_alias=models.CreateAlias(collection_name=generation, alias_name=self.alias)
            )
        )
        with self._engine("move the alias", generation):
            self.client.update_collection_aliases(change_aliases_operations=ops)

    def activate(self, generation: str) -> None:
        self._spec(generation)  # raises if it does not exist or is not ours
        previous = self._active()
        if previous == generation:
            return
        self._point_alias(generation, previous)
        log.info("activated generation", extra={"alias": self.alias, "generation": generation, "previous": previous})

    def drop_generation(self, generation: str) -> None:
        if generation == self._active():
            raise ConfigError(
                f"generation {generation!r} is the active generation of {self.alias!r}; activate another "
                "generation first"
            )
        if generation_number(self.alias, generation) is None or not self._exists(generation):
            raise missing_generation(self.alias, generation)
        with self._engine("delete a collection", generation):
            self.client.delete_collection(generation)
        log.info("dropped generation", extra={"alias": self.alias, "generation": generation})

    def update_settings(self, settings: dict[str, object], generation: str | None = None) -> None:
        name, spec = self._resolve(generation)
        merged = spec.to_json()
        merged["settings"] = {**spec.settings, **settings}
        with self._engine("update collection metadata", name):
            self.client.update_collection(name, metadata={SPEC_METADATA_KEY: merged})

    def optimize(self, generation: str | None = None) -> bool:
        """A server builds HNSW graphs in the background by itself: nothing to do but check the generation."""
        self._resolve(generation)
        return False

    # -- data -----------------------------------------------------------------------------------------------
    def upsert(self, points: Sequence[PassagePoint], generation: str | None = None) -> None:
        if not points:
            return
        name, spec = self._resolve(generation)
        structs = []
        for p in points:
            check_dense_dim(self.alias, name, spec, p.dense, f"passage {p.passage.doc_id}#{p.passage.chunk_index}")
            vector: dict[str, Any] = {DENSE: [float(x) for x in p.dense]}
            if spec.sparse and p.sparse is not None and p.sparse.indices:
                vector[SPARSE] = _sparse(p.sparse)
            structs.append(models.PointStruct(id=p.passage.id, vector=vector, payload=p.passage.to_payload()))
        with self._engine("upsert points", name):
            for start in range(0, len(structs), _UPSERT_BATCH):
                self.client.upsert(name, points=structs[start : start + _UPSERT_BATCH], wait=True)

    def doc_states(self, doc_ids: Iterable[str], generation: str | None = None) -> dict[str, DocState]:
        wanted = sorted(set(doc_ids))
        if not wanted:
            return {}
        name, _ = self._resolve(generation)
        groups: DocStateGroups = {}
        offset = None
        with self._engine("scroll points", name):
            while True:
                records, offset = self.client.scroll(
                    name,
                    scroll_filter=_doc_filter(wanted),
                    limit=_SCAN_BATCH,
                    offset=offset,
                    with_payload=_STATE_FIELDS,
                    with_vectors=False,
                )
                for r in records:
                    add_doc_state(groups, r.payload or {})
                if offset is None:
                    break
        return doc_states_from(groups)

    def delete_stale(self, doc_id: str, keep_doc_hash: str, keep_chunks: int, generation: str | None = None) -> None:
        if keep_chunks < 0:
            raise ConfigError(f"keep_chunks must be >= 0, got {keep_chunks}")
        name, _ = self._resolve(generation)
        stale = models.Filter(
            must=[models.FieldCondition(key="doc_id", match=models.MatchValue(value=doc_id))],
            should=[
                models.Filter(
                    must_not=[models.FieldCondition(key="doc_hash", match=models.MatchValue(value=keep_doc_hash))]
                ),
                models.FieldCondition(key="chunk_index", range=models.Range(gte=keep_chunks)),
            ],
        )
        with self._engine("delete stale points", name):
            self.client.delete(name, points_selector=models.FilterSelector(filter=stale), wait=True)

    def delete_documents(self, doc_ids: Iterable[str], generation: str | None = None) -> int:
        wanted = sorted(set(doc_ids))
        if not wanted:
            return 0
        name, _ = self._resolve(generation)
        flt = _doc_filter(wanted)
        with self._engine("delete documents", name):
            removed = self.client.count(name, count_filter=flt, exact=True).count
            if removed:
                self.client.delete(name, points_selector=models.FilterSelector(filter=flt), wait=True)
        return int(removed)

    def count(self, generation: str | None = None) -> int:
        name, _ = self._resolve(generation)
        with self._engine("count points", name):
            return int(self.client.count(name, exact=True).count)

    def ids(self, generation: str | None = None) -> set[str]:
        found: set[str] = set()
        for records in self._scan(_SCAN_BATCH, generation, with_payload=False):
            found.update(str(r.id) for r in records)
        return found

    def scroll(self, batch_size: int = 256, generation: str | None = None) -> Iterator[list[Passage]]:
        """Batches in point-id order, from the generation active when the scroll started."""
        if batch_size < 1:
            raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
        for records in self._scan(batch_size, generation, with_payload=True):
            yield [Passage.from_payload(r.payload or {}) for r in records]

    def _scan(self, batch_size: int, generation: str | None, with_payload: bool) -> Iterator[list[Any]]:
        name, _ = self._resolve(generation)  # pinned: a concurrent activate must not switch it mid-scan
        offset = None
        while True:
            with self._engine("scroll points", name):
                records, offset = self.client.scroll(
                    name, limit=batch_size, offset=offset, with_payload=with_payload, with_vectors=False
                )
            if records:
                yield records
            if offset is None:
                return

    def search(self, request: SearchRequest, generation: str | None = None) -> list[Hit]:
        name, spec = self._resolve(generation)
        validate_request(self.alias, name, spec, request)
        with self._engine("search", name):
            scored = self._search(name, spec, request)
        return [Hit(passage=Passage.from_payload(payload), score=score, id=pid) for pid, score, payload in scored]

    def _search(self, name: str, spec: CollectionSpec, request: SearchRequest) -> list[Scored]:
        flt = _server_filter(request.filters)
        branches: list[tuple[Any, str]] = []
        if request.mode in ("dense", "hybrid") and request.dense is not None:
            branches.append(([float(x) for x in request.dense], DENSE))
        if request.mode in ("sparse", "hybrid") and request.sparse is not None and request.sparse.indices:
            branches.append((_sparse(request.sparse), SPARSE))
        if not branches:  # a sparse query made only of stopwords
            return []

        if request.mode != "hybrid":
            query, using = branches[0]
            response = self.client.query_points(
                name, query=query, using=using, query_filter=flt, limit=request.k, with_payload=True
            )
            return _scored(response.points)

        depth = max(request.candidates, request.k)
        if request.fusion == "rrf":
            response = self.client.query_points(
                name,
                prefetch=[models.Prefetch(query=q, using=u, filter=flt, limit=depth) for q, u in branches],
                query=models.RrfQuery(rrf=models.Rrf(k=request.rrf_k)),
                limit=request.k,
                with_payload=True,
            )
            return _scored(response.points)
        responses = self.client.query_batch_points(
            name,
            requests=[
                models.QueryRequest(query=q, using=u, filter=flt, limit=depth, with_payload=True) for q, u in branches
            ],
        )
        dense_hits = _scored(responses[0].points)
        sparse_hits = _scored(responses[1].points) if len(responses) > 1 else []
        return linear_fusion(
            dense_hits, sparse_hits, request.linear_weight, request.k, dense_higher_is_better=spec.distance != "euclid"
        )

    def close(self) -> None:
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> ServerStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _sparse(vector: SparseVector) -> models.SparseVector:
    return models.SparseVector(indices=list(vector.indices), values=list(vector.values))


def _doc_filter(doc_ids: Sequence[str]) -> models.Filter:
    return models.Filter(must=[models.FieldCondition(key="doc_id", match=models.MatchAny(any=list(doc_ids)))])


def _server_filter(filters: dict[str, Any]) -> models.Filter | None:
    if not filters:
        return None
    conditions: list[Any] = []
    for clause in filter_clauses(filters):
        match: Any = (
            models.MatchAny(any=clause.any_values()) if clause.any_of else models.MatchValue(value=clause.values[0])
        )
        conditions.append(models.FieldCondition(key=clause.key, match=match))
    return models.Filter(must=conditions)


def _scored(points: Iterable[Any]) -> list[Scored]:
    return [(str(p.id), float(p.score), dict(p.payload or {})) for p in points]
