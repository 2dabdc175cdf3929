"""Search latency on the embedded engine: exact scan vs HNSW, dense vs hybrid, and what an index build costs readers.

Synthetic passages (random unit vectors, random BM25-like sparse vectors, an 800-character payload) go into an
edge store; then, for the store's ``search`` (no towers: the engine and the front end only):

- dense p50 / p95 with the exact scan (before any index);
- ``Store.optimize()``: its wall time, the time the lease was held (copy + swap), and the slowest query a thread
  issued meanwhile (a query every 20 ms: how long readers were blocked);
- dense, hybrid RRF (fused in the engine) and hybrid linear (payloads for the final k only) p50 / p95 with HNSW.

    python benchmarks/bench_search.py --passages 100000   # about 3-5 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from machine import commit, cpu_model  # the one CPU / commit probe of the benchmarks

from services.store import Store
from services.store.engines import edge_index
from services.store.engines.edge import EdgeEngine
from services.store.points import CollectionSpec, Passage, PassagePoint, SearchRequest, SparseVector

DIM, VOCAB, TERMS, QUERY_TERMS = 384, 30_000, 40, 8


def unit(rng: np.random.Generator, n: int) -> np.ndarray:
    x = rng.standard_normal((n, DIM)).astype(np.float32)  # (n, dim)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def sparse(rng: np.random.Generator, terms: int) -> SparseVector:
    idx = np.unique(rng.integers(0, VOCAB, terms))
    return SparseVector(indices=idx.tolist(), values=rng.uniform(0.5, 3.0, len(idx)).round(3).tolist())


def fill(store: Store, n: int, rng: np.random.Generator) -> float:
    started = time.perf_counter()
    for start in range(0, n, 2048):
        vectors = unit(rng, min(2048, n - start))
        store.upsert([
            PassagePoint(Passage(doc_id=f"d{start + i}", chunk_index=0, text="lorem ipsum " * 66), dense=v.tolist(),
                         sparse=sparse(rng, TERMS))
            for i, v in enumerate(vectors)
        ])
    return time.perf_counter() - started


def timed(search: Callable[[], Any], runs: int) -> tuple[float, float]:
    search()  # warm
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        search()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return statistics.median(times), times[int(0.95 * (len(times) - 1))]


def requests(rng: np.random.Generator, n: int) -> dict[str, list[SearchRequest]]:
    qs = [(unit(rng, 1)[0].tolist(), sparse(rng, QUERY_TERMS)) for _ in range(n)]
    return {
        "dense": [SearchRequest(k=10, dense=d) for d, _ in qs],
        "hybrid rrf": [SearchRequest(k=10, mode="hybrid", dense=d, sparse=s) for d, s in qs],
        "hybrid linear": [SearchRequest(k=10, mode="hybrid", fusion="linear", dense=d, sparse=s) for d, s in qs],
    }


def latencies(store: Store, reqs: dict[str, list[SearchRequest]], modes: list[str]) -> dict[str, tuple[float, float]]:
    out = {}
    for mode in modes:
        cycle = iter(reqs[mode] * 10)
        out[mode] = timed(lambda cycle=cycle: store.search(next(cycle)), len(reqs[mode]))  # type: ignore[misc]
    return out


def optimize_under_load(store: Store, probe: SearchRequest) -> dict[str, float]:
    """Build the index while a thread queries every 20 ms; how long the lease was held and readers waited."""
    engine = store.engine
    assert isinstance(engine, EdgeEngine)
    held = {"copy": 0.0, "swap": 0.0}
    copy, check = engine._copy_for_build, engine._unchanged_since

    def timed_copy(*a: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return copy(*a)
        finally:
            held["copy"] = time.perf_counter() - t0

    def timed_check(*a: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return check(*a)
        finally:
            held["swap"] += time.perf_counter() - t0

    swap = edge_index.swap_in

    def timed_swap(*a: Any) -> None:
        t0 = time.perf_counter()
        try:
            swap(*a)
        finally:
            held["swap"] += time.perf_counter() - t0

    engine._copy_for_build, engine._unchanged_since = timed_copy, timed_check  # type: ignore[method-assign]
    edge_index.swap_in = timed_swap  # type: ignore[assignment]
    waits: list[float] = []
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            t0 = time.perf_counter()
            store.search(probe)
            waits.append(time.perf_counter() - t0)
            time.sleep(0.02)

    thread = threading.Thread(target=reader)
    thread.start()
    t0 = time.perf_counter()
    changed = store.optimize()
    wall = time.perf_counter() - t0
    done.set()
    thread.join()
    return {"changed": float(changed), "wall_s": wall, "lease_copy_s": held["copy"], "lease_swap_s": held["swap"],
            "queries_meanwhile": float(len(waits)), "slowest_query_ms": max(waits, default=0.0) * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passages", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--threshold", type=int, default=5000, help="DPR_EDGE__INDEX_THRESHOLD")
    args = parser.parse_args()
    rng = np.random.default_rng(13)
    with tempfile.TemporaryDirectory(prefix="dpr-bench-search-") as tmp:
        store = Store(EdgeEngine(tmp, "bench", idle_release=30, index_threshold=args.threshold))
        store.ensure_collection(CollectionSpec(dim=DIM, distance="cosine", model="synthetic@384"))
        ingest_s = fill(store, args.passages, rng)
        reqs = requests(rng, args.queries)
        exact = latencies(store, reqs, ["dense", "hybrid rrf"])
        build = optimize_under_load(store, reqs["dense"][0])
        hnsw = latencies(store, reqs, ["dense", "hybrid rrf", "hybrid linear"])
        info = store.index_info()
        store.close()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"## bench_search: {args.passages:,} synthetic passages, dim {DIM}, k=10, {args.queries} queries per row")
    print(f"CPU: {cpu_model()} ({os.cpu_count()} cores), load average {load}; commit {commit()}")
    print(f"upsert {ingest_s:.1f} s; index: {info['segments']} segments, {info['hnsw_segments']} with HNSW\n")
    print("| search | index | p50 ms | p95 ms | / dense p50 |")
    print("|---|---|---:|---:|---:|")
    for label, rows in (("exact scan", exact), ("HNSW", hnsw)):
        for mode, (p50, p95) in rows.items():
            print(f"| {mode} | {label} | {p50:.2f} | {p95:.2f} | {p50 / rows['dense'][0]:.2f} |")
    print(f"\noptimize: {build['wall_s']:.1f} s wall; lease held {build['lease_copy_s']:.2f} s to copy + "
          f"{build['lease_swap_s']:.2f} s to check and swap; {int(build['queries_meanwhile'])} queries answered "
          f"meanwhile, the slowest {build['slowest_query_ms']:.0f} ms")


if __name__ == "__main__":
    main()
