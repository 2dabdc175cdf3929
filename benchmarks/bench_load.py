"""Many clients at once against `dpr serve`, started as a user would, driven by a real load generator.

1. A data dir with the first ``--docs`` SciFact abstracts, ingested by ``dpr ingest`` (a JSONL file of them), or
   an existing data dir (``--data-dir``, nothing is ingested).
2. ``dpr serve`` on a free loopback port (its own process; ``DPR_*`` from ``--env`` only), /readyz awaited.
3. For each ``--clients`` N: wrk (Debian's ``wrk``, a Lua script cycling real SciFact questions as POST
   /v1/search bodies) with N connections for ``--duration`` seconds; without wrk, a thread-per-client Python
   generator (``--generator python``). Questions/s, p50 / p99 latency, errors by kind and status, and the server's
   peak RSS (its process tree's VmRSS sampled from /proc every 0.1 s).
4. ``--thin N``: N concurrent loops of the thin client, ``dpr query --json`` with ``DPR_API_URL`` (a process per
   question: its start-up is in the latency, as a user's shell pays it).
5. ``--burst N``: N connections at once for a few seconds, beyond ``api.max_in_flight + api.max_queue``: how many
   were answered, how many shed with 503 / 429 and how many of those carried Retry-After, and the RSS under it.
6. ``--batching on off``: all of the above once per value, each on its own ``dpr serve`` with
   ``DPR_SERVING__BATCHING`` on / off (services/serving.py), in the same run; each row also gives the server's mean
   questions per batch and mean queue wait (from /metrics) and the server's CPU time per answered question (from
   /proc: on a shared machine the server gets what the others leave, so this is the figure to compare). The wrk
   script cycles 1,109 questions: add ``--env DPR_SERVING__CACHE_SIZE=0`` to measure batching rather than the
   cache of repeated questions.

Usage::

    nice -n 10 .venv/bin/python benchmarks/bench_load.py --docs 3000 --clients 16 32 --duration 60 \
        --burst 600 --thin 4 [--batching on off] [--out benchmarks/results/query-speed/load.md] [--json]

Prints the CPU model and flags, the commit and the load average beside the figures: on a shared machine the
load generator, the server and other work share the cores, so read figures as ratios.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from machine import commit, machine_line
from serve_process import DPR, ServeProcess, dpr_command

REPO = Path(__file__).resolve().parents[1]
SCIFACT = REPO.parent / "shared" / "data" / "beir-scifact"


# -- data ----------------------------------------------------------------------------------------------------------


def write_corpus(path: Path, docs: int) -> int:
    """The first ``docs`` SciFact abstracts as a JSONL file ``dpr ingest`` reads."""
    n = 0
    with gzip.open(SCIFACT / "corpus.jsonl.gz", "rt", encoding="utf-8") as f, open(path, "w", encoding="utf-8") as out:
        for line in f:
            row = json.loads(line)
            if not row.get("text", "").strip():
                continue
            out.write(json.dumps({"_id": str(row["_id"]), "title": row.get("title") or "", "text": row["text"]}) + "\n")
            n += 1
            if n >= docs:
                break
    return n


def questions(n: int = 1000) -> list[str]:
    with open(SCIFACT / "queries.jsonl", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f][:n]


def clean_env(data_dir: Path, extra: dict[str, str]) -> dict[str, str]:
    # only the ONNX export cache passes through (a cache keyed by the model's fingerprint, not a setting)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPR_") or k == "DPR_ONNX_CACHE"}
    env.update({"DPR_DATA_DIR": str(data_dir), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "TOKENIZERS_PARALLELISM": "false"})
    env.update(extra)
    return env


def ingest(data_dir: Path, corpus: Path, env: dict[str, str]) -> dict[str, Any]:
    t0 = time.perf_counter()
    done = subprocess.run([DPR, "ingest", str(corpus), "--json"], env=env, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"dpr ingest failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    report = json.loads(done.stdout)
    return {"seconds": time.perf_counter() - t0, "report": report}


# -- the server and its memory ---------------------------------------------------------------------------------------


def tree_rss_kb(pid: int) -> int:
    """VmRSS of ``pid`` and its descendants (uvicorn workers, the index build's child), in KB."""
    total, todo, seen = 0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return total


class Server(ServeProcess):
    """``dpr serve`` (benchmarks/serve_process.py) with an RSS sampler over its process tree."""

    def __init__(self, env: dict[str, str], log: Path, code: Path | None = None) -> None:
        super().__init__(env, log, code)
        self.peak_kb = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, name="rss", daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.1):
            self.peak_kb = max(self.peak_kb, tree_rss_kb(self.process.pid))

    def reset_peak(self) -> None:
        self.peak_kb = tree_rss_kb(self.process.pid)

    def cpu_s(self) -> float:
        """CPU seconds (user + system, every thread) the server process has used so far."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mb(self) -> float:
        return tree_rss_kb(self.process.pid) / 1024

    def stop(self) -> None:
        self._stop.set()
        super().stop()


def run_threads(target: Callable[[int], None], offsets: list[int]) -> float:
    """``target(offset)`` on one thread per offset, all at once; the seconds until the last one ends."""
    t0 = time.perf_counter()
    threads = [threading.Thread(target=target, args=(offset,)) for offset in offsets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def percentile(ms: list[float], q: float) -> float:
    """The ``q`` quantile of sorted ``ms`` (nearest rank)."""
    return ms[max(0, min(len(ms) - 1, math.ceil(q * len(ms)) - 1))]


# -- load generators -----------------------------------------------------------------------------------------------

_LUA = r"""
local bodies = {%(bodies)s}
local threads = {}
local i = 0
function setup(thread) table.insert(threads, thread) end
function init(args) counts = {}; retry = 0; i = math.random(#bodies) end
function request()
  i = (i %% #bodies) + 1
  return wrk.format("POST", "/v1/search", {["Content-Type"] = "application/json"}, bodies[i])
end
function response(status, headers, body)
  counts[status] = (counts[status] or 0) + 1
  if status >= 400 and (headers["retry-after"] or headers["Retry-After"]) then retry = retry + 1 end
end
function done(summary, latency, requests)
  local agg, rt = {}, 0
  for _, t in ipairs(threads) do
    for k, v in pairs(t:get("counts")) do agg[k] = (agg[k] or 0) + v end
    rt = rt + t:get("retry")
  end
  local parts = {}
  for k, v in pairs(agg) do table.insert(parts, string.format('"%%d": %%d', k, v)) end
  local e = summary.errors
  io.write(string.format('DPRLOAD {"requests": %%d, "duration_us": %%d, "p50_us": %%d, "p99_us": %%d, ' ..
    '"max_us": %%d, "connect": %%d, "read": %%d, "write": %%d, "timeout": %%d, "status": {%%s}, "retry_after": %%d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99), latency.max,
    e.connect, e.read, e.write, e.timeout, table.concat(parts, ", "), rt))
end
"""


def _lua_string(text: str) -> str:
    level = "=" * 3
    while f"]{level}]" in text:
        level += "="
    return f"[{level}[{text}]{level}]"


def run_wrk(url: str, bodies: list[str], clients: int, duration: float, workdir: Path) -> dict[str, Any]:
    script = workdir / "search.lua"
    script.write_text(_LUA % {"bodies": ", ".join(_lua_string(b) for b in bodies)}, encoding="utf-8")
    threads = max(1, min(clients, 2))
    cmd = ["wrk", "-t", str(threads), "-c", str(clients), "-d", f"{max(1, round(duration))}s", "--timeout", "30s",
           "-s", str(script), url]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    line = next((x for x in done.stdout.splitlines() if x.startswith("DPRLOAD ")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    raw = json.loads(line[len("DPRLOAD "):])
    status = {int(k): v for k, v in raw["status"].items()}
    ok = status.get(200, 0)
    return {
        "generator": "wrk", "clients": clients, "seconds": raw["duration_us"] / 1e6, "requests": raw["requests"],
        "ok": ok, "qps": ok / (raw["duration_us"] / 1e6), "p50_ms": raw["p50_us"] / 1000,
        "p99_ms": raw["p99_us"] / 1000, "max_ms": raw["max_us"] / 1000, "status": status,
        "errors": raw["requests"] - ok + raw["connect"] + raw["read"] + raw["write"] + raw["timeout"],
        "socket_errors": {k: raw[k] for k in ("connect", "read", "write", "timeout")},
        "retry_after": raw["retry_after"],
    }


def run_python(url: str, bodies: list[str], clients: int, duration: float) -> dict[str, Any]:
    """The fallback generator: one thread and one keep-alive connection per client (its own CPU is in the figures)."""
    latencies: list[float] = []
    status: Counter[int] = Counter()
    retry = [0]
    failures = [0]
    lock = threading.Lock()
    deadline = time.perf_counter() + duration

    def client(offset: int) -> None:
        with httpx.Client(base_url=url, timeout=30) as http:
            i = offset
            while time.perf_counter() < deadline:
                body = bodies[i % len(bodies)]
                i += 1
                t = time.perf_counter()
                try:
                    r = http.post("/v1/search", content=body, headers={"content-type": "application/json"})
                except httpx.HTTPError:
                    with lock:
                        failures[0] += 1
                    continue
                dt = time.perf_counter() - t
                with lock:
                    latencies.append(dt)
                    status[r.status_code] += 1
                    if r.status_code >= 400 and "retry-after" in r.headers:
                        retry[0] += 1

    wall = run_threads(client, [k * 7 for k in range(clients)])
    ms = sorted(x * 1000 for x in latencies) or [0.0]
    ok = status.get(200, 0)
    return {
        "generator": "python", "clients": clients, "seconds": wall, "requests": len(latencies) + failures[0],
        "ok": ok, "qps": ok / wall, "p50_ms": statistics.median(ms), "p99_ms": percentile(ms, 0.99),
        "max_ms": ms[-1], "status": dict(status), "errors": len(latencies) - ok + failures[0],
        "socket_errors": {"failed": failures[0]}, "retry_after": retry[0],
    }


def run_burst(url: str, bodies: list[str], n: int) -> dict[str, Any]:
    """``n`` requests at once, one per connection (a burst, not a flood: nobody retries): how many were answered,
    how many shed and whether each refusal carried Retry-After."""
    import asyncio

    async def burst() -> tuple[list[tuple[int, float, bool]], int, float]:
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
            gate = asyncio.Event()

            async def one(i: int) -> tuple[int, float, bool] | None:
                await gate.wait()
                t = time.perf_counter()
                try:
                    r = await http.post("/v1/search", content=bodies[i % len(bodies)],
                                        headers={"content-type": "application/json"})
                except httpx.HTTPError:
                    return None
                return r.status_code, time.perf_counter() - t, "retry-after" in r.headers

            tasks = [asyncio.create_task(one(i)) for i in range(n)]
            await asyncio.sleep(0.1)
            t0 = time.perf_counter()
            gate.set()
            done = await asyncio.gather(*tasks)
            wall = time.perf_counter() - t0
        answered = [d for d in done if d is not None]
        return answered, n - len(answered), wall

    answered, failed, wall = asyncio.run(burst())
    status = Counter(code for code, _, _ in answered)
    ok_ms = sorted(dt * 1000 for code, dt, _ in answered if code == 200) or [0.0]
    shed_ms = sorted(dt * 1000 for code, dt, _ in answered if code in (429, 503)) or [0.0]
    return {
        "generator": "asyncio burst", "clients": n, "seconds": wall, "requests": n, "ok": status.get(200, 0),
        "qps": status.get(200, 0) / wall, "p50_ms": statistics.median(ok_ms), "p99_ms": percentile(ok_ms, 0.99),
        "max_ms": ok_ms[-1], "status": dict(status), "errors": n - status.get(200, 0),
        "socket_errors": {"failed": failed}, "retry_after": sum(1 for code, _, r in answered if code >= 400 and r),
        "shed_p50_ms": statistics.median(shed_ms),
    }


def run_thin(url: str, qs: list[str], clients: int, duration: float, env: dict[str, str]) -> dict[str, Any]:
    """``dpr query --json`` with DPR_API_URL, ``clients`` loops for ``duration`` s (a process per question)."""
    env = {**env, "DPR_API_URL": url}
    latencies: list[float] = []
    codes: Counter[int] = Counter()
    lock = threading.Lock()
    deadline = time.perf_counter() + duration

    def loop(offset: int) -> None:
        i = offset
        while time.perf_counter() < deadline:
            t = time.perf_counter()
            done = subprocess.run([DPR, "query", qs[i % len(qs)], "--json"], env=env, capture_output=True,
                                  text=True, check=False)
            i += 1
            with lock:
                latencies.append(time.perf_counter() - t)
                codes[done.returncode] += 1

    wall = run_threads(loop, [k * 11 for k in range(clients)])
    ms = sorted(x * 1000 for x in latencies) or [0.0]
    return {"clients": clients, "seconds": wall, "requests": len(latencies), "qps": codes.get(0, 0) / wall,
            "p50_ms": statistics.median(ms), "p99_ms": percentile(ms, 0.99),
            "errors": len(latencies) - codes.get(0, 0), "exit_codes": dict(codes)}


def encode_batching(repeats: int = 3, n: int = 128) -> list[tuple[int, int, float, list[float]]]:
    """Questions/s of the serving question tower (``dpr serve``'s settings: 1 intra-op thread per call) when
    ``threads`` concurrent callers each encode ``batch`` questions per call: is micro-batching concurrent
    questions worth it? Returns (threads, batch, median questions/s, each repeat's)."""
    sys.path.insert(0, str(REPO))
    from entrypoints.api.app import serving_settings
    from services.core.settings import Settings
    from services.runtime import Runtime

    qs = questions(n)
    with tempfile.TemporaryDirectory(prefix="bench-encode-") as tmp:
        towers = Runtime(serving_settings(Settings(data_dir=Path(tmp)))).question_towers
        towers.encode_queries(qs[:8])  # load
        out = []
        for threads, batch in ((1, 1), (1, 8), (1, 16), (2, 1), (2, 8), (16, 1)):
            rates = []
            for _ in range(repeats):
                def work(k: int, threads: int = threads, batch: int = batch) -> None:
                    mine = qs[k::threads]
                    for j in range(0, len(mine), batch):
                        towers.encode_queries(mine[j:j + batch], batch_size=batch)

                pool = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
                t0 = time.perf_counter()
                for t in pool:
                    t.start()
                for t in pool:
                    t.join()
                rates.append(len(qs) / (time.perf_counter() - t0))
            out.append((threads, batch, statistics.median(rates), rates))
    return out


# -- main --------------------------------------------------------------------------------------------------------------


def load(args: argparse.Namespace, url: str, bodies: list[str], clients: int, duration: float,
         workdir: Path) -> dict[str, Any]:
    if args.generator == "wrk":
        return run_wrk(url, bodies, clients, duration, workdir)
    return run_python(url, bodies, clients, duration)


def serve_and_load(args: argparse.Namespace, env: dict[str, str], label: str, bodies: list[str], qs: list[str],
                   work: Path, result: dict[str, Any], code: Path | None = None) -> None:
    """One ``dpr serve`` with ``env`` (``code``: another checkout's): the load runs, burst, flood and thin client;
    rows named with ``label``; the top 10 of the first 100 questions in ``result["answers"][label]``."""
    server = Server(env, work / "serve.log", code)
    try:
        result["ready_s"] = server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=120) as http:
            for body in bodies[:5]:  # warm-up: the first questions load the tower's session
                http.post("/v1/search", content=body, headers={"content-type": "application/json"})
            status = http.get("/v1/status").json()
            result.setdefault("answers", {})[label] = [
                [f"{h['doc_id']}#{h['chunk_index']}" for h in http.post(
                    "/v1/search", content=body, headers={"content-type": "application/json"}).json()["hits"]]
                for body in bodies[:100]]
        result["points"] = status.get("points") or status.get("active", {}).get("points")
        result["idle_rss_mb"] = server.rss_mb()
        for clients in args.clients:
            server.reset_peak()
            before, cpu = question_batches(server.url), server.cpu_s()
            r = load(args, server.url, bodies, clients, args.duration, work)
            r["cpu_ms"] = 1000 * (server.cpu_s() - cpu) / max(1, r["ok"])  # the server's CPU per answered question
            r["peak_rss_mb"] = server.peak_kb / 1024
            r["name"] = f"{args.mode}, {args.generator}{label}"
            r["batches"] = question_batches(server.url, before)
            r["load"] = os.getloadavg()[0]
            result["runs"].append(r)
        if args.burst:
            server.reset_peak()
            r = run_burst(server.url, bodies, args.burst)
            r["peak_rss_mb"] = server.peak_kb / 1024
            r["name"] = f"burst, one request per connection{label}"
            result.setdefault("bursts", []).append(r)
        if args.flood:
            server.reset_peak()
            r = load(args, server.url, bodies, args.flood, args.burst_seconds, work)
            r["peak_rss_mb"] = server.peak_kb / 1024
            r["name"] = f"flood, {args.generator}, resending at once after 503{label}"
            result.setdefault("floods", []).append(r)
        if args.thin:
            server.reset_peak()
            r = run_thin(server.url, qs, args.thin, args.duration, env)
            r["peak_rss_mb"] = server.peak_kb / 1024
            r["name"] = f"thin client `dpr query` (DPR_API_URL), a process per question{label}"
            result.setdefault("thins", []).append(r)
    finally:
        server.stop()


def question_batches(url: str, before: dict[str, float] | None = None) -> dict[str, float]:
    """The server's question-batcher counters from /metrics (minus ``before``): tower calls, questions, the sum of
    their queue waits; ``mean_batch`` and ``mean_wait_ms`` when ``before`` is given."""
    from prometheus_client.parser import text_string_to_metric_families

    names = {"dpr_question_batch_size_count": "calls", "dpr_question_batch_size_sum": "questions",
             "dpr_question_queue_seconds_sum": "wait_s"}
    now = dict.fromkeys(names.values(), 0.0)
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=30).text):
        for sample in family.samples:
            if sample.name in names:
                now[names[sample.name]] = sample.value
    if before is None:
        return now
    d = {k: now[k] - before[k] for k in now}
    d["mean_batch"] = d["questions"] / d["calls"] if d["calls"] else 0.0
    d["mean_wait_ms"] = 1000 * d["wait_s"] / d["questions"] if d["questions"] else 0.0
    return d


def row(name: str, r: dict[str, Any], rss_mb: float | None) -> str:
    shed = sum(v for k, v in r.get("status", {}).items() if k in (429, 503))
    rss = f"{rss_mb:,.0f}" if rss_mb is not None else "-"
    b = r.get("batches") or {}
    batch = f"{b['mean_batch']:.1f} / {b['mean_wait_ms']:.1f}" if b.get("calls") else "-"
    cpu = f"{r['cpu_ms']:.1f}" if "cpu_ms" in r else "-"
    return (f"| {name} | {r['clients']} | {r['seconds']:.0f} | {r['requests']:,} | {r['qps']:.1f} | "
            f"{r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {r.get('max_ms', 0):.0f} | {r['errors']} | {shed} | "
            f"{r.get('retry_after', '-')} | {batch} | {cpu} | {rss} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=3000, help="SciFact abstracts to ingest (ignored with --data-dir)")
    ap.add_argument("--data-dir", type=Path, help="serve this existing data dir instead of ingesting")
    ap.add_argument("--clients", type=int, nargs="*", default=[16, 32], help="a load run per value (none: skip)")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds per load run")
    ap.add_argument("--burst", type=int, default=0, help="requests at once, one per connection (0: none)")
    ap.add_argument("--flood", type=int, default=0,
                    help="connections for a flood: the generator's clients resend at once after a 503 (0: none)")
    ap.add_argument("--burst-seconds", type=float, default=5.0, help="length of the flood")
    ap.add_argument("--thin", type=int, default=0, help="concurrent thin-client loops (0: none)")
    ap.add_argument("--mode", default="dense", choices=("dense", "sparse", "hybrid"))
    ap.add_argument("--generator", choices=("wrk", "python"), default="wrk" if shutil.which("wrk") else "python")
    ap.add_argument("--env", action="append", default=[], metavar="DPR_X=Y", help="settings for dpr serve")
    ap.add_argument("--out", type=Path, help="write the markdown table here")
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
    ap.add_argument("--encode-batching", action="store_true", help="only measure question-tower micro-batching")
    ap.add_argument("--batching", nargs="*", choices=("on", "off"), default=[],
                    help="a server per value, DPR_SERVING__BATCHING on / off, each with every run (none: defaults)")
    ap.add_argument("--baseline", metavar="COMMIT",
                    help="also serve with that commit's code (a git worktree; the same data dir), alternated with "
                         "this commit's, each row labelled with its code; the top 10 of 100 questions compared")
    ap.add_argument("--rounds", type=int, default=1, help="how many times each server runs (alternated)")
    args = ap.parse_args()
    if not SCIFACT.is_dir():
        print(f"needs {SCIFACT} (BEIR SciFact questions and abstracts); not found", file=sys.stderr)
        return 2
    if args.encode_batching:
        print(machine_line())
        print("| concurrent callers | questions per call | questions/s (median) | each run |\n|---|---|---|---|")
        for threads, batch, median, rates in encode_batching():
            print(f"| {threads} | {batch} | {median:.1f} | {', '.join(f'{r:.0f}' for r in rates)} |")
        print(machine_line())
        return 0
    extra = dict(item.split("=", 1) for item in args.env)
    qs = questions()
    bodies = [json.dumps({"question": q, "k": 10, "mode": args.mode}) for q in qs]
    before = machine_line()
    result: dict[str, Any] = {"machine": before, "generator": args.generator, "runs": [], "commit": commit()}
    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
        work = Path(tmp)
        data_dir = args.data_dir or work / "dpr"
        env = clean_env(data_dir, extra)
        if args.data_dir is None:
            corpus = work / "scifact.jsonl"
            result["docs"] = write_corpus(corpus, args.docs)
            result["ingest"] = ingest(data_dir, corpus, env)
        # one `dpr query` first, as a user's first question: it makes the question tower's ONNX export if the data
        # dir has none (torch loads for that, ~1 GB), so the server's RSS below is the serving figure
        first = subprocess.run([DPR, "query", qs[0], "--json"], env=env, capture_output=True, text=True, check=False)
        if first.returncode != 0:
            raise RuntimeError(f"dpr query failed ({first.returncode}): {first.stderr.strip()[-2000:]}")
        codes: list[tuple[str, Path | None]] = [("", None)]
        if args.baseline:
            old = work / "baseline"
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(old), args.baseline],
                           check=True, capture_output=True)
            codes = [(f", {commit()}", None), (f", {args.baseline} (before)", old)]
            # that code's first question, as for this commit's above (an export of its own, if it makes one)
            warm = subprocess.run([*dpr_command(old), "query", qs[0], "--json"], env=env, capture_output=True,
                                  text=True, check=False)
            if warm.returncode != 0:
                raise RuntimeError(f"{args.baseline}'s dpr query failed: {warm.stderr.strip()[-2000:]}")
        try:
            for round_ in range(args.rounds):
                for code_label, code in codes:
                    for batching in args.batching or [None]:
                        variant = ({} if batching is None else
                                   {"DPR_SERVING__BATCHING": "true" if batching == "on" else "false"})
                        label = ("" if batching is None else f", batching {batching}") + code_label + (
                            f", round {round_ + 1}" if args.rounds > 1 else "")
                        serve_and_load(args, {**env, **variant}, label, bodies, qs, work, result, code)
        finally:
            if args.baseline:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(work / "baseline")],
                               capture_output=True)
    result["machine_after"] = machine_line()
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    text = report(args, result)
    if not args.json:
        print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
    return 0


def report(args: argparse.Namespace, result: dict[str, Any]) -> str:
    lines = [
        f"Machine before: {result['machine']}",
        f"Machine after: {result['machine_after']}",
        "",
        f"Collection: {str(result['docs']) + ' SciFact abstracts' if 'docs' in result else 'the --data-dir given'} "
        f"({result.get('points') or '?'} points), "
        f"`dpr serve` ready {result.get('ready_s', 0):.1f} s after start, idle RSS "
        f"{result.get('idle_rss_mb', 0):.0f} MB.",
    ]
    if "ingest" in result:
        lines.append(f"`dpr ingest` of the JSONL file: {result['ingest']['seconds']:.0f} s.")
    lines += [
        "",
        "| run | clients | s | requests | questions/s | p50 ms | p99 ms | max ms | errors | shed 429/503 | with "
        "Retry-After | questions per batch / queue wait ms | server CPU ms per question | server peak RSS MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    extra = [*result.get("bursts", []), *result.get("floods", [])]
    for r in [*result["runs"], *extra]:
        lines.append(row(r["name"], r, r["peak_rss_mb"]))
    for t in result.get("thins", []):
        lines.append(f"| {t['name']} | {t['clients']} | {t['seconds']:.0f} | {t['requests']:,} | {t['qps']:.1f} | "
                     f"{t['p50_ms']:.0f} | {t['p99_ms']:.0f} | - | {t['errors']} | - | - | - | - | "
                     f"{t['peak_rss_mb']:,.0f} |")
    for r in [*result["runs"], *extra]:
        lines.append("")
        lines.append(f"- {r['name']} x{r['clients']}: status codes {r['status']}, socket errors {r['socket_errors']}"
                     + (f", 1-min load average at the end {r['load']:.1f}" if "load" in r else ""))
    if args.baseline:
        lines += ["", *against_baseline(args.baseline, result)]
    return "\n".join(lines) + "\n"


def against_baseline(baseline: str, result: dict[str, Any]) -> list[str]:
    """Questions/s of this commit's servers over the baseline's (medians of the rounds, per client count), and how
    many of 100 questions got the same top 10 from both."""
    def mine(name: str) -> bool:
        return f"{baseline} (before)" not in name

    out = []
    for clients in sorted({r["clients"] for r in result["runs"]}):
        now = [r["qps"] for r in result["runs"] if r["clients"] == clients and mine(r["name"])]
        before = [r["qps"] for r in result["runs"] if r["clients"] == clients and not mine(r["name"])]
        if now and before:
            a, b = statistics.median(now), statistics.median(before)
            out.append(f"- {clients} clients: questions/s **{a / b:.2f}x** {baseline}'s (medians {a:.1f} / {b:.1f})")
    answers = result.get("answers", {})
    ours = [a for label, a in answers.items() if mine(label)]
    theirs = [a for label, a in answers.items() if not mine(label)]
    if ours and theirs:
        same = sum(set(x) == set(y) for x, y in zip(ours[0], theirs[0], strict=True)) / len(ours[0])
        out.append(f"- the same top 10 from both codes for {100 * same:.0f}% of {len(ours[0])} questions (the "
                   "passages are the data dir's; the question towers may differ in precision)")
    return out


if __name__ == "__main__":
    raise SystemExit(main())
