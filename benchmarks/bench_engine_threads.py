"""Can two threads of one process search the embedded engine at once? (issue 42: hybrid <= 1.3x dense at 1M)

Opens the active generation's shard of a kept data dir (e.g. bench_scale.py --keep) with qdrant-edge directly and
times, with real SciFact questions (the BM25 query vectors of the collection's own embedder; the dense vectors
random unit vectors, which cost the HNSW walk the same):

1. dense alone, sparse (BM25) alone, and both one after the other, per question;
2. both branches of each question at once: the sparse one on a second thread;
3. the dense queries twice over: one thread after the other, then two threads at once.

If the engine let go of Python's GIL while it searches, (2) would approach the slower branch alone and (3) would
take about half as long with two threads on two cores. Prints the CPU, the commit and the figures.

Usage: ``.venv/bin/python benchmarks/bench_engine_threads.py --data-dir DIR [--ef 1536] [--questions 200]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from machine import commit, machine_line, script  # benchmarks/ is sys.path[0]

REPO = script()

SCIFACT = REPO.parent / "shared" / "data" / "beir-scifact"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--collection", default="passages")
    ap.add_argument("--ef", type=int, default=1536)
    ap.add_argument("--questions", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if not (SCIFACT / "queries.jsonl").is_file():
        print(f"needs {SCIFACT} (SciFact questions); not found", file=sys.stderr)
        return 2
    from qdrant_edge import (
        EdgeShard,
        QuantizationSearchParams,
        Query,
        QueryRequest,
        SearchParams,
        SparseVector,
    )

    from services.store.points import DENSE, SPARSE, CollectionSpec
    from services.store.sparse import embedder_for, spec_config

    alias = args.data_dir / "store" / args.collection
    generation = (alias / "CURRENT").read_text().strip()
    gdir = alias / "generations" / generation
    spec = CollectionSpec.from_json(json.loads((gdir / "spec.json").read_text()))
    sparse = embedder_for(spec_config(spec))
    with open(SCIFACT / "queries.jsonl", encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f][: args.questions]
    rng = np.random.default_rng(0)
    params = SearchParams(hnsw_ef=args.ef, quantization=QuantizationSearchParams(rescore=True))

    def dense_request() -> QueryRequest:
        v = rng.standard_normal(spec.dim).astype(np.float32)
        v /= np.linalg.norm(v)
        return QueryRequest(limit=100, query=Query.Nearest(v.tolist(), using=DENSE), with_payload=False,
                            params=params)

    def sparse_request(text: str) -> QueryRequest:
        q = sparse.embed_query(text)
        vector = SparseVector(indices=list(q.indices), values=list(q.values))
        return QueryRequest(limit=100, query=Query.Nearest(vector, using=SPARSE), with_payload=False)

    print(machine_line())
    print(f"commit {commit()}; {gdir}; ef {args.ef}; {len(texts)} questions; median of {args.repeats} runs")
    t = time.perf_counter()
    shard = EdgeShard.load(str(gdir / "shard"))
    print(f"shard opened in {time.perf_counter() - t:.1f} s; {shard.info().points_count:,} points")
    dense = [dense_request() for _ in texts]
    sparse_q = [sparse_request(x) for x in texts]
    for d, s in zip(dense, sparse_q, strict=True):  # warm the pages the searches touch
        shard.query(d), shard.query(s)
    pool = ThreadPoolExecutor(1)

    def each(reqs: list[QueryRequest]) -> None:
        for r in reqs:
            shard.query(r)

    def both_sequential() -> None:
        for d, s in zip(dense, sparse_q, strict=True):
            shard.query(d), shard.query(s)

    def both_parallel() -> None:
        for d, s in zip(dense, sparse_q, strict=True):
            other = pool.submit(shard.query, s)
            shard.query(d)
            other.result()

    def dense_twice_one_thread() -> None:
        each(dense), each(dense)

    def dense_twice_two_threads() -> None:
        threads = [threading.Thread(target=each, args=(dense,)) for _ in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()

    def timed(fn: object) -> float:
        runs = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            fn()  # type: ignore[operator]
            runs.append(time.perf_counter() - t0)
        return statistics.median(runs)

    n = len(texts)
    d = timed(lambda: each(dense)) / n * 1e3
    s = timed(lambda: each(sparse_q)) / n * 1e3
    seq = timed(both_sequential) / n * 1e3
    par = timed(both_parallel) / n * 1e3
    one = timed(dense_twice_one_thread)
    two = timed(dense_twice_two_threads)
    print("| measure | ms per question | note |\n|---|---:|---|")
    print(f"| dense alone (ef {args.ef}, int8 rescored if quantized) | {d:.2f} | |")
    print(f"| BM25 alone | {s:.2f} | |")
    print(f"| both, one after the other | {seq:.2f} | {seq / d:.2f}x dense |")
    print(f"| both at once, BM25 on a second thread | {par:.2f} | {par / d:.2f}x dense |")
    print(f"\ndense queries twice over: one thread {one:.2f} s, two threads at once {two:.2f} s "
          f"(x{one / two:.2f}; 2.0 would mean the engine searches in parallel)")
    print(machine_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
