"""The server engine's snapshots against a Qdrant that records the calls (``kit.fake_qdrant``: qdrant-client's
in-process engine for the data, Qdrant's snapshot API and its two REST routes on an httpx MockTransport).

Checked: the calls and their arguments as qdrant-client documents them (list_snapshots, create_snapshot(wait=True),
GET the file, delete_snapshot(wait=True) whatever happens; upload with wait, priority=snapshot and the checksum);
a restore into a fresh server answers every question as before; a download that does not match the server's
size / sha256, an archive with a flipped byte, a checksum the server refuses and a recovery that comes back short
are each refused and leave nothing behind (no archive, no collection, no alias, no snapshot on the server).
The same against a real server: tests/integration/test_server_snapshots_live.py (QDRANT_URL)."""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kit.fake_qdrant import BASE_URL, SnapshottingQdrant
from kit.fakes import FakeRuntime, HashTowers, ingest_items
from kit.policy import make_settings

from services.core.errors import SnapshotError
from services.ops.snapshots import create_snapshot, read_manifest, restore_snapshot
from services.query import QueryOptions
from services.readers import Document
from services.store import Store
from services.store.server import snapshots as server_snapshots
from services.store.server.engine import ServerEngine

pytestmark = pytest.mark.unit

TOWERS = HashTowers(dim=16, name="hash-snap")
TEXTS = ["rivers carry sediment to the sea", "cells divide by mitosis", "glaciers carve valleys in rock",
         "enzymes speed up reactions in cells", "the sea level rises as ice melts", "mitochondria make ATP"]
QUESTIONS = ["what do rivers carry", "how do cells divide", "what melts ice"]


def _engine(fake: SnapshottingQdrant) -> ServerEngine:
    engine = ServerEngine(fake, "passages", location=BASE_URL)  # type: ignore[arg-type]
    engine.http = fake.http()
    return engine


@pytest.fixture
def source() -> Iterator[tuple[FakeRuntime, SnapshottingQdrant]]:
    fake = SnapshottingQdrant()
    runtime = FakeRuntime(towers=TOWERS, store=Store(_engine(fake)))
    ingest_items(runtime.pipeline, [Document(doc_id=f"d{i}", text=t) for i, t in enumerate(TEXTS)])
    yield runtime, fake
    runtime.close()


def _answers(runtime: FakeRuntime) -> dict[str, Any]:
    out = {}
    for mode in ("dense", "sparse", "hybrid"):
        for q in QUESTIONS:
            hits = runtime.search(q, QueryOptions(k=3, mode=mode))  # type: ignore[arg-type]
            out[f"{mode}:{q}"] = [(h.passage.doc_id, h.passage.chunk_index, round(h.score, 6)) for h in hits]
    return out


def _names(fake: SnapshottingQdrant) -> list[str]:
    return [name for name, _ in fake.calls]


def test_create_then_restore_into_a_fresh_server_answers_as_before(
    source: tuple[FakeRuntime, SnapshottingQdrant], tmp_path: Path
) -> None:
    runtime, fake = source
    before = _answers(runtime)
    generation = runtime.store.info().active.name  # type: ignore[union-attr]
    made = create_snapshot(runtime.settings, runtime.store.engine, tmp_path / "snaps")  # type: ignore[attr-defined]

    described = next(args for name, args in fake.calls if name == "create_snapshot")
    assert described == {"collection_name": generation, "wait": True}
    snapshot_name = next(args for name, args in fake.calls if name == "delete_snapshot")["snapshot_name"]
    assert _names(fake) == ["list_snapshots", "create_snapshot",
                            f"GET /collections/{generation}/snapshots/{snapshot_name}", "delete_snapshot"]
    assert fake.files[generation] == {}  # nothing left on the server
    manifest = read_manifest(Path(made["snapshot"]))
    assert manifest["backend"] == "server" and manifest["points"] == made["points"] == runtime.store.count()
    files = {f["path"] for f in manifest["files"]}
    assert files == {"data/collection.snapshot", "data/spec.json", "data/server.json"}
    with tarfile.open(made["snapshot"]) as tar:
        member = tar.extractfile("data/server.json")
        assert member is not None
        record = json.loads(member.read())
    assert record["snapshot"] == snapshot_name and record["points"] == made["points"]

    fresh = SnapshottingQdrant()
    target = _engine(fresh)
    restored = restore_snapshot(Path(made["snapshot"]), make_settings(data_dir=tmp_path / "new", qdrant_url=BASE_URL),
                                engine_for=lambda settings: target)
    assert restored["generation"] == generation and restored["points"] == made["points"]
    [(upload, params)] = [(n, a) for n, a in fresh.calls if n.startswith("POST")]
    assert upload == f"POST /collections/{generation}/snapshots/upload"
    assert params == {"wait": "true", "priority": "snapshot", "checksum": record["sha256"]}
    again = FakeRuntime(towers=TOWERS, store=Store(_engine(fresh)))
    try:
        assert again.store.info().active.name == generation  # type: ignore[union-attr]  # the alias moved
        assert _answers(again) == before
    finally:
        again.close()


def test_a_download_that_does_not_match_the_server_description_is_refused(
    source: tuple[FakeRuntime, SnapshottingQdrant], tmp_path: Path
) -> None:
    runtime, fake = source
    fake.corrupt_downloads = True
    with pytest.raises(SnapshotError, match="is corrupt"):
        create_snapshot(runtime.settings, runtime.store.engine, tmp_path / "snaps")  # type: ignore[attr-defined]
    assert not (tmp_path / "snaps").exists()  # no archive, no staging, not even the folder made for them
    assert all(files == {} for files in fake.files.values())  # the server's snapshot deleted all the same


def test_a_corrupt_archive_never_reaches_the_server(
    source: tuple[FakeRuntime, SnapshottingQdrant], tmp_path: Path
) -> None:
    runtime, _ = source
    made = create_snapshot(runtime.settings, runtime.store.engine, tmp_path / "snaps")  # type: ignore[attr-defined]
    path = Path(made["snapshot"])
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    fresh = SnapshottingQdrant()
    with pytest.raises(SnapshotError):
        restore_snapshot(path, make_settings(data_dir=tmp_path / "new", qdrant_url=BASE_URL),
                         engine_for=lambda settings: _engine(fresh))
    assert fresh.calls == [] and fresh.inner.get_collections().collections == []


def test_a_short_recovery_is_undone_and_refused(source: tuple[FakeRuntime, SnapshottingQdrant], tmp_path: Path
                                               ) -> None:
    runtime, _ = source
    made = create_snapshot(runtime.settings, runtime.store.engine, tmp_path / "snaps")  # type: ignore[attr-defined]
    fresh = SnapshottingQdrant()
    fresh.lose_on_recover = 1
    with pytest.raises(SnapshotError, match=f"holds {made['points']}"):
        restore_snapshot(Path(made["snapshot"]), make_settings(data_dir=tmp_path / "new", qdrant_url=BASE_URL),
                         engine_for=lambda settings: _engine(fresh))
    assert fresh.inner.get_collections().collections == [] and fresh.inner.get_aliases().aliases == []


def test_the_server_checks_the_uploaded_file_against_the_recorded_checksum(
    source: tuple[FakeRuntime, SnapshottingQdrant], tmp_path: Path
) -> None:
    runtime, _ = source
    staging = tmp_path / "data"
    generation, _, points = server_snapshots.snapshot_generation(runtime.store.engine, staging)  # type: ignore[arg-type]
    record = json.loads((staging / "server.json").read_text())
    (staging / "server.json").write_text(json.dumps(record | {"sha256": "0" * 64}))
    fresh = SnapshottingQdrant()
    with pytest.raises(SnapshotError, match="HTTP 400: Bad request: Snapshot checksum mismatch"):
        server_snapshots.restore_generation(_engine(fresh), staging, generation)
    assert fresh.inner.get_collections().collections == [] and fresh.inner.get_aliases().aliases == []
    assert points == runtime.store.count()


def test_a_killed_create_s_leftover_on_the_server_is_swept_and_a_younger_one_kept(
    source: tuple[FakeRuntime, SnapshottingQdrant], tmp_path: Path
) -> None:
    runtime, fake = source
    generation = runtime.store.info().active.name  # type: ignore[union-attr]
    fake.add_file(generation, "old.snapshot", b"x" * 200)  # made 2 hours ago: a create killed before its delete
    from datetime import UTC, datetime

    fake.add_file(generation, "busy.snapshot", b"y" * 200, datetime.now(UTC).replace(tzinfo=None))  # another create
    create_snapshot(runtime.settings, runtime.store.engine, tmp_path / "snaps")  # type: ignore[attr-defined]
    assert set(fake.files[generation]) == {"busy.snapshot"}


def test_the_in_process_engine_has_no_snapshots_and_says_what_it_needs(tmp_path: Path) -> None:
    from qdrant_client import QdrantClient

    engine = ServerEngine(QdrantClient(location=":memory:"), "passages", location=":memory:")
    with pytest.raises(SnapshotError, match="DPR_QDRANT_URL=http"):
        server_snapshots.http_for(engine)
