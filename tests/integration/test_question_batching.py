"""Batching changes no answer, on the real ONNX question tower (fp32, as `dpr serve` runs it) over a real data dir
(tests/fixtures/datadir-v1): a batch encodes each question exactly as alone, and questions asked by 16 threads at
once through the process's batcher get the same hits and scores as the same questions asked one at a time."""

from __future__ import annotations

import tarfile
import threading
from pathlib import Path

import numpy as np
import pytest

from entrypoints.api.app import serving_settings
from services.core.settings import Settings
from services.query import QueryOptions
from services.runtime import Runtime
from services.serving import QuestionBatcher
from services.store.points import Hit

pytestmark = pytest.mark.integration

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "datadir-v1"
QUESTIONS = [
    "How do I read a file line by line?", "What is a list comprehension?", "sorting a dictionary by value",
    "How are exceptions raised and caught?", "What does the with statement do?", "regular expressions",
    "How do I start a thread?", "What is the difference between a tuple and a list?", "json",
    "Which module parses command line arguments?", "How do I format a string with numbers?", "virtual environments",
    "What happens when a generator is exhausted?", "closing files", "How are classes defined?", "decorators",
]


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Runtime:
    root = tmp_path_factory.mktemp("batching")
    with tarfile.open(FIXTURE / "datadir.tar.xz") as tar:
        tar.extractall(root, filter="data")  # a real ingest's data dir (its SOURCE.md)
    rt = Runtime(serving_settings(Settings(data_dir=root / "data")), serialize_store=True)
    assert rt.question_backend == Settings().encoder.questions  # chosen from the CPU
    return rt


def test_a_batch_encodes_each_question_as_alone(runtime: Runtime) -> None:
    towers = runtime.question_towers
    alone = np.stack([towers.encode_queries([q])[0] for q in QUESTIONS])  # (16, dim)
    batched = QuestionBatcher(cache_size=0).encode(towers, QUESTIONS)  # a batch's one tower call for all of them
    np.testing.assert_array_equal(batched, alone)  # bitwise


def test_concurrent_questions_get_the_same_hits_and_scores_as_one_at_a_time(runtime: Runtime) -> None:
    modes = [QueryOptions(k=5, mode="dense"), QueryOptions(k=5, mode="hybrid")]

    def answers(hits: list[Hit]) -> list[tuple[str, int, float]]:
        return [(h.passage.doc_id, h.passage.chunk_index, h.score) for h in hits]

    one_at_a_time = {(q, i): answers(runtime.search(q, o)) for q in QUESTIONS for i, o in enumerate(modes)}
    sizes: list[int] = []
    runtime.use_batcher(QuestionBatcher(window_s=0.005, cache_size=0, on_batch=lambda n, _: sizes.append(n)))
    together: dict[tuple[str, int], list[tuple[str, int, float]]] = {}
    start = threading.Barrier(len(QUESTIONS))

    def ask(q: str) -> None:
        start.wait()
        for i, o in enumerate(modes):
            together[(q, i)] = answers(runtime.search(q, o))

    threads = [threading.Thread(target=ask, args=(q,)) for q in QUESTIONS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(sizes) == 2 * len(QUESTIONS)  # every question went through the batcher
    assert all(one_at_a_time.values())
    assert together == one_at_a_time
