"""Prometheus metrics of one API process, in a registry of its own (one per app, so tests and several apps in one
process never collide on the global registry).

Instrumentation sits at the service boundaries: ``observe_ingest`` reads the per-batch ``IngestReport`` the
pipeline already hands its ``progress`` callback, ``TimedStore`` times the store calls, the search route times
``services.query.search``. The services themselves are not changed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from services.ingest.pipeline import IngestReport

__all__ = ["CONTENT_TYPE_LATEST", "ApiMetrics"]

# Seconds. Query latency lives in 1 ms .. 10 s; a batch encode in 10 ms .. 5 min.
QUERY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
QUEUE_BUCKETS = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
QUESTION_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
BATCH_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class ApiMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.documents = Counter(
            "dpr_documents_ingested", "Documents processed by ingest, by outcome (written, unchanged, failed, "
            "skipped).", ["outcome"], registry=r,
        )
        self.passages = Counter("dpr_passages_ingested", "Passages encoded and written to the store.", registry=r)
        self.failures = Counter(
            "dpr_ingest_failures", "Documents that failed ingest, by reason (empty, encoding, oversized, ...).",
            ["reason"], registry=r,
        )
        self.encode_seconds = Histogram(
            "dpr_encode_seconds", "Passage-tower encode time per ingest batch.", buckets=BATCH_BUCKETS, registry=r
        )
        self.upsert_seconds = Histogram(
            "dpr_upsert_seconds", "Store upsert time per call.", buckets=BATCH_BUCKETS, registry=r
        )
        self.query_seconds = Histogram(
            "dpr_query_seconds", "services.query.search time (question tower + store search), by mode.",
            ["mode"], buckets=QUERY_BUCKETS, registry=r,
        )
        self.question_batch = Histogram(
            "dpr_question_batch_size", "Questions per batch (services/serving.py: concurrent searches share one "
            "question-tower call and one store session).", buckets=QUESTION_BATCH_SIZES, registry=r,
        )
        self.question_queue_seconds = Histogram(
            "dpr_question_queue_seconds", "Time a question waited for its batch to start.",
            buckets=QUEUE_BUCKETS, registry=r,
        )
        self.question_cache = Counter(
            "dpr_question_cache_lookups", "Questions looked up in the encoding cache, by result (hit, miss).",
            ["result"], registry=r,
        )
        self.jobs = Counter(
            "dpr_ingest_jobs", "Ingest jobs accepted by the API, by executor.", ["executor"], registry=r
        )
        self.queue_depth = Gauge(
            "dpr_queue_depth", "Ingest work waiting: broker queue length (with a broker) or pending in-process jobs.",
            registry=r,
        )
        self.http_requests = Counter(
            "dpr_http_requests", "HTTP requests by route template, method and status.",
            ["route", "method", "status"], registry=r,
        )
        self.http_seconds = Histogram(
            "dpr_http_request_seconds", "HTTP request latency by route template.", ["route"],
            buckets=QUERY_BUCKETS, registry=r,
        )

    def observe_ingest(self, part: IngestReport) -> None:
        """One in-process batch's report, as the local executor hands it to its ``on_batch`` hook."""
        self.documents.labels("written").inc(part.documents)
        self.documents.labels("unchanged").inc(part.unchanged)
        self.documents.labels("failed").inc(len(part.failed))
        self.documents.labels("skipped").inc(len(part.skipped))
        self.passages.inc(part.chunks)
        for failure in part.failed:
            self.failures.labels(failure.get("reason") or "unknown").inc()
        if part.chunks:
            self.encode_seconds.observe(part.encode_seconds)
            self.upsert_seconds.observe(part.upsert_seconds)

    def observe_question_batch(self, size: int, waits: list[float]) -> None:
        """One question-tower call of the process's batcher: its size and each question's wait for it."""
        self.question_batch.observe(size)
        for wait in waits:
            self.question_queue_seconds.observe(wait)

    def observe_question_cache(self, hits: int, misses: int) -> None:
        self.question_cache.labels("hit").inc(hits)
        self.question_cache.labels("miss").inc(misses)

    def set_queue_depth_source(self, source: Callable[[], float]) -> None:
        """Read the queue depth when scraped (a broker round trip per scrape, not per request)."""

        def read() -> float:
            try:
                return float(source())
            except Exception:  # a scrape must not fail because the broker is down; readyz reports that
                return float("nan")

        self.queue_depth.set_function(read)

    @contextmanager
    def time_query(self, mode: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.query_seconds.labels(mode).observe(time.perf_counter() - t0)

    def observe_http(self, route: str, method: str, status: int, seconds: float) -> None:
        self.http_requests.labels(route, method, str(status)).inc()
        self.http_seconds.labels(route).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
