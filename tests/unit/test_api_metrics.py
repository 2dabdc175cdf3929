"""Prometheus metrics change with the work the API does (one registry per app)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from kit.fakes import FakeRuntime
from prometheus_client.parser import text_string_to_metric_families

from entrypoints.api.app import create_app
from services.core.settings import Settings

pytestmark = pytest.mark.unit


def samples(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_change_after_ingest_and_search(tmp_path: Path) -> None:
    app = create_app(Settings(data_dir=tmp_path), runtime=FakeRuntime(), warm_model=False)
    with TestClient(app) as c:
        before = samples(c)
        assert before[("dpr_passages_ingested_total", ())] == 0
        assert before[("dpr_queue_depth", ())] == 0
        docs = [{"id": "a", "text": "Alpha particles are helium nuclei."}, {"id": "b", "text": ""},
                {"id": "c", "text": "Beta decay emits electrons."}]
        job = c.post("/v1/documents", json={"documents": docs}).json()["job"]
        deadline = time.monotonic() + 10
        while c.get(f"/v1/jobs/{job}").json()["state"] not in ("done", "failed") and time.monotonic() < deadline:
            time.sleep(0.02)
        c.post("/v1/search", json={"question": "helium", "k": 1})
        after = samples(c)

    assert after[("dpr_passages_ingested_total", ())] == 2
    assert after[("dpr_documents_ingested_total", (("outcome", "written"),))] == 2
    assert after[("dpr_documents_ingested_total", (("outcome", "failed"),))] == 1
    assert after[("dpr_ingest_failures_total", (("reason", "empty"),))] == 1
    assert after[("dpr_encode_seconds_count", ())] == 1
    assert after[("dpr_upsert_seconds_count", ())] >= 1
    assert after[("dpr_query_seconds_count", (("mode", "default"),))] == 1
    assert after[("dpr_ingest_jobs_total", (("executor", "local"),))] == 1
    assert after[("dpr_http_requests_total", (("method", "POST"), ("route", "/v1/search"), ("status", "200")))] == 1
    # raw paths never become label values (bounded cardinality)
    assert not any("route" in dict(labels) and job in dict(labels)["route"] for _, labels in after)


def test_each_app_has_its_own_registry(tmp_path: Path) -> None:
    a = create_app(Settings(data_dir=tmp_path / "a"), runtime=FakeRuntime(), warm_model=False)
    b = create_app(Settings(data_dir=tmp_path / "b"), runtime=FakeRuntime(), warm_model=False)
    with TestClient(a) as ca, TestClient(b) as cb:
        ca.get("/healthz")
        ca.get("/healthz")
        key = ("dpr_http_requests_total", (("method", "GET"), ("route", "/healthz"), ("status", "200")))
        assert samples(ca)[key] == 2
        assert samples(cb).get(key, 0) == 0
