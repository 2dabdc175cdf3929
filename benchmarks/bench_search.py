"""Search latency on the embedded engine: exact scan vs HNSW, dense vs hybrid, and what an index build costs readers.

Synthetic passages (random unit vectors, random BM25-like sparse vectors, an 800-character payload) go into an
edge store; then, for the store's ``search`` (no towers: the engine and the front end only):

- dense p50 / p95 with the exact scan (before any index);
- ``Store.optimize()`` while a thread writes new passages (``--writes-per-s``) and another queries every 20 ms: its
  wall time, whether the build landed (its copy swapped in, the writes made meanwhile replayed onto it), the time the
  lease was held (copy; last replay round + swap), the writes replayed, and the queries' p99 and slowest meanwhile;
- dense, hybrid RRF (fused in the engine) and hybrid linear (payloads for the final k only) p50 / p95 with HNSW,
  and dense recall@10 against the exact scan, twice: with the ef the build calibrated (``services.store.calibrate``,
  the default ``DPR_EDGE__RECALL_TARGET`` 0.98) and with the engine's own default ef (no calibration: the default
  before it).

    python benchmarks/bench_search.py --passages 100000   # about 3-5 minutes on 2 cores
    python benchmarks/bench_search.py --data-dir COPY --add 20000 --threshold 10000   # the build alone, over a copy
                                                                 # of a kept 1M data dir (it writes into it)
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from machine import commit, cpu_flags, cpu_model  # the one CPU / commit probe of the benchmarks

from services.core.settings import Settings
from services.core.store_settings import EdgeSettings
from services.store import Store
from services.store.edge import index as edge_index
from services.store.edge.engine import EdgeEngine
from services.store.points import DENSE, CollectionSpec, Passage, PassagePoint, SearchRequest, SparseVector

DIM, VOCAB, TERMS, QUERY_TERMS = 384, 30_000, 40, 8


def unit(rng: np.random.Generator, n: int, dim: int = DIM) -> np.ndarray:
    x = rng.standard_normal((n, dim)).astype(np.float32)  # (n, dim)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def sparse(rng: np.random.Generator, terms: int) -> SparseVector:
    idx = np.unique(rng.integers(0, VOCAB, terms))
    return SparseVector(indices=idx.tolist(), values=rng.uniform(0.5, 3.0, len(idx)).round(3).tolist())


def fill(store: Store, n: int, rng: np.random.Generator, first_id: int = 0, dim: int = DIM) -> float:
    started = time.perf_counter()
    for start in range(0, n, 2048):
        add(store, rng, min(2048, n - start), first_id + start, dim)
    return time.perf_counter() - started


def add(store: Store, rng: np.random.Generator, n: int, first_id: int, dim: int = DIM) -> None:
    store.upsert([
        PassagePoint(Passage(doc_id=f"d{first_id + i}", chunk_index=0, text="lorem ipsum " * 66), dense=v.tolist(),
                     sparse=sparse(rng, TERMS))
        for i, v in enumerate(unit(rng, n, dim))
    ])


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


def recall_at_10(store: Store, reqs: list[SearchRequest]) -> float:
    """Mean recall@10 of the store's dense search against the engine's exact scan, on ``reqs``."""
    from qdrant_edge import Query, QueryRequest, SearchParams

    engine, generation = store.engine, store.active().name  # type: ignore[union-attr]
    assert isinstance(engine, EdgeEngine)
    found = 0
    for r in reqs:
        with engine.session():
            exact = engine.shard(generation).query(QueryRequest(
                limit=10, query=Query.Nearest(r.dense, using=DENSE), params=SearchParams(exact=True),
                with_payload=True))
        found += len({str(p.payload["doc_id"]) for p in exact} & {h.passage.doc_id for h in store.search(r)})
    return found / (10 * len(reqs))


def ask_elsewhere(data_dir: Path, probe: list[float], answers: Any) -> None:
    """The reader as ``dpr serve`` is, in a process of its own (``--data-dir``): a question every 20 ms until
    ``answers`` says stop, then (wall start, seconds waited) of each sent back."""
    store = Store(EdgeEngine.from_settings(Settings(data_dir=data_dir)))
    store.search(SearchRequest(k=10, dense=probe))  # the shard loaded before the build starts
    answers.send("ready")
    waited: list[tuple[float, float]] = []
    while not answers.poll(0.02):
        t0, started = time.time(), time.perf_counter()
        store.search(SearchRequest(k=10, dense=probe))
        waited.append((t0, time.perf_counter() - started))
    store.close()
    answers.send(waited)


def optimize_under_load(store: Store, probe: SearchRequest, rng: np.random.Generator, writes_per_s: float,
                        first_id: int, dim: int = DIM, elsewhere: Path | None = None) -> dict[str, Any]:
    """Build the index while a thread queries every 20 ms and another writes ``writes_per_s`` new passages a second
    (in batches of 32) until the build returns: how long the lease was held at each end, what the readers waited,
    how many writes the build replayed onto its copy, and whether the copy was swapped in. ``elsewhere``: the
    questions come from another process over this data dir instead (``ask_elsewhere``: a server beside a worker)."""
    report: dict[str, Any] = {}

    class BuildLog(logging.Handler):  # the build's own figures: its log line "edge index build"
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage() == "edge index build":
                report.update(record.__dict__)

    handler = BuildLog()
    build_log = logging.getLogger(edge_index.__name__)
    build_log.addHandler(handler)
    build_log.setLevel(logging.INFO)
    waits: list[float] = []
    written = [0]
    done = threading.Event()

    asked: list[tuple[float, float]] = []

    def reader() -> None:
        if elsewhere is not None:
            import multiprocessing

            ours, theirs = multiprocessing.Pipe()
            process = multiprocessing.get_context("spawn").Process(target=ask_elsewhere,
                                                                   args=(elsewhere, probe.dense, theirs))
            process.start()
            ours.recv()  # "ready": its shard is loaded
            ready.set()
            done.wait()
            ours.send("stop")
            asked.extend(ours.recv())
            process.join()
            return
        ready.set()
        while not done.is_set():
            t0 = time.perf_counter()
            store.search(probe)
            waits.append(time.perf_counter() - t0)
            time.sleep(0.02)

    def writer() -> None:
        while writes_per_s > 0 and not done.wait(32 / writes_per_s):
            add(store, rng, 32, first_id + written[0], dim)
            written[0] += 32

    before = store.count()
    ready = threading.Event()
    threads = [threading.Thread(target=reader), threading.Thread(target=writer)]
    for t in threads:
        t.start()
    ready.wait()
    t0, wall0 = time.perf_counter(), time.time()
    try:
        changed = store.optimize()
    finally:
        wall = time.perf_counter() - t0
        done.set()
        for t in threads:
            t.join()
        build_log.removeHandler(handler)
    slow = sorted((w, t - wall0) for t, w in asked if t >= wall0)[-3:]  # the slowest, and when after the start
    waits = waits or [w for t, w in asked if t >= wall0]
    waits.sort()
    return {"changed": float(changed), "wall_s": wall, "lease_copy_s": report["copy_s"],
            "lease_swap_s": report["swap_s"], "unleased_copy_s": report.get("unleased_copy_s", 0.0),
            "queries_meanwhile": float(len(waits)), "slowest_query_ms": max(waits, default=0.0) * 1e3,
            "p99_query_ms": waits[int(0.99 * (len(waits) - 1))] * 1e3 if waits else 0.0,
            "over_1s": float(sum(w > 1.0 for w in waits)),
            "written": float(written[0]), "lost": float(before + written[0] - store.count()),
            "replayed_off_lease": float(report["replayed"]),
            "replayed_under_lease": float(report["replayed_last"]), "slow": slow}


def build_line(build: dict[str, Any], writes_per_s: float) -> str:
    return (f"optimize: {build['wall_s']:.1f} s wall, swapped in: {'yes' if build['changed'] else 'no'}; lease held "
            f"{build['lease_copy_s']:.2f} s to copy (after {build['unleased_copy_s']:.2f} s copying off it) + "
            f"{build['lease_swap_s']:.2f} s for the last replay round, the "
            f"check and the swap; {writes_per_s:g} writes/s meanwhile: {int(build['written'])} passages written "
            f"({'none' if build['lost'] == 0 else int(build['lost'])} lost), "
            f"{int(build['replayed_off_lease'])} + {int(build['replayed_under_lease'])} writes replayed (off / under "
            f"the lease); {int(build['queries_meanwhile'])} queries answered meanwhile, p99 "
            f"{build['p99_query_ms']:.0f} ms, the slowest {build['slowest_query_ms']:.0f} ms ({int(build['over_1s'])} "
            "over 1 s: those that waited for a lease hold or a shard's reload)"
            + "".join(f"; {w:.2f} s at +{at:.1f} s" for w, at in build.get("slow", [])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passages", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--threshold", type=int, default=5000, help="DPR_EDGE__INDEX_THRESHOLD")
    parser.add_argument("--writes-per-s", type=float, default=100.0,
                        help="new passages a second written while the index builds (0: none; 100 is about what "
                             "one 2-core machine ingests)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="build over this kept data dir's collection instead (e.g. a copy of bench_scale.py "
                             "--keep's): add --add passages first, then only the build under writes is timed")
    parser.add_argument("--add", type=int, default=20_000, help="with --data-dir: new passages before the build")
    args = parser.parse_args()
    rng = np.random.default_rng(13)
    machine = f"CPU: {cpu_model()} ({os.cpu_count()} cores, {cpu_flags()}); commit {commit()}"
    if args.data_dir is not None:
        settings = Settings(data_dir=args.data_dir, edge=EdgeSettings(index_threshold=args.threshold))
        store = Store(EdgeEngine.from_settings(settings))
        before = store.count()
        active = store.active()
        assert active is not None, f"{args.data_dir} holds no collection"
        spec = active.spec
        first = 100_000_000 + 2 * before  # ids no earlier run over this data dir used: every write adds a point
        added_s = fill(store, args.add, rng, first_id=first, dim=spec.dim)
        probe = SearchRequest(k=10, dense=unit(rng, 1, spec.dim)[0].tolist())
        build = optimize_under_load(store, probe, rng, args.writes_per_s, first + args.add, spec.dim, args.data_dir)
        after = store.count()
        store.close()
        kept = "none lost" if after == before + args.add + build["written"] else "MISMATCH"
        print(f"## bench_search --data-dir {args.data_dir}: {before:,} points + {args.add:,} added in "
              f"{added_s:.0f} s, then built under writes; {after:,} points after (= {before + args.add:,} + the "
              f"{int(build['written']):,} written during the build: {kept})")
        print(f"{machine}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
        print(build_line(build, args.writes_per_s))
        return
    with tempfile.TemporaryDirectory(prefix="dpr-bench-search-") as tmp:
        store = Store(EdgeEngine(tmp, "bench", idle_release=30, index_threshold=args.threshold))
        store.ensure_collection(CollectionSpec(dim=DIM, distance="cosine", model="synthetic@384"))
        ingest_s = fill(store, args.passages, rng)
        reqs = requests(rng, args.queries)
        exact = latencies(store, reqs, ["dense", "hybrid rrf"])
        build = optimize_under_load(store, reqs["dense"][0], rng, args.writes_per_s, args.passages)
        engine = store.engine
        assert isinstance(engine, EdgeEngine)
        info = store.index_info()
        rows = {}
        for label, target in (("HNSW, calibrated ef", engine.recall_target), ("HNSW, engine default ef", 0.0)):
            engine.recall_target = target  # 0: no calibration read (the default before it)
            rows[label] = latencies(store, reqs, ["dense", "hybrid rrf", "hybrid linear"])
            rows[label]["recall"] = (recall_at_10(store, reqs["dense"]), 0.0)
        store.close()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"## bench_search: {args.passages:,} synthetic passages, dim {DIM}, k=10, {args.queries} queries per row")
    print(f"{machine}; load average {load}")
    print(f"upsert {ingest_s:.1f} s; index: {info['segments']} segments, {info['hnsw_segments']} with HNSW")
    cal = info.get("calibration") or {}
    print(f"calibration: {cal}\n")
    print("| search | index | p50 ms | p95 ms | / dense p50 | dense recall@10 |")
    print("|---|---|---:|---:|---:|---:|")
    for label, by_mode in (("exact scan", exact), *rows.items()):
        recall = by_mode.pop("recall", (1.0, 0.0))[0]
        for mode, (p50, p95) in by_mode.items():
            print(f"| {mode} | {label} | {p50:.2f} | {p95:.2f} | {p50 / by_mode['dense'][0]:.2f} | "
                  f"{recall:.3f} |")
    print("\n" + build_line(build, args.writes_per_s))


if __name__ == "__main__":
    main()
