"""The serving runtime's question batcher: one per process, in front of the question tower (docs/capacity.md).

Questions that reach the tower while it is busy (or, with ``serving.batch_window_ms`` set, within that many
milliseconds of the first of a batch) share one ``encode_queries`` call (at most ``serving.max_batch`` questions);
a question alone takes the same path as a batch of one. ``serving.encoders`` threads (2: a call runs on one core,
and two cores answer more than one) take the questions from one queue: each waits out a window only while
questions come together (the last batch held more than one), so a lone question is encoded at once. Each caller
waits for its own rows.

The ONNX question tower encodes a row the same alone or in a batch (bitwise:
tests/integration/test_question_batching.py), so batching changes no answer. Encodings of repeated questions come
from a bounded LRU keyed by the tower's fingerprint and the text. ``serving.batching`` false: each caller encodes
its own questions on its own thread (the cache still answers repeats).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from encoders.towers import DualEncoder
from services.core.settings import ServingSettings

log = logging.getLogger(__name__)

BatchObserver = Callable[[int, list[float]], None]
"""Called after each tower call with the batch's size and each question's wait in the queue (seconds)."""
CacheObserver = Callable[[int, int], None]
"""Called after each cache lookup with the questions found and the questions missed."""


@dataclass(eq=False)
class _Item:
    towers: DualEncoder
    text: str
    queued: float = field(default_factory=time.perf_counter)
    vector: np.ndarray | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


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

    def encode(self, towers: DualEncoder, questions: list[str]) -> np.ndarray:
        """``towers.encode_queries(questions)``, row for row, through the cache and the shared batches."""
        fingerprint = towers.fingerprint
        rows: list[np.ndarray | None] = [self._cached(fingerprint, q) for q in questions]
        missing = [i for i, row in enumerate(rows) if row is None]
        if self.cache_size and self.on_cache is not None:
            self.on_cache(len(rows) - len(missing), len(missing))
        if missing:
            texts = [questions[i] for i in missing]
            vectors = self._batched(towers, texts) if self.batching else list(towers.encode_queries(texts, len(texts)))
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
    def _batched(self, towers: DualEncoder, texts: list[str]) -> list[np.ndarray]:
        self._start()
        items = [_Item(towers, t) for t in texts]
        for item in items:
            self._queue.put(item)
        for item in items:
            item.done.wait()
            if item.error is not None:
                raise item.error
        return [item.vector for item in items]  # type: ignore[misc]

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
        groups: dict[int, list[_Item]] = {}  # by tower: a re-embed's switch can put two in one batch
        for item in batch:
            groups.setdefault(id(item.towers), []).append(item)
        for items in groups.values():
            unique = list(dict.fromkeys(item.text for item in items))
            try:
                vectors = items[0].towers.encode_queries(unique, batch_size=len(unique))  # (unique, dim)
                by_text = dict(zip(unique, vectors, strict=True))
                for item in items:
                    item.vector = by_text[item.text]
            except Exception as e:  # each caller raises the tower's error itself
                for item in items:
                    item.error = e
            for item in items:
                item.done.set()
        if self.on_batch is not None:
            try:
                self.on_batch(len(batch), waits)
            except Exception:  # metrics must never fail a question
                log.exception("the batch observer failed")


class BatchedQuestionTowers:
    """Towers whose ``encode_queries`` goes through a process's ``QuestionBatcher``; everything else is the
    towers' own (fingerprint, dim, similarity: what ``services.query`` checks against the collection)."""

    def __init__(self, towers: DualEncoder, batcher: QuestionBatcher) -> None:
        self._towers = towers
        self._batcher = batcher

    def __getattr__(self, name: str) -> Any:
        return getattr(self._towers, name)

    def encode_queries(self, questions: list[str], batch_size: int = 32) -> np.ndarray:
        return self._batcher.encode(self._towers, questions)
