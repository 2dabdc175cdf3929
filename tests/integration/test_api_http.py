"""The HTTP API over real sockets: a real uvicorn on a free loopback port, the real base towers, the real
embedded Qdrant engine; and the deployment shape (``dpr serve`` + a real Redis + a real ``dpr worker``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from api_server import LiveServer, ServeProcess, wait_job, wait_ready
from prometheus_client.parser import text_string_to_metric_families

from entrypoints.api.app import create_app
from services.core.settings import Settings
from services.runtime import Runtime

pytestmark = pytest.mark.integration

DOCS = [
    {"id": "cats", "title": "Cats", "text": "Cats are small domesticated carnivores. They purr when content and "
     "hunt mice at night."},
    {"id": "nile", "title": "Rivers", "text": "The Nile is the longest river in Africa and flows north into the "
     "Mediterranean Sea."},
    {"id": "python-files", "title": "Reading files in Python", "text": "Use `with open(path) as f:` and iterate "
     "`for line in f:` to read a text file line by line.", "metadata": {"topic": "programming"}},
    {"id": "photosynthesis", "title": "Photosynthesis", "text": "Plants convert light energy into chemical energy, "
     "producing oxygen and glucose from carbon dioxide and water."},
]


def metric(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, base_towers: Any) -> Iterator[httpx.Client]:
    settings = Settings(data_dir=tmp_path_factory.mktemp("api") / "dpr")
    runtime = Runtime(settings)
    runtime.__dict__["towers"] = base_towers  # the session's model: loaded once for every integration test
    with LiveServer(create_app(settings, runtime=runtime)) as server:
        wait_ready(server.url, timeout=60)
        with httpx.Client(base_url=server.url, timeout=60) as client:
            yield client


def test_ingest_search_delete_over_http(live: httpx.Client) -> None:
    before = live.get("/metrics").text
    r = live.post("/v1/documents", json={"documents": DOCS + [{"id": "empty", "text": " "}]})
    assert r.status_code == 202, r.text
    assert r.headers["location"] == f"/v1/jobs/{r.json()['job']}"
    job = wait_job(live, r.json()["job"])
    assert job["state"] == "done", job
    assert job["documents"] == 4 and job["chunks"] >= 4
    assert [f["reason"] for f in job["failed"]] == ["empty"]

    hits = live.post("/v1/search", json={"question": "How do I read a file line by line?", "k": 3}).json()["hits"]
    assert hits[0]["doc_id"] == "python-files"
    assert hits[0]["model"] and hits[0]["text"]
    hybrid = live.post("/v1/search", json={"question": "longest river in Africa", "mode": "hybrid"}).json()["hits"]
    assert hybrid[0]["doc_id"] == "nile"
    only = live.post("/v1/search", json={"question": "animals", "filters": {"topic": "programming"}}).json()["hits"]
    assert [h["doc_id"] for h in only] == ["python-files"]

    after = live.get("/metrics").text
    assert metric(after, "dpr_passages_ingested_total") - metric(before, "dpr_passages_ingested_total") >= 4
    assert metric(after, "dpr_documents_ingested_total", outcome="written") == 4 + metric(
        before, "dpr_documents_ingested_total", outcome="written")
    assert metric(after, "dpr_ingest_failures_total", reason="empty") >= 1
    assert metric(after, "dpr_encode_seconds_count") >= 1
    assert metric(after, "dpr_upsert_seconds_count") >= 1
    assert metric(after, "dpr_query_seconds_count", mode="hybrid") >= 1

    deleted = live.delete("/v1/documents/cats")
    assert deleted.status_code == 200 and deleted.json()["points_deleted"] >= 1
    gone = live.post("/v1/search", json={"question": "cats purr", "k": 10}).json()["hits"]
    assert "cats" not in {h["doc_id"] for h in gone}
    assert live.delete("/v1/documents/cats").status_code == 404


def test_upload_and_errors_over_http(live: httpx.Client) -> None:
    page = b"<html><head><title>Bees</title></head><body><p>Bees make honey from flower nectar.</p></body></html>"
    r = live.post("/v1/documents", files={"file": ("bees.html", page, "text/html")})
    assert r.status_code == 202, r.text
    assert wait_job(live, r.json()["job"])["documents"] == 1
    hit = live.post("/v1/search", json={"question": "Who makes honey?", "k": 1}).json()["hits"][0]
    assert (hit["doc_id"], hit["title"]) == ("bees.html", "Bees")

    for response, status in [
        (live.post("/v1/search", json={"question": "q", "k": 0}), 422),
        (live.post("/v1/search", json={"question": "   "}), 422),  # the schema's pattern: not blank
        (live.post("/v1/search", content=b"{", headers={"content-type": "application/json"}), 422),
        (live.get("/v1/jobs/does-not-exist"), 404),
        (live.post("/v1/documents", content=b"x" * 11_000_000, headers={"content-type": "application/json"}), 413),
    ]:
        assert response.status_code == status, response.text
        assert response.json()["error"]["message"]


def test_health_ready_and_openapi(live: httpx.Client) -> None:
    assert live.get("/healthz").json() == {"status": "ok"}
    ready = live.get("/readyz").json()
    assert ready["status"] == "ready" and ready["checks"]["store"]["backend"] == "edge"
    spec = live.get("/openapi.json").json()
    assert spec["openapi"].startswith("3.") and "/v1/search" in spec["paths"]


def test_serve_with_redis_and_a_worker(make_cluster: Any) -> None:
    """The deployment shape: `dpr serve` and a `dpr worker` sharing a real Redis and the embedded store."""
    cluster = make_cluster()
    cluster.start_worker()
    server = ServeProcess(cluster.env, cluster.root)
    try:
        ready = wait_ready(server.url, timeout=120, process=server.process, log=server.log)
        assert ready["checks"]["broker"]["ok"] is True
        with httpx.Client(base_url=server.url, timeout=60) as client:
            r = client.post("/v1/documents", json={"documents": DOCS})
            assert r.status_code == 202, r.text
            assert r.json()["executor"] == "broker"
            job = wait_job(client, r.json()["job"], timeout=180)
            assert job["state"] == "done", (job, cluster.logs())
            assert job["documents"] == 4
            hits = client.post("/v1/search", json={"question": "What do plants make from light?"}).json()["hits"]
            assert hits[0]["doc_id"] == "photosynthesis"
            metrics = client.get("/metrics").text
            assert metric(metrics, "dpr_ingest_jobs_total", executor="broker") == 1
            assert metric(metrics, "dpr_queue_depth") == 0
    finally:
        code = server.stop()
        log = server.log.read_text(errors="replace")
    assert code in (0, -15), log  # uvicorn re-raises SIGTERM after its graceful shutdown
    assert "Traceback" not in log, log
