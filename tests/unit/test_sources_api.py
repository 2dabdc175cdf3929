"""The sources over HTTP and through the typed client, against the real app in-process (the fake runtime, a folder
source): admin adds and removes, write syncs (202, then the source's status says how it ended), read lists; a
second add of a name is a conflict, an unknown source 404; the synced documents carry source=NAME; --purge over
HTTP removes exactly them; no credential travels (only variable names); the server's own disk is reachable over
HTTP only under DPR_SOURCES__FOLDER_ROOTS."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from kit.fakes import FakeRuntime
from test_client import KEY, through

from dpr_client import Client, Conflict, Forbidden, NotFound, wire_sources
from entrypoints.api.app import create_app
from services.core.settings import ApiSettings, Settings, SourceSettings

pytestmark = pytest.mark.unit


@pytest.fixture
def app(tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(data_dir=tmp_path / "server", api=ApiSettings(api_key=KEY),
                        sources=SourceSettings(folder_roots=[tmp_path / "shared"]))
    with TestClient(create_app(settings, runtime=FakeRuntime(), warm_model=False),
                    raise_server_exceptions=False) as c:
        yield c


def test_sources_over_http(app: TestClient, tmp_path: Path) -> None:
    folder = tmp_path / "shared" / "notes"  # under DPR_SOURCES__FOLDER_ROOTS
    folder.mkdir(parents=True)
    (folder / "boiler.md").write_text("# Boiler\n\nTo reset the boiler, hold the red button for ten seconds.\n")
    (folder / "garden.txt").write_text("The garden hose is kept in the shed.\n")
    with Client("http://dpr.test", api_key=KEY, transport=through(app)) as dpr:
        added = dpr.add_source("notes", str(folder), every="15m", exclude=["*.tmp"])
        assert isinstance(added, wire_sources.SourceOut) and (added.kind, added.every_s) == ("folder", 900.0)
        with pytest.raises(Conflict, match="exists already"):
            dpr.add_source("notes", str(folder))
        # the server's own disk outside the roots, a folder it does not have, a URI it cannot read: 409, said why
        with pytest.raises(Conflict, match="only under DPR_SOURCES__FOLDER_ROOTS"):
            dpr.add_source("etc", "/etc")
        with pytest.raises(Conflict, match="only under DPR_SOURCES__FOLDER_ROOTS"):
            dpr.add_source("repo", f"git+file://{tmp_path}/repo.git")
        with pytest.raises(Conflict, match="no such folder"):
            dpr.add_source("gone", str(tmp_path / "shared" / "gone"))
        with pytest.raises(Conflict, match="not a source this version reads"):
            dpr.add_source("ftp", "ftp://example.org/pub")
        with pytest.raises(NotFound, match="no source 'nope'"):
            dpr.sync_source("nope")
        assert dpr.sync_source("notes").state == "started"
        deadline = time.monotonic() + 30
        while not (shown := dpr.source("notes")).last.get("outcome"):
            assert time.monotonic() < deadline, "the sync did not end"
            time.sleep(0.05)
        assert shown.last["outcome"] == "ok" and shown.last["added"] == 2 and shown.next_run
        hits = dpr.search("reset the boiler", k=5, filters={"source": "notes"}).hits
        assert {h.doc_id for h in hits} == {"notes/boiler.md", "notes/garden.txt"}
        assert [s.name for s in dpr.sources().sources] == ["notes"]

        reader = dpr.create_key("read", name="reader")
        with Client("http://dpr.test", api_key=reader.token, transport=through(app)) as read_only:
            assert [s.name for s in read_only.sources().sources] == ["notes"]
            with pytest.raises(Forbidden):
                read_only.sync_source("notes")
            with pytest.raises(Forbidden):
                read_only.add_source("other", str(folder))

        removed = dpr.remove_source("notes", purge=True)
        assert (removed.purged, removed.documents) == (True, 2)
        assert dpr.search("reset the boiler", k=5).hits == [] and dpr.sources().sources == []


def test_a_source_names_its_credentials_never_holds_them(app: TestClient) -> None:
    with Client("http://dpr.test", api_key=KEY, transport=through(app)) as dpr:
        made = dpr.add_source("bucket", "s3://docs/manuals", key_env="DOCS_KEY", secret_env="DOCS_SECRET")
        assert made.model_dump()["key_env"] == "DOCS_KEY"
        refused = app.post("/v1/sources", headers={"X-API-Key": KEY},
                           json={"name": "b2", "uri": "s3://docs/x", "key_env": "AKIA+SECRET/VALUE"})
        assert refused.status_code == 422 and "key_env" in refused.json()["error"]["message"]
