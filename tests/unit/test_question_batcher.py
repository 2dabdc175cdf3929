"""The serving runtime's question batcher (services/serving.py) over fake towers: concurrent questions share one
tower call, each caller gets its own rows, repeats come from a bounded cache per model, a tower's error reaches
every caller of its batch, and the API shows batch sizes and queue waits in /metrics."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from kit.documents import THREE_TOPICS
from kit.fakes import FakeRuntime, HashTowers, ingest_items

from entrypoints.api.app import create_app
from services.core.errors import ConfigError
from services.core.settings import ServingSettings, Settings
from services.query import QueryOptions, search
from services.serving import QuestionBatcher

pytestmark = pytest.mark.unit


class GatedTowers(HashTowers):
    """Hash towers that record each call's questions and the thread it ran on; a call blocks while ``gate`` is
    clear, so questions pile up behind it; ``fail`` makes calls raise."""

    def __init__(self, name: str = "hash-a") -> None:
        super().__init__(name=name)
        self.calls: list[list[str]] = []
        self.threads: list[str] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail = False

    def encode_queries(self, questions: list[str], batch_size: int = 32) -> np.ndarray:
        self.calls.append(list(questions))
        self.threads.append(threading.current_thread().name)
        self.gate.wait()
        if self.fail:
            raise RuntimeError("tower down")
        return super().encode_queries(questions, batch_size)


def encoded(batcher: QuestionBatcher, towers: GatedTowers, question: str) -> np.ndarray:
    """``question``'s row through the batcher's queue: its work a bare question-tower call."""
    return batcher.ask(id(towers), lambda texts: towers.encode_queries(texts, len(texts)), question)  # type: ignore[no-any-return]


def ask_together(batcher: QuestionBatcher, towers: GatedTowers, questions: list[str]) -> dict[str, np.ndarray]:
    """The first question's call blocks until every other question waits in the queue, then all are released."""
    towers.gate.clear()
    out: dict[str, np.ndarray] = {}

    def ask(q: str) -> None:
        out[q] = encoded(batcher, towers, q)

    first = threading.Thread(target=ask, args=(questions[0],))
    first.start()
    while not towers.calls:
        time.sleep(0.001)
    rest = [threading.Thread(target=ask, args=(q,)) for q in questions[1:]]
    for t in rest:
        t.start()
    while batcher._queue.qsize() < len(rest):
        time.sleep(0.001)
    towers.gate.set()
    for t in [first, *rest]:
        t.join()
    return out


def test_questions_waiting_together_share_one_call_and_get_their_own_rows() -> None:
    towers = GatedTowers()
    batcher = QuestionBatcher(window_s=0.0, max_batch=32, cache_size=0)
    questions = [f"question number {i} about topic {i % 3}" for i in range(9)]
    out = ask_together(batcher, towers, questions)
    assert [len(c) for c in towers.calls] == [1, 8]  # the lone first, then everyone who queued behind it
    direct = HashTowers().encode_queries(questions)
    for i, q in enumerate(questions):
        np.testing.assert_array_equal(out[q], direct[i])
    assert set(towers.threads) == {"dpr-question-batcher"}
    batcher.close()


def test_max_batch_caps_a_call_and_the_same_question_is_encoded_once_per_call() -> None:
    towers = GatedTowers()
    batcher = QuestionBatcher(window_s=0.0, max_batch=3, cache_size=0)
    ask_together(batcher, towers, ["first", "x", "y", "z", "w"])
    assert [len(c) for c in towers.calls] == [1, 3, 1]
    towers.calls.clear()
    out = ask_together(batcher, towers, ["a b", "same", "same"])
    assert towers.calls == [["a b"], ["same"]]  # one row for both askers
    np.testing.assert_array_equal(out["same"], HashTowers().encode_queries(["same"])[0])
    batcher.close()


def test_a_lone_question_does_not_wait_out_the_window() -> None:
    towers = GatedTowers()
    batcher = QuestionBatcher(window_s=30.0, cache_size=0)
    t0 = time.perf_counter()
    encoded(batcher, towers, "alone")
    assert time.perf_counter() - t0 < 10  # a wait would take 30 s
    assert towers.calls == [["alone"]]
    batcher.close()


def test_the_window_gathers_questions_that_arrive_soon_after_under_load() -> None:
    towers = GatedTowers()
    batcher = QuestionBatcher(window_s=0.5, max_batch=4, cache_size=0)
    ask_together(batcher, towers, ["one", "two", "three"])  # [1], [2]: now questions come together
    towers.calls.clear()
    out: list[np.ndarray] = []
    threads = [threading.Thread(target=lambda q=q: out.append(encoded(batcher, towers, q))) for q in "abcd"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(len(c) for c in towers.calls) == [4]  # all four within the window, in one call (max_batch 4)
    batcher.close()


def test_repeats_come_from_a_bounded_cache_keyed_by_the_model() -> None:
    a, b = GatedTowers("hash-a"), GatedTowers("hash-b")
    batcher = QuestionBatcher(cache_size=2)
    first = batcher.encode(a, ["alpha", "beta"])
    again = batcher.encode(a, ["beta", "alpha"])
    assert a.calls == [["alpha", "beta"]]
    np.testing.assert_array_equal(again, first[::-1])
    other = batcher.encode(b, ["alpha"])  # another model: its own vector, not model a's
    assert b.calls == [["alpha"]] and not np.array_equal(other[0], first[0])
    batcher.encode(a, ["alpha", "beta"])  # the cache holds 2: (b, alpha) pushed out (a, beta), used least lately
    assert a.calls[-1] == ["beta"]
    assert set(a.threads) == {threading.current_thread().name}  # a batch's own search_many: no queue
    batcher.close()


def test_a_towers_error_reaches_every_caller_and_the_next_batch_works() -> None:
    towers = GatedTowers()
    towers.fail = True
    batcher = QuestionBatcher(window_s=0.0, cache_size=0)
    with pytest.raises(RuntimeError, match="tower down"):
        encoded(batcher, towers, "q1")
    towers.fail = False
    assert encoded(batcher, towers, "q1").shape == (towers.dim,)
    batcher.close()


def test_batching_off_encodes_on_the_callers_thread() -> None:
    towers = GatedTowers()
    batcher = QuestionBatcher.from_settings(ServingSettings(batching=False, cache_size=0))
    encoded(batcher, towers, "q")
    assert towers.threads == [threading.current_thread().name]


def test_the_api_answers_the_same_through_the_batcher_and_metrics_show_it(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    texts = ["Alpha particles are helium nuclei.", "Beta decay emits electrons.", "Gamma rays are photons."]
    app = create_app(Settings(data_dir=tmp_path), runtime=runtime, warm_model=False)
    with TestClient(app) as c:
        job = c.post("/v1/documents", json={"documents": [{"id": str(i), "text": t} for i, t in enumerate(texts)]})
        deadline = time.monotonic() + 10
        while c.get(f"/v1/jobs/{job.json()['job']}").json()["state"] != "done" and time.monotonic() < deadline:
            time.sleep(0.02)
        answer = c.post("/v1/search", json={"question": "which decay emits electrons", "k": 2}).json()["hits"]
        again = c.post("/v1/search", json={"question": "which decay emits electrons", "k": 2}).json()["hits"]
        alone = search("which decay emits electrons", store=runtime.store, towers=HashTowers(),
                       options=QueryOptions(k=2), sparse=runtime.sparse)  # the same towers, no batcher
        metrics = c.get("/metrics").text
    assert len(answer) == 2
    assert [(h["doc_id"], h["score"]) for h in answer] == [(h.passage.doc_id, h.score) for h in alone]
    assert again == answer  # the second time from the cache
    assert "dpr_question_batch_size_count 2.0" in metrics  # each search a batch (of one)
    assert "dpr_question_queue_seconds_count 2.0" in metrics
    assert 'dpr_question_cache_lookups_total{result="hit"} 1.0' in metrics
    assert 'dpr_question_cache_lookups_total{result="miss"} 1.0' in metrics


def test_two_encoders_run_two_calls_at_once_and_close_stops_both() -> None:
    towers = GatedTowers()
    towers.gate.clear()
    batcher = QuestionBatcher(window_s=0.0, cache_size=0, encoders=2)
    threads = [threading.Thread(target=encoded, args=(batcher, towers, q)) for q in ("one", "two")]
    deadline = time.monotonic() + 10
    for n, t in enumerate(threads, 1):  # the second asked only once the first is in the tower: asked together, one
        t.start()  # encoder could take both into one batch (it did, and this loop waited forever)
        while len(towers.calls) < n and time.monotonic() < deadline:  # both in the tower, neither has returned
            time.sleep(0.001)
    towers.gate.set()
    for t in threads:
        t.join()
    assert sorted(map(tuple, towers.calls)) == [("one",), ("two",)]
    workers = list(batcher._threads)
    batcher.close()
    assert len(workers) == 2 and not any(w.is_alive() for w in workers)


def test_searches_asked_together_share_one_run_and_a_bad_question_fails_only_its_caller() -> None:
    runs: list[list[str]] = []
    gate = threading.Event()

    def run(texts: list[str]) -> list[str]:
        runs.append(list(texts))
        gate.wait()
        if "bad" in texts:
            raise ConfigError("bad question")
        return [t.upper() for t in texts]

    batcher = QuestionBatcher(window_s=0.0, cache_size=0)
    out: dict[str, object] = {}

    def ask(q: str) -> None:
        try:
            out[q] = batcher.ask("options", run, q)
        except ConfigError as e:
            out[q] = e

    first = threading.Thread(target=ask, args=("first",))
    first.start()
    while not runs:
        time.sleep(0.001)
    rest = [threading.Thread(target=ask, args=(q,)) for q in ("a", "bad", "b")]
    for t in rest:
        t.start()
    while batcher._queue.qsize() < len(rest):
        time.sleep(0.001)
    gate.set()
    for t in [first, *rest]:
        t.join()
    assert runs[:2] == [["first"], ["a", "bad", "b"]]  # the three that queued: one run, then each alone
    assert sorted(map(tuple, runs[2:])) == [("a",), ("b",), ("bad",)]
    assert out["first"] == "FIRST" and out["a"] == "A" and out["b"] == "B"
    assert isinstance(out["bad"], ConfigError)
    batcher.close()


def test_a_batch_of_searches_holds_one_store_session_and_answers_as_one_at_a_time() -> None:
    runtime = FakeRuntime()
    ingest_items(runtime.pipeline, THREE_TOPICS)
    questions = ["where does the nile flow", "what do cats eat", "rivers of africa"]
    alone = [runtime.search(q, QueryOptions(k=2)) for q in questions]  # no batcher: a session each
    store = runtime.store._store  # type: ignore[attr-defined]  # the serialised store's own
    sessions: list[str] = []
    opened = store.session
    store.session = lambda: sessions.append("session") or opened()
    runtime.use_batcher(QuestionBatcher(cache_size=0))
    assert runtime.search_many(questions, QueryOptions(k=2)) == alone
    assert sessions == ["session"]  # the three searches in one session (the edge: one lease turn)
    runtime.close()


def test_an_event_loop_waits_for_its_batch_without_a_thread_and_gets_its_own_answer_or_error() -> None:
    import asyncio

    runs: list[list[str]] = []
    threads: list[str] = []

    def run(texts: list[str]) -> list[str]:
        runs.append(list(texts))
        threads.append(threading.current_thread().name)
        if "bad" in texts:
            raise ConfigError("bad question")
        return [t.upper() for t in texts]

    batcher = QuestionBatcher(window_s=0.0, cache_size=0)

    async def ask_all() -> list[object]:
        return await asyncio.gather(*(batcher.ask_async("options", run, q) for q in ("a", "bad", "b")),
                                    return_exceptions=True)

    a, bad, b = asyncio.run(ask_all())
    assert (a, b) == ("A", "B") and isinstance(bad, ConfigError)
    assert set(threads) == {"dpr-question-batcher"} and sorted(q for r in runs for q in r if len(r) == 1) == [
        "a", "b", "bad"]  # each alone once the batch failed (or alone from the start)
    batcher.close()


def test_the_api_with_batching_off_answers_the_same_without_a_batch(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    ingest_items(runtime.pipeline, THREE_TOPICS)
    settings = Settings(data_dir=tmp_path, serving=ServingSettings(batching=False))
    with TestClient(create_app(settings, runtime=runtime, warm_model=False)) as c:
        hits = c.post("/v1/search", json={"question": "where does the nile flow", "k": 2}).json()["hits"]
        metrics = c.get("/metrics").text
        alone = search("where does the nile flow", store=runtime.store, towers=HashTowers(),
                       options=QueryOptions(k=2), sparse=runtime.sparse)
    assert [(h["doc_id"], h["score"]) for h in hits] == [(h.passage.doc_id, h.score) for h in alone]
    assert "dpr_question_batch_size_count 0.0" in metrics  # no batch
