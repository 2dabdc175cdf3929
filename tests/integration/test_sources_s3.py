"""`dpr sources` on a real S3 server (SeaweedFS's `weed server -s3`, started here on free loopback ports): the first
sync stores what `dpr ingest` of the same files stores; after objects change and go, the next sync reads and
re-encodes only the changed ones and leaves exactly a fresh ingest's points; one bad object is reported and blocks
nothing; the server killed in the middle of a sync fails it deleting nothing, and the sync after a restart ends
with exactly the clean points; credentials are named, never written."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kit.seaweed import SeaweedS3
from kit.stored import stored_points
from typer.testing import CliRunner

from entrypoints.cli.main import app

pytestmark = pytest.mark.integration

SECRET = "s3cr3t-Value-Never-Shown"
TOPICS = ["boiler pressure", "garden hose", "rose pruning", "dishwasher filter", "attic insulation", "bike chain",
          "smoke alarm", "window seals", "gutter cleaning", "water softener", "oven grill", "fuse box"]


def text(i: int, version: int = 1) -> bytes:
    return (f"# Note {i}\n\nHow to look after the {TOPICS[i % len(TOPICS)]}: step {version} of the house manual, "
            f"checked every {i + version} weeks.\n").encode()


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    server = SeaweedS3(tmp_path_factory.mktemp("weed")).start()
    yield server
    server.stop()


def dpr(data: Path, *args: str, code: int = 0) -> Any:
    res = CliRunner().invoke(app, ["--data-dir", str(data), *args, "--json"])
    assert res.exit_code == code, res.output
    return json.loads(res.stdout) if code == 0 else res


def put_all(s3: SeaweedS3, bucket: str, objects: dict[str, bytes]) -> None:
    client = s3.client()
    for key, body in objects.items():
        client.put_object(Bucket=bucket, Key=key, Body=body)


def fresh_ingest(tmp: Path, name: str, files: dict[str, bytes]) -> dict[str, tuple[str, int, str]]:
    """The points `dpr ingest` of these files, in a folder called ``name``, stores in a new data dir."""
    root = tmp / "fresh" / name
    shutil.rmtree(tmp / "fresh", ignore_errors=True)
    for key, body in files.items():
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(body)
    res = CliRunner().invoke(app, ["--data-dir", str(tmp / "fresh-data"), "ingest", str(root), "--json"])
    assert res.exit_code == 0, res.output
    points = stored_points(tmp / "fresh-data")
    shutil.rmtree(tmp / "fresh-data")
    return points


def test_an_s3_source_syncs_incrementally(s3: SeaweedS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s3.client().create_bucket(Bucket="manuals")
    objects = {f"n{i:02d}.md": text(i) for i in range(8)}  # under the prefix house/
    put_all(s3, "manuals", {f"house/{k}": v for k, v in objects.items()}
            | {"other/outside.md": text(9), "house/broken.pdf": b"not a pdf at all"})
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3.endpoint)  # the standard variable, honoured as boto3 does
    monkeypatch.setenv("HOUSE_KEY", "test")
    monkeypatch.setenv("HOUSE_SECRET", SECRET)
    data = tmp_path / "data"
    dpr(data, "sources", "add", "house", "s3://manuals/house", "--key-env", "HOUSE_KEY", "--secret-env", "HOUSE_SECRET")

    first = dpr(data, "sources", "sync", "house")
    assert (first["outcome"], first["listed"], first["documents"], first["failed"]) == ("ok", 9, 8, 1)
    assert first["failures"][0]["source"] == "house/broken.pdf" and first["failures"][0]["reason"] == "mislabelled"
    assert stored_points(data) == fresh_ingest(tmp_path, "house", objects)

    changed = {f"n{i:02d}.md": text(i, 2) for i in (1, 4)}
    put_all(s3, "manuals", {f"house/{k}": v for k, v in changed.items()})
    s3.client().delete_objects(Bucket="manuals", Delete={"Objects": [{"Key": "house/n06.md"}]})
    second = dpr(data, "sources", "sync", "house")
    assert sorted(second["read"]) == ["broken.pdf", "n01.md", "n04.md"]  # the failed object is tried again
    assert (second["added"], second["changed"], second["removed"], second["documents"], second["passages"]) == (
        1, 2, 1, 2, 2)  # the failed object has no version recorded: it counts as new again
    now = {k: v for k, v in (objects | changed).items() if k != "n06.md"}
    assert stored_points(data) == fresh_ingest(tmp_path, "house", now)
    hits = dpr(data, "query", "how to look after the rose pruning", "--filter", "source=house", "-k", "1")
    assert hits[0]["doc_id"] == "house/n02.md"

    # the credentials' values appear nowhere: not in the spec, the state, the listing or the audit log
    for path in data.rglob("*"):
        if path.is_file() and path.stat().st_size < 5_000_000:
            assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in json.dumps(dpr(data, "sources", "list"))


def test_the_server_killed_mid_sync(s3: SeaweedS3, tmp_path: Path) -> None:
    from entrypoints.compose import executor_for
    from services.core.settings import CelerySettings, Settings, SourceSettings
    from services.runtime import Runtime
    from services.sources.kinds import SourceUnreachable
    from services.sources.registry import Registry, new_spec
    from services.sources.sync import sync_source

    s3.client().create_bucket(Bucket="crash")
    objects = {f"n{i:02d}.md": text(i) for i in range(40)}
    put_all(s3, "crash", objects)
    data = tmp_path / "data"
    settings = Settings(data_dir=data, celery=CelerySettings(batch_documents=2),
                        sources=SourceSettings(s3_endpoint=s3.endpoint, timeout_s=5))
    registry = Registry(data)
    registry.add(new_spec("crash", "s3://crash", key_env=None, secret_env=None))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", "test")
        env.setenv("AWS_SECRET_ACCESS_KEY", "test")
        with Runtime(settings) as runtime:
            assert sync_source(runtime, registry, "crash", executor_for(runtime)).outcome == "ok"
        clean_before = stored_points(data)

        # 30 changed, more than the downloads kept in flight ahead of the reader (16): some are still to fetch when
        # the server dies after the first batch of 2
        changed = {f"n{i:02d}.md": text(i, 3) for i in range(30)}
        put_all(s3, "crash", changed)
        s3.client().delete_objects(Bucket="crash", Delete={"Objects": [{"Key": "n11.md"}, {"Key": "n09.md"}]})

        def kill_after_first_batch(report: object) -> None:
            s3.kill()

        with Runtime(settings) as runtime, pytest.raises(SourceUnreachable, match="source crash: cannot reach"):
            sync_source(runtime, registry, "crash", executor_for(runtime, on_batch=kill_after_first_batch))
        after = stored_points(data)
        assert {p[0] for p in after.values()} == {p[0] for p in clean_before.values()}  # nothing deleted
        last = json.loads((data / "sources" / "crash" / "last.json").read_text())
        assert last["outcome"] == "failed" and last["removed"] == 0

        env.setenv("DPR_SOURCES__S3_ENDPOINT", s3.endpoint)
        down = dpr(data, "sources", "sync", "crash", code=3)  # still down: exit 3, one line naming it and the fix
        assert "source crash: cannot reach s3://crash/" in down.stderr and len(down.stderr.strip().splitlines()) == 1

        s3.start()
        done = dpr(data, "sources", "sync", "crash")
        assert done["outcome"] == "ok" and done["removed"] == 2
        assert done["documents"] < 30  # what the killed sync wrote already is not encoded again
        now = {k: v for k, v in (objects | changed).items() if k not in ("n11.md", "n09.md")}
        assert stored_points(data) == fresh_ingest(tmp_path, "crash", now)
