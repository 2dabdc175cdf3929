"""The HTTP API in-process (TestClient over ASGI: no sockets) against a real in-process store and hashing towers.

Behaviour checked: 202 + job id for JSON batches and uploads, job progress with per-document failures, search
through ``services.query.search`` (dense and hybrid), delete, error mapping to JSON, limits, API key.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from kit.documents import make_docx, make_pdf
from kit.fakes import FakeRuntime, HashTowers

from entrypoints.api.app import create_app
from services.core.errors import StoreUnavailable
from services.core.settings import ApiSettings, Settings

pytestmark = pytest.mark.unit

DOCS = [
    {"id": "cats", "title": "Cats", "text": "Cats are small carnivores. They purr and hunt mice at night."},
    {"id": "nile", "title": "Rivers", "text": "The Nile is the longest river in Africa and flows north."},
    {"id": "py", "title": "Python", "text": "Python reads a file line by line with a for loop over the file.",
     "metadata": {"lang": "en", "year": 2024}},
]


def _settings(tmp_path: Path, **api: Any) -> Settings:
    return Settings(data_dir=tmp_path / "dpr", api=ApiSettings(**api))


@pytest.fixture
def runtime() -> FakeRuntime:
    return FakeRuntime()


@pytest.fixture
def client(tmp_path: Path, runtime: FakeRuntime) -> Iterator[TestClient]:
    app = create_app(_settings(tmp_path, max_documents=5, max_request_bytes=64_000), runtime=runtime,
                     warm_model=False)
    with TestClient(app) as c:
        yield c


def wait_job(client: TestClient, job: str, timeout: float = 10.0, headers: dict[str, str] | None = None
             ) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        r = client.get(f"/v1/jobs/{job}", headers=headers)
        assert r.status_code == 200, r.text
        body = r.json()
        if body["state"] in ("done", "failed") or time.monotonic() > deadline:
            return body
        time.sleep(0.02)


def ingest(client: TestClient, docs: list[dict[str, Any]], headers: dict[str, str] | None = None) -> dict[str, Any]:
    r = client.post("/v1/documents", json={"documents": docs}, headers=headers)
    assert r.status_code == 202, r.text
    assert r.headers["location"] == f"/v1/jobs/{r.json()['job']}"
    return wait_job(client, r.json()["job"], headers=headers)


def assert_error(r: Any, status: int, type_: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert err["type"] == type_ and err["message"]
    return err


def test_health_and_ready(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    r = client.get("/readyz")
    assert r.status_code == 200
    assert r.json()["checks"]["store"]["ok"] is True and r.json()["checks"]["model"]["ok"] is True
    assert "broker" not in r.json()["checks"]  # embedded default: no broker to check


def test_ingest_then_search_dense_and_hybrid(client: TestClient) -> None:
    job = ingest(client, DOCS + [{"id": "blank", "text": "   "}])
    assert job["state"] == "done"
    assert (job["documents"], job["chunks"], job["batches_done"], job["batches_total"]) == (3, 3, 1, 1)
    assert [(f["source"], f["reason"]) for f in job["failed"]] == [("request.documents[3]", "empty")]

    hits = client.post("/v1/search", json={"question": "Which river flows north?", "k": 2}).json()["hits"]
    assert hits[0]["doc_id"] == "nile" and len(hits) == 2
    assert hits[0]["source"] == "api" and hits[0]["title"] == "Rivers"
    hybrid = client.post("/v1/search", json={"question": "purr mice", "mode": "hybrid", "fusion": "rrf"}).json()
    assert hybrid["hits"][0]["doc_id"] == "cats"
    filtered = client.post("/v1/search", json={"question": "file", "filters": {"lang": "en"}}).json()["hits"]
    assert [h["doc_id"] for h in filtered] == ["py"]
    any_of = client.post("/v1/search", json={"question": "x", "filters": {"doc_id": ["cats", "nile"]}}).json()
    assert {h["doc_id"] for h in any_of["hits"]} == {"cats", "nile"}


def test_reingest_unchanged_costs_no_encoder_work(client: TestClient, runtime: FakeRuntime) -> None:
    ingest(client, DOCS)
    encoded = runtime.towers.encoded
    again = ingest(client, DOCS)
    assert (again["documents"], again["unchanged"]) == (0, 3)
    assert runtime.towers.encoded == encoded


def test_delete_document(client: TestClient) -> None:
    ingest(client, DOCS)
    r = client.delete("/v1/documents/cats")
    assert r.status_code == 200 and r.json() == {"doc_id": "cats", "points_deleted": 1}
    assert_error(client.delete("/v1/documents/cats"), 404, "not_found")
    hits = client.post("/v1/search", json={"question": "cats purr", "k": 5}).json()["hits"]
    assert "cats" not in {h["doc_id"] for h in hits}


def test_delete_document_id_with_slashes(client: TestClient) -> None:
    ingest(client, [{"id": "docs/guide/intro.md", "text": "An introduction to the guide."}])
    r = client.delete("/v1/documents/docs/guide/intro.md")
    assert r.status_code == 200 and r.json()["points_deleted"] == 1


def test_upload_text_file_and_jsonl(client: TestClient) -> None:
    note = b"# Bees\n\nBees make honey from nectar."
    r = client.post("/v1/documents", files={"file": ("notes.md", note, "text/markdown")})
    assert r.status_code == 202, r.text
    job = wait_job(client, r.json()["job"])
    assert job["state"] == "done" and job["documents"] == 1
    hit = client.post("/v1/search", json={"question": "honey", "k": 1}).json()["hits"][0]
    assert (hit["doc_id"], hit["title"], hit["source"]) == ("notes.md", "Bees", "upload:notes.md")

    jsonl = b'{"id": "j1", "text": "Volcanoes erupt lava."}\nnot json\n{"id": "j2", "text": "Glaciers carve."}\n'
    r = client.post("/v1/documents", files={"file": ("batch.jsonl", jsonl)}, data={"format": "auto"})
    assert r.status_code == 202, r.text
    job = wait_job(client, r.json()["job"])
    assert job["documents"] == 2
    assert [f["reason"] for f in job["failed"]] == ["invalid_json"]
    assert "dpr-upload-" not in job["failed"][0]["error"] and job["failed"][0]["source"].startswith("upload:")


def test_upload_pdf_and_docx_keep_their_places(client: TestClient, tmp_path: Path) -> None:
    pdf = make_pdf(tmp_path / "manual.pdf", ["Installing the pump.", "Resetting the boiler pressure valve."])
    docx = make_docx(tmp_path / "guide.docx")
    for path in (pdf, docx):
        r = client.post("/v1/documents", files={"file": (path.name, path.read_bytes())})
        assert r.status_code == 202, r.text
        job = wait_job(client, r.json()["job"])
        assert job["state"] == "done" and job["documents"] == 1, job
    hits = client.post("/v1/search", json={"question": "boiler pressure valve", "k": 20}).json()["hits"]
    pdf_hits = [h for h in hits if h["doc_id"] == "manual.pdf"]  # two short pages: one passage, pages 1-2
    assert [(h["page"], h["page_end"], h["format"], h["source"]) for h in pdf_hits] == [
        (1, 2, "pdf", "upload:manual.pdf")]
    assert any(h["doc_id"] == "guide.docx" and h.get("format") == "docx" for h in hits)


def test_upload_errors(client: TestClient) -> None:
    # a file of any name is taken (the schema cannot say a file name): read by its content as `dpr ingest` reads
    # it, a file no reader takes and an empty one fail alone, each with its reason in the job
    for name, content in (("x.bin", b"\x00\x01"), ("noextension", b"\x00\x01"), ("x.txt", b"")):
        r = client.post("/v1/documents", files={"file": (name, content)})
        assert r.status_code == 202, r.text
        job = wait_job(client, r.json()["job"])
        reported = job["skipped"] + job["failed"]
        assert job["documents"] == 0 and len(reported) == 1 and reported[0]["reason"], job
    err = assert_error(client.post("/v1/documents", files={"file": ("x.txt", b"hi"), "extra": (None, "1")}), 422,
                       "validation")
    assert "'extra'" in err["message"]
    assert_error(client.post("/v1/documents", files={"file": ("x.txt", b"hi")}, data={"language": "fr"}), 422,
                 "validation")
    assert_error(client.post("/v1/documents", files={"format": (None, "auto")}), 422, "validation")  # no file
    assert_error(client.post("/v1/documents", data={"format": "auto"}), 415, "unsupported_media_type")
    assert_error(client.post("/v1/documents", files={"file": ("x.txt", b"hi")}, data={"format": "pdf"}), 422,
                 "validation")
    r = client.post("/v1/documents", content=b"--x\r\nbroken", headers={"content-type": "multipart/form-data"})
    assert_error(r, 400, "bad_request")


def test_validation_errors_are_json_422(client: TestClient) -> None:
    err = assert_error(client.post("/v1/search", json={"question": "q", "k": 0}), 422, "validation")
    assert err["details"][0]["loc"] == "body.k"
    assert_error(client.post("/v1/search", json={"question": "q", "mode": "fuzzy"}), 422, "validation")
    assert_error(client.post("/v1/search", json={"question": "q", "filters": {"a": {"nested": 1}}}), 422,
                 "validation")
    assert_error(client.post("/v1/search", content=b"{not json", headers={"content-type": "application/json"}),
                 422, "validation")
    lone_surrogate = b'{"question": "\\ud800"}'  # valid JSON, not encodable text
    assert_error(client.post("/v1/search", content=lone_surrogate, headers={"content-type": "application/json"}),
                 422, "validation")
    assert_error(client.post("/v1/documents", json={"documents": []}), 422, "validation")
    assert_error(client.post("/v1/documents", json={"documents": [{"id": "a"}]}), 422, "validation")
    assert_error(client.post("/v1/documents", content=b"{]", headers={"content-type": "application/json"}), 422,
                 "validation")


def test_service_errors_map_to_statuses(client: TestClient, runtime: FakeRuntime) -> None:
    assert_error(client.post("/v1/search", json={"question": "anything"}), 404, "not_found")  # no collection yet
    ingest(client, DOCS)
    assert_error(client.post("/v1/search", json={"question": "   "}), 422, "validation")  # the schema's pattern
    err = assert_error(client.post("/v1/search", json={"question": "q", "linear_weight": 0.5, "mode": "hybrid",
                                                       "fusion": "linear", "k": 1001}), 422, "validation")
    assert "k" in err["message"]
    runtime.use_towers(HashTowers(name="other-model"))  # a question tower that is not the passage tower's partner
    assert_error(client.post("/v1/search", json={"question": "q"}), 409, "model_mismatch")


def test_transient_store_error_is_503(tmp_path: Path) -> None:
    class DownStore:
        backend, alias = "server", "passages"

        def close(self) -> None:
            pass

        def __getattr__(self, name: str) -> Any:
            def fail(*a: Any, **k: Any) -> Any:
                raise StoreUnavailable("Qdrant at http://qdrant:6333 is unreachable; check it is running")

            return fail

    app = create_app(_settings(tmp_path), runtime=FakeRuntime(store=DownStore()), warm_model=False)
    with TestClient(app) as c:
        r = c.post("/v1/search", json={"question": "q"})
        assert_error(r, 503, "unavailable")
        assert r.headers["retry-after"]
        ready = c.get("/readyz")
        assert ready.status_code == 503 and ready.json()["status"] == "not_ready"
        assert "unreachable" in ready.json()["checks"]["store"]["error"]
        # a job whose store is down fails with the reason, the API stays up
        job = wait_job(c, c.post("/v1/documents", json={"documents": DOCS[:1]}).json()["job"])
        assert job["state"] == "failed" and "unreachable" in job["errors"][0]["error"]


def test_limits(client: TestClient) -> None:
    too_many = [{"id": str(i), "text": "t"} for i in range(6)]
    err = assert_error(client.post("/v1/documents", json={"documents": too_many}), 422, "validation")  # maxItems
    assert "DPR_API__MAX_DOCUMENTS" in err["message"]
    big = {"documents": [{"id": "big", "text": "x" * 70_000}]}
    err = assert_error(client.post("/v1/documents", json=big), 413, "too_large")
    assert "DPR_API__MAX_REQUEST_BYTES" in err["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while streaming
        yield b'{"documents": [{"id": "s", "text": "'
        for _ in range(20):
            yield b"y" * 4096
        yield b'"}]}'

    r = client.post("/v1/documents", content=chunks(), headers={"content-type": "application/json"})
    assert_error(r, 413, "too_large")
    assert_error(client.post("/v1/documents", content=b"x", headers={"content-type": "text/plain"}), 415,
                 "unsupported_media_type")


def test_unknown_routes_and_jobs_are_json_404(client: TestClient) -> None:
    assert_error(client.get("/v1/nothing"), 404, "not_found")
    assert_error(client.get("/v1/jobs/0123456789abcdef"), 404, "not_found")
    assert_error(client.get("/v1/jobs/bad id!"), 404, "not_found")
    assert_error(client.put("/v1/search"), 405, "method_not_allowed")


def test_api_key(tmp_path: Path) -> None:
    app = create_app(_settings(tmp_path, api_key="s3cret"), runtime=FakeRuntime(), warm_model=False)
    with TestClient(app) as c:
        assert_error(c.post("/v1/search", json={"question": "q"}), 401, "unauthorized")
        assert_error(c.post("/v1/search", json={"question": "q"}, headers={"X-API-Key": "wrong"}), 401,
                     "unauthorized")
        job = ingest(c, DOCS, headers={"X-API-Key": "s3cret"})
        assert job["state"] == "done"
        ok = c.post("/v1/search", json={"question": "Nile"}, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        assert c.get("/healthz").status_code == 200 and c.get("/readyz").status_code == 200
        assert c.get("/metrics").status_code == 200
        schemes = c.get("/openapi.json").json()["components"]["securitySchemes"]
        assert {"APIKeyHeader", "HTTPBearer"} <= set(schemes)


def test_openapi_schema_describes_both_ingest_bodies(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    body = spec["paths"]["/v1/documents"]["post"]["requestBody"]["content"]
    assert set(body) == {"application/json", "multipart/form-data"}
    assert "DocumentsIn" in spec["components"]["schemas"] and "DocumentIn" in spec["components"]["schemas"]
    for path in ("/v1/search", "/v1/jobs/{job_id}", "/v1/documents/{doc_id}", "/healthz", "/readyz", "/metrics"):
        assert path in spec["paths"]


def test_lifespan_closes_the_runtime(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    with TestClient(create_app(_settings(tmp_path), runtime=runtime, warm_model=True)) as c:
        deadline = time.monotonic() + 5
        while c.get("/readyz").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert c.get("/readyz").json()["checks"]["model"]["ok"] is True
    assert runtime.closed


def test_a_duplicate_id_in_one_request_fails_and_the_first_is_kept(client: TestClient) -> None:
    docs = [{"id": "x", "text": "first version"}, {"id": "x", "text": "second version"}]
    job = ingest(client, docs)
    assert job["documents"] == 1
    assert [(f["reason"], f["source"]) for f in job["failed"]] == [("duplicate_id", "request.documents[1]")]
    hit = client.post("/v1/search", json={"question": "version", "k": 1}).json()["hits"][0]
    assert hit["text"].endswith("first version")


def test_sync_prefix_lists_stale_documents_and_prune_removes_them(client: TestClient) -> None:
    docs = [{"id": f"site/{n}", "text": f"page {n} about rivers"} for n in ("a", "b", "c")]
    ingest(client, [*docs, {"id": "other", "text": "outside the prefix"}])
    kept = docs[:2]
    r = client.post("/v1/documents?sync_prefix=site/", json={"documents": kept})
    assert r.status_code == 202 and (r.json()["stale"], r.json()["pruned"]) == (["site/c"], 0)
    wait_job(client, r.json()["job"])
    r = client.post("/v1/documents?sync_prefix=site/&prune=true", json={"documents": kept})
    assert r.status_code == 202 and (r.json()["stale"], r.json()["pruned"]) == (["site/c"], 1)
    wait_job(client, r.json()["job"])
    hits = client.post("/v1/search", json={"question": "rivers outside", "k": 10}).json()["hits"]
    assert sorted({h["doc_id"] for h in hits}) == ["other", "site/a", "site/b"]
    err = assert_error(client.post("/v1/documents?prune=true", json={"documents": kept}), 422, "validation")
    assert "prune needs sync_prefix" in err["message"]
    assert_error(client.post("/v1/documents?sync_prefix=a&prune=yes", json={"documents": kept}), 422, "validation")
