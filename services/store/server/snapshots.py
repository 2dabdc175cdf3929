"""Snapshots of a Qdrant server collection through Qdrant's own snapshot API (``services/ops/snapshots.py`` builds and
checks the archive around them). Only a real server has snapshots: qdrant-client's in-process engine has none.

Create (the active generation ``G``, consistent on the server):

1. ``client.list_snapshots(G)``: snapshots of ``G`` older than ``LEFTOVER_AGE`` are a killed create's leftovers
   (generation collections are dpr's own): ``client.delete_snapshot`` removes them;
2. ``client.create_snapshot(collection_name=G, wait=True)`` -> ``SnapshotDescription(name, size, checksum)``;
3. ``GET /collections/G/snapshots/NAME`` (the REST route qdrant-client has no method for; ``api-key`` header)
   streamed into ``collection.snapshot``, then checked against the description: its size and its sha256 (Qdrant's
   ``checksum``). A short or altered download is refused (``SnapshotError``), never archived;
4. ``client.delete_snapshot(collection_name=G, snapshot_name=NAME, wait=True)``, whatever happened;
5. ``server.json`` beside it: the snapshot's name, size, sha256 and the point count.

Restore (into a server without the collection): ``POST /collections/G/snapshots/upload?wait=true&priority=snapshot
&checksum=SHA256`` (multipart field ``snapshot``: Qdrant checks the checksum itself before recovering), then the
recovered ``G`` must carry a dpr spec and the recorded point count, else it is dropped and the restore refused;
only then does the alias move to it.

In a multi-node cluster a collection snapshot holds the shards of the node that answered: snapshot each node
with Qdrant's own tools there.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import httpx

from services.core.errors import SnapshotError, StoreUnavailable
from services.core.fsutil import json_or_empty, sha256_of
from services.store.common import missing_generation
from services.store.points import CollectionSpec

if TYPE_CHECKING:
    from services.store.server.engine import ServerEngine

log = logging.getLogger(__name__)

SNAPSHOT_FILE = "collection.snapshot"
RECORD_FILE = "server.json"
LEFTOVER_AGE = timedelta(hours=1)
_BLOCK = 1 << 20


def http_for(engine: ServerEngine) -> httpx.Client:
    """The engine's HTTP client for the snapshot file routes (handed in by tests; else one for its URL)."""
    if engine.http is not None:
        return engine.http
    location = engine.location
    if not location.startswith(("http://", "https://")):
        raise SnapshotError(
            f"snapshots of a server collection need a Qdrant server (DPR_QDRANT_URL=http://host:6333); {location!r} "
            "is qdrant-client's in-process engine"
        )
    headers = {"api-key": engine.api_key} if engine.api_key else {}
    engine.http = httpx.Client(base_url=location.rstrip("/"), headers=headers,
                               timeout=httpx.Timeout(max(engine.options.timeout, 600.0), connect=10.0))
    return engine.http


def snapshot_generation(engine: ServerEngine, dest: Path) -> tuple[str, CollectionSpec, int]:
    """Snapshot the active generation on the server, download and check it into ``dest``, delete it there.
    Returns the generation's name, spec and point count."""
    http = http_for(engine)
    generation = engine.read_pointer()
    if generation is None:
        raise missing_generation(engine.alias, engine.alias)
    spec = engine.read_spec(generation)
    points = engine.count(generation)
    _sweep_leftovers(engine, generation)
    with engine.guard("snapshot the collection", generation):
        described = engine.client.create_snapshot(collection_name=generation, wait=True)
    if described is None:
        raise StoreUnavailable(f"{engine.location} did not describe the snapshot of {generation}; retry later")
    dest.mkdir(parents=True, exist_ok=True)
    try:
        digest, size = _download(engine, http, generation, described.name, dest / SNAPSHOT_FILE)
    finally:
        with contextlib.suppress(Exception), engine.guard("delete the server snapshot", generation):
            engine.client.delete_snapshot(collection_name=generation, snapshot_name=described.name, wait=True)
    if size != described.size or (described.checksum and digest != described.checksum):
        raise SnapshotError(
            f"the download of {engine.location}'s snapshot {described.name} is corrupt ({size} bytes, sha256 "
            f"{digest[:16]}...; the server said {described.size} bytes, {str(described.checksum)[:16]}...): nothing "
            "was archived; take the snapshot again"
        )
    (dest / "spec.json").write_text(json.dumps(spec.to_json(), indent=2, sort_keys=True), encoding="utf-8")
    record = {"snapshot": described.name, "size": size, "sha256": digest, "points": points}
    (dest / RECORD_FILE).write_text(json.dumps(record, indent=2, sort_keys=True), encoding="utf-8")
    return generation, spec, points


def _download(engine: ServerEngine, http: httpx.Client, generation: str, name: str, path: Path) -> tuple[str, int]:
    sha = hashlib.sha256()
    size = 0
    route = f"/collections/{quote(generation)}/snapshots/{quote(name)}"
    with engine.guard("download the snapshot", generation), http.stream("GET", route) as response:
        if response.is_error:
            response.read()
            _refused(engine, response, f"download snapshot {name} of {generation}")
        with open(path, "wb") as out:
            for block in response.iter_bytes(_BLOCK):
                sha.update(block)
                size += len(block)
                out.write(block)
    return sha.hexdigest(), size


def _sweep_leftovers(engine: ServerEngine, generation: str) -> None:
    """Delete snapshots of ``generation`` older than ``LEFTOVER_AGE`` (a create killed before its delete); a
    younger one may be another process's create in progress."""
    with engine.guard("list the server's snapshots", generation):
        described = engine.client.list_snapshots(generation)
    cutoff = datetime.now(UTC) - LEFTOVER_AGE
    for snapshot in described:
        try:
            made = datetime.fromisoformat(str(snapshot.creation_time))
        except ValueError:
            continue
        if (made if made.tzinfo else made.replace(tzinfo=UTC)) < cutoff:
            log.info("deleting a leftover server snapshot", extra={"generation": generation, "snapshot": snapshot.name})
            with contextlib.suppress(Exception), engine.guard("delete a leftover snapshot", generation):
                engine.client.delete_snapshot(collection_name=generation, snapshot_name=snapshot.name, wait=True)


def restore_generation(engine: ServerEngine, source: Path, generation: str) -> None:
    """Upload ``source/collection.snapshot`` as collection ``generation``, check it, and point the alias at it
    (refused when the alias or ``generation`` exists: restore into a server without them)."""
    http = http_for(engine)
    if engine.read_pointer() is not None or engine.exists(generation):
        raise SnapshotError(
            f"collection {engine.alias!r} (or {generation!r}) already exists on {engine.location}; restore into a "
            "server without it, or delete it first"
        )
    record = json_or_empty(source / RECORD_FILE)  # {}: a snapshot made before the record (sha256 computed here)
    path = source / SNAPSHOT_FILE
    sha = record.get("sha256") or sha256_of(path)
    route = f"/collections/{quote(generation)}/snapshots/upload"
    with engine.guard("upload the snapshot", generation), open(path, "rb") as f:
        response = http.post(route, params={"wait": "true", "priority": "snapshot", "checksum": sha},
                             files={"snapshot": (SNAPSHOT_FILE, f, "application/octet-stream")})
    if response.is_error:
        _refused(engine, response, f"recover {generation} from the uploaded snapshot")
    try:
        engine.read_spec(generation)  # a collection dpr made (its spec in the metadata)
        points = engine.count(generation)
        if "points" in record and points != int(record["points"]):
            raise SnapshotError(
                f"{engine.location} recovered {points} points from the snapshot of {generation}, the snapshot "
                f"holds {record['points']}: the restore was undone; use another snapshot"
            )
    except BaseException:
        with contextlib.suppress(Exception):
            engine.drop(generation)
        raise
    engine.write_pointer(generation, None)


def _refused(engine: ServerEngine, response: httpx.Response, what: str) -> None:
    """An HTTP error of a snapshot route as the store's errors: a busy or failing server is transient, a refusal
    (a checksum mismatch, a missing snapshot) is permanent and names the server's reason."""
    try:
        detail = str(response.json().get("status", {}).get("error") or response.text)
    except (ValueError, AttributeError):
        detail = response.text
    message = f"{engine.location} could not {what} (HTTP {response.status_code}: {detail[:300]})"
    if response.status_code >= 500 or response.status_code in (408, 429):
        raise StoreUnavailable(message + "; retry later")
    raise SnapshotError(message)


