"""A Qdrant "server" for unit tests of the server engine's snapshots: qdrant-client's in-process engine for the data
(``QdrantClient(":memory:")``, every call passed through) plus what it lacks, Qdrant's collection snapshot API, with
the signatures qdrant-client 1.x documents and the objects a server returns:

- ``create_snapshot(collection_name, wait=True)`` -> ``models.SnapshotDescription(name, creation_time, size,
  checksum)`` (checksum: the file's sha256, as Qdrant computes it);
- ``list_snapshots(collection_name)`` -> ``list[SnapshotDescription]``;
- ``delete_snapshot(collection_name, snapshot_name, wait=True)`` -> True;
- the two REST routes qdrant-client has no method for, served through ``http()`` (an ``httpx.Client`` on an
  ``httpx.MockTransport``: no socket): ``GET /collections/C/snapshots/NAME`` (the file) and ``POST
  /collections/C/snapshots/upload?wait=&priority=&checksum=`` (multipart field ``snapshot``; a checksum that does
  not match is refused with 400, as Qdrant does; an unknown route 404).

A snapshot file here is the collection's config and points as JSON (a real one is a tar of segments): what matters
to the code under test is that it is opaque bytes with a size and a sha256. ``calls`` records every snapshot call
and request in order. Knobs: ``corrupt_downloads`` (the GET serves a flipped byte), ``lose_on_recover`` (a
recovery that comes back with that many points fewer).
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from qdrant_client import QdrantClient, models

BASE_URL = "http://qdrant.test:6333"


class SnapshottingQdrant:
    def __init__(self) -> None:
        self.inner = QdrantClient(location=":memory:")
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.files: dict[str, dict[str, tuple[bytes, models.SnapshotDescription]]] = {}
        self.corrupt_downloads = False
        self.lose_on_recover = 0
        self._n = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    # -- the snapshot API (qdrant_client.QdrantClient's signatures) -------------------------------------------
    def create_snapshot(self, collection_name: str, wait: bool = True, **kwargs: Any) -> models.SnapshotDescription:
        self.calls.append(("create_snapshot", {"collection_name": collection_name, "wait": wait, **kwargs}))
        data = self._dump(collection_name)
        self._n += 1
        made = datetime.now(UTC).replace(microsecond=0, tzinfo=None)
        name = f"{collection_name}-{self._n}-{made.strftime('%Y-%m-%d-%H-%M-%S')}.snapshot"
        return self.add_file(collection_name, name, data, made)

    def list_snapshots(self, collection_name: str, **kwargs: Any) -> list[models.SnapshotDescription]:
        self.calls.append(("list_snapshots", {"collection_name": collection_name}))
        return [described for _, described in self.files.get(collection_name, {}).values()]

    def delete_snapshot(self, collection_name: str, snapshot_name: str, wait: bool = True, **kwargs: Any) -> bool:
        self.calls.append(("delete_snapshot", {"collection_name": collection_name, "snapshot_name": snapshot_name,
                                               "wait": wait}))
        if self.files.get(collection_name, {}).pop(snapshot_name, None) is None:
            raise ValueError(f"Snapshot {snapshot_name} not found")
        return True

    def add_file(self, collection: str, name: str, data: bytes, made: datetime | None = None
                 ) -> models.SnapshotDescription:
        """A snapshot file on the "server" (``made``: its creation time, naive UTC as Qdrant reports it)."""
        made = made or datetime.now(UTC).replace(tzinfo=None) - timedelta(hours=2)
        described = models.SnapshotDescription(name=name, creation_time=made.isoformat(), size=len(data),
                                               checksum=hashlib.sha256(data).hexdigest())
        self.files.setdefault(collection, {})[name] = (data, described)
        return described

    # -- the REST routes ---------------------------------------------------------------------------------------
    def http(self) -> httpx.Client:
        return httpx.Client(base_url=BASE_URL, transport=httpx.MockTransport(self._route))

    def _route(self, request: httpx.Request) -> httpx.Response:
        parts = request.url.path.strip("/").split("/")
        self.calls.append((f"{request.method} {request.url.path}", dict(request.url.params)))
        if request.method == "GET" and len(parts) == 4 and parts[0] == "collections" and parts[2] == "snapshots":
            found = self.files.get(parts[1], {}).get(parts[3])
            if found is None:
                return httpx.Response(404, json={"status": {"error": "Snapshot not found"}})
            data = found[0]
            if self.corrupt_downloads:
                data = data[:100] + bytes([data[100] ^ 1]) + data[101:]
            return httpx.Response(200, content=data)
        if request.method == "POST" and parts[2:] == ["snapshots", "upload"] and parts[0] == "collections":
            data = _multipart_file(request, "snapshot")
            checksum = request.url.params.get("checksum")
            if checksum and hashlib.sha256(data).hexdigest() != checksum:
                return httpx.Response(400, json={"status": {"error": "Bad request: Snapshot checksum mismatch"}})
            self._load(parts[1], data)
            return httpx.Response(200, json={"result": True, "status": "ok", "time": 0.01})
        return httpx.Response(404, json={"status": {"error": "Not found"}})

    # -- a collection as bytes and back ------------------------------------------------------------------------
    def _dump(self, collection: str) -> bytes:
        info = self.inner.get_collection(collection)
        params = info.config.params
        vectors = params.vectors if isinstance(params.vectors, dict) else {}
        points: list[dict[str, Any]] = []
        offset = None
        while True:
            records, offset = self.inner.scroll(collection, limit=256, offset=offset, with_payload=True,
                                                with_vectors=True)
            for r in records:
                named = r.vector if isinstance(r.vector, dict) else {}
                points.append({"id": str(r.id), "payload": r.payload, "vector": {
                    n: v.model_dump(mode="json") if isinstance(v, models.SparseVector) else list(v)  # type: ignore[arg-type]
                    for n, v in named.items()}})
            if offset is None:
                break
        return json.dumps({
            "vectors": {k: v.model_dump(mode="json") for k, v in vectors.items()},
            "sparse": {k: v.model_dump(mode="json") for k, v in (params.sparse_vectors or {}).items()},
            "metadata": info.config.metadata, "points": points,
        }, sort_keys=True).encode("utf-8")

    def _load(self, collection: str, data: bytes) -> None:
        d = json.loads(data)
        self.inner.create_collection(
            collection,
            vectors_config={k: models.VectorParams(**v) for k, v in d["vectors"].items()},
            sparse_vectors_config={k: models.SparseVectorParams(**v) for k, v in d["sparse"].items()} or None,
            metadata=d["metadata"],
        )
        points = d["points"][: len(d["points"]) - self.lose_on_recover]
        if points:
            self.inner.upsert(collection, wait=True, points=[
                models.PointStruct(id=p["id"], payload=p["payload"], vector={
                    n: models.SparseVector(**v) if isinstance(v, dict) else v for n, v in p["vector"].items()})
                for p in points])


def _multipart_file(request: httpx.Request, field: str) -> bytes:
    """The bytes of the file field ``field`` of a multipart/form-data request."""
    boundary = request.headers["content-type"].split("boundary=", 1)[1].encode()
    for part in request.read().split(b"--" + boundary):
        head, _, body = part.partition(b"\r\n\r\n")
        if f'name="{field}"'.encode() in head:
            return body[:-2] if body.endswith(b"\r\n") else body
    raise AssertionError(f"no {field!r} field in the upload")
