"""The serving runtime's question batcher: one per process (docs/capacity.md).

Concurrent searches with the same options that reach the batcher while it is busy (or, with
``serving.batch_window_ms`` set, within that many milliseconds of the first of a batch) run as one
``Runtime.search_many`` call (at most ``serving.max_batch`` questions): one look at the active generation, one
question-tower call, then the store searches back to back in one store session (on the edge one lease turn, not
one per question: under load a turn and the lock in front of it cost more than the search). A question alone takes
the same path as a batch of one. ``serving.encoders`` threads (2: one encodes while the other searches) take the
work from one queue: each waits out a window only while questions come together (the last batch held more than
one), so a lone question is answered at once. Each caller waits for its own answer.

The ONNX question tower encodes a row the same alone or in a batch (bitwise:
tests/integration/test_question_batching.py), so batching changes no answer. Encodings of repeated questions come
from a bounded LRU keyed by the tower's fingerprint and the text. ``serving.batching`` false: each caller searches
and encodes its own questions on its own thread (the cache still answers repeats).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from encoders.towers import DualEncoder
from services.core.errors import PermanentError
from services.core.settings import ServingSettings

log = logging.getLogger(__name__)

BatchObserver = Callable[[int, list[float]], None]
"""Called after each batch with its size and each question's wait in the queue (seconds)."""
Run = Callable[[list[str]], Any]
"""A batch's work: its distinct texts -> one result each, in order (a list, or an array's rows)."""
CacheObserver = Callable[[int, int], None]
"""Called after each cache lookup with the questions found and the questions missed."""


@dataclass(eq=False)
class _Item:
    key: Hashable  # items with equal keys share one ``run``
    run: Run  # distinct texts -> one result each, in order
    text: str
    queued: float = field(default_factory=time.perf_counter)
    result: Any = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)
    wake: Callable[[], object] | None = None  # an event loop's caller (``ask_async``)


class QuestionBatcher:
    def __init__(self, batching: bool = True, window_s: float = 0.0, max_batch: int = 32, cache_size: int = 4096,
                 on_batch: BatchObserver | None = None, encoders: int = 1,
                 on_cache: CacheObserver | None = None) -> None:
        self.batching = batching
        self.encoders = encoders
        self.window_s = window_s
        self.max_batch = max_batch
        self.cache_size = cache_size
        self.on_batch = on_batch
        self.on_cache = on_cache
        self._cache: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self._cache_lock = threading.Lock()
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._start_lock = threading.Lock()
        self._last = 1  # size of the last batch: the window is waited only while questions come together

    @classmethod
    def from_settings(cls, s: ServingSettings, on_batch: BatchObserver | None = None,
                      on_cache: CacheObserver | None = None) -> QuestionBatcher:
        return cls(s.batching, s.batch_window_ms / 1000, s.max_batch, s.cache_size, on_batch, s.encoders, on_cache)

    def ask(self, key: Hashable, run: Run, text: str) -> Any:
        """``run([text])[0]``, in a batch with the texts other callers ask with an equal ``key`` at the same time
        (``run`` of the distinct texts, once); on this thread with batching off."""
        if not self.batching:
            return run([text])[0]
        item = self._enqueue(_Item(key, run, text))
        item.done.wait()
        if item.error is not None:
            raise item.error
        return item.result

    async def ask_async(self, key: Hashable, run: Run, text: str) -> Any:
        """``ask`` from an event loop, with batching on: the loop waits for the batch without a thread of its own."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Any] = loop.create_future()
        item = _Item(key, run, text)
        item.wake = lambda: loop.call_soon_threadsafe(_settle, answer, item)
        self._enqueue(item)
        return await answer

    def encode(self, towers: DualEncoder, questions: list[str]) -> np.ndarray:
        """``towers.encode_queries(questions)``, row for row: repeats from the cache, the others in one call on this
        thread (a batch's own ``search_many``, which ``ask`` already shares among concurrent callers)."""
        fingerprint = towers.fingerprint
        rows: list[np.ndarray | None] = [self._cached(fingerprint, q) for q in questions]
        missing = [i for i, row in enumerate(rows) if row is None]
        if self.cache_size and self.on_cache is not None:
            self.on_cache(len(rows) - len(missing), len(missing))
        if missing:
            texts = [questions[i] for i in missing]
            vectors = towers.encode_queries(texts, len(texts))
            for i, v in zip(missing, vectors, strict=True):
                rows[i] = v
                self._remember(fingerprint, questions[i], v)
        if not rows:
            return np.zeros((0, towers.dim), dtype=np.float32)
        return np.stack(rows)  # type: ignore[arg-type]  # (n, dim)

    def close(self) -> None:
        with self._start_lock:
            for _ in self._threads:
                self._queue.put(None)
            for thread in self._threads:
                thread.join(timeout=5)
            self._threads = []

    # --- cache --------------------------------------------------------------------------------------------------
    def _cached(self, fingerprint: str, text: str) -> np.ndarray | None:
        if not self.cache_size:
            return None
        with self._cache_lock:
            row = self._cache.get((fingerprint, text))
            if row is not None:
                self._cache.move_to_end((fingerprint, text))
            return row

    def _remember(self, fingerprint: str, text: str, row: np.ndarray) -> None:
        if not self.cache_size:
            return
        row = row.copy()  # not a view that keeps its whole batch alive
        with self._cache_lock:
            self._cache[(fingerprint, text)] = row
            self._cache.move_to_end((fingerprint, text))
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    # --- batches ------------------------------------------------------------------------------------------------
    def _enqueue(self, item: _Item) -> _Item:
        self._start()
        self._queue.put(item)
        return item

    def _start(self) -> None:
        if not self._threads:
            with self._start_lock:
                if not self._threads:
                    self._threads = [threading.Thread(target=self._loop, name="dpr-question-batcher", daemon=True)
                                     for _ in range(self.encoders)]
                    for thread in self._threads:
                        thread.start()

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            deadline = time.perf_counter() + (self.window_s if self._last > 1 else 0.0)
            while len(batch) < self.max_batch:
                remaining = deadline - time.perf_counter()
                try:
                    item = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)  # stop after this batch
                    break
                batch.append(item)
            self._last = len(batch)
            self._run(batch)

    def _run(self, batch: list[_Item]) -> None:
        started = time.perf_counter()
        waits = [started - item.queued for item in batch]
        groups: dict[Hashable, list[_Item]] = {}  # by key: a re-embed's switch can put two towers in one batch
        for item in batch:
            groups.setdefault(item.key, []).append(item)
        for items in groups.values():
            unique = list(dict.fromkeys(item.text for item in items))
            results: dict[str, tuple[Any, BaseException | None]]
            try:
                results = {t: (r, None) for t, r in zip(unique, items[0].run(unique), strict=True)}
            except PermanentError as e:  # a bad question (refused at once): each alone, so it fails only its own
                results = {unique[0]: (None, e)} if len(unique) == 1 else {t: _alone(items[0].run, t) for t in unique}
            except Exception as e:  # the tower's, the store's: every caller raises it
                results = dict.fromkeys(unique, (None, e))
            for item in items:
                item.result, item.error = results[item.text]
                item.done.set()
                if item.wake is not None:
                    try:
                        item.wake()
                    except RuntimeError:  # its event loop has closed: nobody waits any more
                        pass
        if self.on_batch is not None:
            try:
                self.on_batch(len(batch), waits)
            except Exception:  # metrics must never fail a question
                log.exception("the batch observer failed")


def _settle(answer: asyncio.Future[Any], item: _Item) -> None:
    if answer.done():  # the caller went away
        return
    if item.error is not None:
        answer.set_exception(item.error)
    else:
        answer.set_result(item.result)


def _alone(run: Run, text: str) -> tuple[Any, BaseException | None]:
    try:
        return run([text])[0], None
    except Exception as e:
        return None, e


class BatchedQuestionTowers:
    """Towers whose ``encode_queries`` goes through a process's ``QuestionBatcher``'s cache; everything else is the
    towers' own (fingerprint, dim, similarity: what ``services.query`` checks against the collection)."""

    def __init__(self, towers: DualEncoder, batcher: QuestionBatcher) -> None:
        self._towers = towers
        self._batcher = batcher

    def __getattr__(self, name: str) -> Any:
        return getattr(self._towers, name)

    def encode_queries(self, questions: list[str], batch_size: int = 32) -> np.ndarray:
        return self._batcher.encode(self._towers, questions)
