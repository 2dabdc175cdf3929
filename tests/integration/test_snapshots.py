"""Snapshots through the real embedded engine and the real base towers: restore into a fresh data dir answers every
question exactly as before (same hits, same scores); a corrupt, truncated or altered archive is refused."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import pytest
from kit.fakes import ingest_items
from typer.testing import CliRunner

from entrypoints.cli.main import app
from services.core.errors import SnapshotError
from services.core.settings import Settings
from services.ops.snapshots import restore_snapshot
from services.query import QueryOptions
from services.readers import Document
from services.runtime import Runtime

pytestmark = pytest.mark.integration

TOPICS = ["cats purr and hunt mice", "the Nile flows north to the Mediterranean", "Python reads files line by line",
          "bees make honey from nectar", "Everest is the highest mountain", "green and black tea share one plant",
          "volcanoes erupt lava and ash", "the moon causes ocean tides"]
QUESTIONS = ["Which animal hunts mice?", "Where does the Nile flow?", "How do I read a file?", "Who makes honey?",
             "What is the highest mountain?", "Where does tea come from?", "What comes out of a volcano?",
             "What causes tides?"]


def _answers(runtime: Runtime) -> dict[str, tuple[object, ...]]:
    """Every question's hits up to the order of exactly equal scores (the engine orders ties, e.g. hybrid RRF's,
    differently from one run to the next even on one store): the scores in order, and the hits above the last
    score (at the cut-off a tie may take either member)."""
    out = {}
    for mode in ("dense", "sparse", "hybrid"):
        for q in QUESTIONS:
            hits = runtime.search(q, QueryOptions(k=5, mode=mode))  # type: ignore[arg-type]
            scores = [h.score for h in hits]
            floor = min(scores, default=0.0)
            above = sorted((h.passage.doc_id, h.passage.chunk_index, h.score) for h in hits if h.score > floor)
            out[f"{mode}:{q}"] = (tuple(scores), tuple(above))
    return out


@pytest.fixture
def source(tmp_path: Path, base_towers: Any) -> Settings:
    settings = Settings(data_dir=tmp_path / "src", encoder={"backend": "torch"})
    docs = [Document(doc_id=f"d{i}", text=f"{t}. " * (1 + i % 3), title=t.split()[0]) for i, t in enumerate(TOPICS)]
    with Runtime(settings, towers=base_towers) as runtime:
        ingest_items(runtime.pipeline, docs)
    return settings


def test_snapshot_restore_answers_exactly_as_before(tmp_path: Path, source: Settings, base_towers: Any) -> None:
    with Runtime(source, towers=base_towers) as runtime:
        before = _answers(runtime)
        points = runtime.store.count()
    runner = CliRunner()
    made = runner.invoke(app, ["--data-dir", str(source.data_dir), "snapshot", "create", "--json"])
    assert made.exit_code == 0, made.output + made.stderr
    created = json.loads(made.stdout)
    assert created["points"] == points and created["backend"] == "edge" and created["model_name"] == "base"
    archive = Path(created["snapshot"])
    assert archive.is_file() and Path(str(archive) + ".sha256").read_text().split()[0] == created["sha256"]

    listed = json.loads(runner.invoke(app, ["--data-dir", str(source.data_dir), "snapshot", "list", "--json"]).stdout)
    assert [s["snapshot"] for s in listed["snapshots"]] == [str(archive)] and listed["snapshots"][0]["ok"]

    new = tmp_path / "restored"
    done = runner.invoke(app, ["snapshot", "restore", str(archive), "--data-dir", str(new), "--json"])
    assert done.exit_code == 0, done.output + done.stderr
    report = json.loads(done.stdout)
    assert report["points"] == points and report["checksum_file"] and report["warnings"] == []
    assert json.loads((new / "FORMAT").read_text())["format"] == 1

    restored = source.model_copy(update={"data_dir": new})
    with Runtime(restored, towers=base_towers) as runtime:
        assert runtime.store.count() == points
        assert _answers(runtime) == before, "restored store must answer every question exactly as before"

    again = runner.invoke(app, ["snapshot", "restore", str(archive), "--data-dir", str(new)])
    assert again.exit_code == 1 and "already exists" in again.stderr


def _corrupt(path: Path, at: float) -> None:
    data = bytearray(path.read_bytes())
    i = int(len(data) * at)
    data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def _tree(root: Path) -> dict[str, bytes | None]:
    return {p.relative_to(root).as_posix(): p.read_bytes() if p.is_file() else None for p in root.rglob("*")}


def test_a_corrupt_or_truncated_snapshot_is_refused_and_leaves_nothing(tmp_path: Path, source: Settings) -> None:
    runner = CliRunner()
    made = json.loads(runner.invoke(app, ["--data-dir", str(source.data_dir), "snapshot", "create", "--json"]).stdout)
    archive = Path(made["snapshot"])
    good = archive.read_bytes()
    used = tmp_path / "used"  # a data dir with another collection's files and no FORMAT yet
    (used / "store" / "other").mkdir(parents=True)
    (used / "store" / "other" / "CURRENT").write_text("g1\n")
    before = _tree(used)

    _corrupt(archive, 0.5)  # the checksum file catches it before anything is unpacked
    result = runner.invoke(app, ["snapshot", "restore", str(archive), "--data-dir", str(tmp_path / "a")])
    assert result.exit_code == 1 and "does not match its checksum" in result.stderr
    assert "Traceback" not in result.stderr

    os.remove(str(archive) + ".sha256")  # without it, the manifest's per-file sha256 (or gzip's CRC) catches it
    result = runner.invoke(app, ["snapshot", "restore", str(archive), "--data-dir", str(used)])
    assert result.exit_code == 1 and "as it was" in result.stderr, result.stderr
    with pytest.raises(SnapshotError):
        restore_snapshot(archive, source.model_copy(update={"data_dir": tmp_path / "b"}))

    archive.write_bytes(good[: len(good) // 2])  # truncated
    with pytest.raises(SnapshotError, match="corrupt|truncated"):
        restore_snapshot(archive, source.model_copy(update={"data_dir": tmp_path / "c" / "deeper"}))

    # a member's bytes changed and the archive re-compressed (gzip's CRC is then right): the manifest catches it
    raw = bytearray(gzip.decompress(good))
    spec_at = raw.rfind(b"\"distance\"")  # in data/spec.json (the manifest holds a copy first)
    assert spec_at > 0
    raw[spec_at + 1] = ord("D")
    archive.write_bytes(gzip.compress(bytes(raw)))
    with pytest.raises(SnapshotError, match="sha256"):
        restore_snapshot(archive, source.model_copy(update={"data_dir": used}))
    assert _tree(used) == before, "a failed restore leaves the data dir exactly as it was"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src", "used"], "and nothing beside it"


def test_admin_api_snapshots_a_running_server_and_lists_it(tmp_path: Path, source: Settings,
                                                           base_towers: Any) -> None:
    from fastapi.testclient import TestClient

    from entrypoints.api.app import create_app
    from services.core.settings import ApiSettings

    settings = source.model_copy(update={"api": ApiSettings(api_key="admin-secret")})
    runtime = Runtime(settings, towers=base_towers, serialize_store=True)
    with TestClient(create_app(settings, runtime=runtime, warm_model=False)) as client:
        assert client.post("/v1/search", json={"question": "tides"}, headers={"X-API-Key": "admin-secret"}
                           ).status_code == 200  # the server holds the store open
        assert client.post("/v1/snapshots").status_code == 401
        made = client.post("/v1/snapshots", headers={"X-API-Key": "admin-secret"})
        assert made.status_code == 201, made.text
        body = made.json()
        listed = client.get("/v1/snapshots", headers={"X-API-Key": "admin-secret"}).json()["snapshots"]
        assert [s["snapshot"] for s in listed] == [body["snapshot"]]
        assert client.post("/v1/search", json={"question": "tides"}, headers={"X-API-Key": "admin-secret"}
                           ).status_code == 200, "the server answers after the snapshot"
        disk = client.get("/v1/status", headers={"X-API-Key": "admin-secret"}).json()["disk"]
        assert disk["free_mb"] > 0 and disk["path"] == str(settings.data_dir)
    report = restore_snapshot(Path(body["snapshot"]), settings.model_copy(update={"data_dir": tmp_path / "r"}))
    assert report["points"] == body["points"] == len(TOPICS)


def test_server_snapshots_need_a_real_server(tmp_path: Path) -> None:
    """qdrant-client's in-process engine has no snapshots: the command says what it needs instead of failing late."""
    from qdrant_client import QdrantClient

    from services.ops.snapshots import create_snapshot
    from services.store import Store
    from services.store.points import CollectionSpec
    from services.store.server.engine import ServerEngine

    engine = ServerEngine(QdrantClient(":memory:"), "passages", location=":memory:")
    Store(engine).ensure_collection(CollectionSpec(dim=4, distance="cosine", model="m@1", sparse=False))
    with pytest.raises(SnapshotError, match="need a Qdrant server"):
        create_snapshot(Settings(data_dir=tmp_path), engine, tmp_path / "snaps")
    assert not (tmp_path / "snaps").exists(), "a failed create leaves nothing behind"


@pytest.mark.skipif(not os.environ.get("QDRANT_URL"), reason="needs a Qdrant server: set QDRANT_URL")
def test_server_snapshot_restores_into_a_fresh_collection(tmp_path: Path, base_towers: Any) -> None:
    import uuid

    url = os.environ["QDRANT_URL"]
    name = f"snap{uuid.uuid4().hex[:8]}"
    settings = Settings(data_dir=tmp_path / "d", qdrant_url=url, collection=name, encoder={"backend": "torch"})
    docs = [Document(doc_id=f"d{i}", text=t) for i, t in enumerate(TOPICS)]
    with Runtime(settings, towers=base_towers) as runtime:
        ingest_items(runtime.pipeline, docs)
        before = _answers(runtime)
        engine = runtime.store.engine  # type: ignore[attr-defined]
        from services.ops.snapshots import create_snapshot

        made = create_snapshot(settings, engine)
        generation = made["generation"]
        engine.client.delete_alias(alias_name=name)
        engine.client.delete_collection(generation)
    restore_snapshot(Path(made["snapshot"]), settings)
    with Runtime(settings, towers=base_towers) as runtime:
        assert runtime.store.count() == made["points"]
        assert _answers(runtime) == before
