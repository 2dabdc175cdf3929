"""How long a reader waits for the embedded store while another process writes to it between pauses.

The pattern of a `dpr worker` (or an in-process ingest) next to `dpr query` or a second worker: the writer makes a
store call, then spends a while away from the store (encoding its next batch), then calls again. One process holds
the embedded shard at a time (``services.store.edge.lease``). The reader opens the store fresh every ``--every``
seconds and times one ``count()``.

Two writer policies, side by side in one run:

- baseline: the writer keeps the lease for the whole ``idle_release`` (0.5 s) after each call, whoever waits
  (what the lease did before a waiter could take it early: ``WAITER_GRACE`` = ``idle_release``);
- default: after ``WAITER_GRACE`` (10 ms) without a call, the writer hands the lease to a waiting process.

    python benchmarks/bench_lease.py  # about 30 s; prints the table, writes benchmarks/results/query-speed/lease.md
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from multiprocessing.synchronize import Event
from pathlib import Path

from machine import commit, cpu_model  # the one CPU / commit probe of the benchmarks

from services.store import Store
from services.store.edge import lease_lifetime
from services.store.edge.engine import EdgeEngine
from services.store.points import CollectionSpec, Passage, PassagePoint

RESULTS = Path(__file__).resolve().parent / "results" / "query-speed" / "lease.md"
IDLE_RELEASE = 0.5  # the setting's default (DPR_EDGE__IDLE_RELEASE)


def writer(root: str, stop: Event, pause: float, grace: float | None) -> None:
    if grace is not None:
        lease_lifetime.WAITER_GRACE = grace  # the baseline policy, in this process only
    store = Store(EdgeEngine(root, "c", idle_release=IDLE_RELEASE))
    i = 0
    while not stop.is_set():
        point = PassagePoint(passage=Passage(doc_id=f"d{i}", chunk_index=0, text="x"), dense=[1.0, 0.0, 0.0, i % 7])
        store.upsert([point])
        i += 1
        time.sleep(pause)  # away from the store: encoding the next batch
    store.close()


def reader_waits(pause: float, grace: float | None, reads: int, every: float) -> list[float]:
    root = tempfile.mkdtemp(prefix="dpr-bench-lease-")
    setup = Store(EdgeEngine(root, "c", idle_release=0))
    setup.ensure_collection(CollectionSpec(dim=4, distance="cosine", model="m", sparse=False))
    setup.close()
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    process = ctx.Process(target=writer, args=(root, stop, pause, grace))
    process.start()
    time.sleep(2.0)  # the writer is in its rhythm
    waits = []
    for _ in range(reads):
        store = Store(EdgeEngine(root, "c", idle_release=0))
        started = time.perf_counter()
        store.count()
        waits.append(time.perf_counter() - started)
        store.close()
        time.sleep(every)
    stop.set()
    process.join(30)
    return waits


def summary(waits: list[float]) -> str:
    ranked = sorted(waits)
    p90 = ranked[int(0.9 * (len(ranked) - 1))]
    return f"p50 {statistics.median(ranked) * 1e3:.0f} ms, p90 {p90 * 1e3:.0f} ms, max {ranked[-1] * 1e3:.0f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pause", type=float, default=0.3, help="Seconds the writer spends away between calls.")
    parser.add_argument("--reads", type=int, default=40)
    parser.add_argument("--every", type=float, default=0.17, help="Seconds between the reader's calls.")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    rows = []
    results = {}
    for label, grace in (("baseline: hold for idle_release", IDLE_RELEASE), ("default: hand over to a waiter", None)):
        results[label] = waits = reader_waits(args.pause, grace, args.reads, args.every)
        rows.append(f"| {label} | {summary(waits)} |")
        print(rows[-1], flush=True)
    base, new = (statistics.median(w) for w in results.values())
    lines = [
        "# Reader wait on the embedded store while another process writes (benchmarks/bench_lease.py)", "",
        f"Run {time.strftime('%Y-%m-%d %H:%M')} at commit {commit()} on {cpu_model()}, {os.cpu_count()} CPUs. "
        f"Writer: one upsert, then {args.pause:g} s away, idle_release {IDLE_RELEASE:g} s; reader: a fresh store "
        f"and one count() every {args.every:g} s, {args.reads} times.", "",
        "| writer policy | reader's count() |", "|---|---|", *rows, "",
        f"Median wait, default / baseline: {new / base:.2f}x.",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(lines[-1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
