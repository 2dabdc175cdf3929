"""Issue 70's soak: `dpr serve` (the embedded default) with an s3:// source on a real S3 server (SeaweedFS, started
here) synced every minute by the server's own schedule, objects changing between syncs, while 8 clients ask
questions. Floors: no error but 429 / 503, every sync done (outcome ok), the server's RSS after warm-up within 10%
of where it started, and the final points exactly those of a fresh `dpr ingest` of the final objects.

Each client asks one question, then waits ``--think`` seconds (a closed loop at a bounded rate: the machine is
shared). The mutator changes ``--change`` objects, deletes one and adds one every minute, between syncs. Writes
``benchmarks/results/reliability/sources-soak.md`` with ``--out``.

    nice -n 10 .venv/bin/python benchmarks/soak_sources.py [--minutes 30] [--objects 200] [--clients 8] [--out]
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import subprocess
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

from machine import machine_line, script  # benchmarks/ is sys.path[0]

REPO = script("tests")
RESULTS = REPO / "benchmarks" / "results" / "reliability" / "sources-soak.md"
QUESTIONS = ["What causes the disease?", "How does the protein affect cells?", "Which treatment reduces risk?",
             "What is the effect of exercise?", "How are genes regulated?", "What did the trial find?"]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def every(series: list[tuple[float, float]], step: float) -> list[tuple[float, float]]:
    """The first (minute, value) of ``series`` at or after each multiple of ``step`` minutes, and the last."""
    out, mark = [], 0.0
    for minute, value in series:
        if minute >= mark:
            out.append((minute, value))
            mark = (minute // step + 1) * step
    return out + ([series[-1]] if series and out[-1] != series[-1] else [])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--objects", type=int, default=200)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--think", type=float, default=0.5, help="seconds each client waits between questions")
    parser.add_argument("--change", type=int, default=5, help="objects changed each minute (plus 1 deleted, 1 added)")
    parser.add_argument("--warmup", type=float, default=3.0, help="minutes before the RSS baseline is taken")
    parser.add_argument("--out", action="store_true")
    args = parser.parse_args()

    import httpx
    from bench_sources import corpus, fresh_points, report
    from kit.seaweed import SeaweedS3
    from kit.stored import stored_points
    from serve_process import DPR, ServeProcess

    lines = [machine_line()]
    rng = random.Random(70)
    with tempfile.TemporaryDirectory(prefix="soak-sources-") as tmp_name:
        tmp = Path(tmp_name)
        server = SeaweedS3(tmp / "weed").start()
        serve: ServeProcess | None = None
        try:
            client = server.client()
            client.create_bucket(Bucket="soak")
            pool = corpus(args.objects * 3)
            names = sorted(pool)
            files = {k: pool[k] for k in names[: args.objects]}
            spare = names[args.objects:]
            for key, body in files.items():
                client.put_object(Bucket="soak", Key=key, Body=body)
            data = tmp / "data"
            env = {k: v for k, v in os.environ.items() if not k.startswith("DPR_")}
            env.update({"DPR_DATA_DIR": str(data), "DPR_SOURCES__S3_ENDPOINT": server.endpoint,
                        "DPR_SOURCES__TICK_SECONDS": "5", "AWS_ACCESS_KEY_ID": "soak",
                        "AWS_SECRET_ACCESS_KEY": "soak", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
            for argv in (["sources", "add", "soak", "s3://soak", "--every", "1m"], ["sources", "sync", "soak"]):
                done = subprocess.run([DPR, *argv], env=env, capture_output=True, text=True, timeout=1800)
                if done.returncode != 0:
                    raise SystemExit(f"dpr {' '.join(argv)}: {done.stderr}")
            serve = ServeProcess(env, tmp / "serve.log")
            serve.wait_ready()
            url = serve.url
            stop = threading.Event()
            statuses: collections.Counter[int] = collections.Counter()
            errors: list[str] = []
            lock = threading.Lock()

            def ask() -> None:
                with httpx.Client(base_url=url, timeout=60) as http:
                    while not stop.is_set():
                        try:
                            r = http.post("/v1/search", json={"question": rng.choice(QUESTIONS), "k": 5})
                            with lock:
                                statuses[r.status_code] += 1
                        except httpx.HTTPError as e:
                            with lock:
                                errors.append(repr(e))
                        stop.wait(args.think)

            threads = [threading.Thread(target=ask, daemon=True) for _ in range(args.clients)]
            for t in threads:
                t.start()
            syncs: dict[str, str] = {}  # finished -> outcome, as GET /v1/sources/soak saw each
            rss: list[tuple[float, float]] = []
            t0 = time.monotonic()
            next_change = t0 + 30  # between the server's syncs (every minute after the first)
            last_change = 0.0
            with httpx.Client(base_url=url, timeout=30) as http:
                while time.monotonic() - t0 < args.minutes * 60:
                    now = time.monotonic()
                    rss.append(((now - t0) / 60, rss_mb(serve.process.pid)))
                    last = http.get("/v1/sources/soak").json().get("last") or {}
                    if last.get("finished"):
                        syncs[str(last["finished"])] = str(last.get("outcome"))
                    if now >= next_change:
                        for key in rng.sample(sorted(files), args.change):
                            files[key] += f"\nRevised at minute {(now - t0) / 60:.1f}.\n".encode()
                            client.put_object(Bucket="soak", Key=key, Body=files[key])
                        gone = rng.choice(sorted(files))
                        client.delete_object(Bucket="soak", Key=gone)
                        del files[gone]
                        new = spare.pop()
                        files[new] = pool[new]
                        client.put_object(Bucket="soak", Key=new, Body=pool[new])
                        last_change = time.time()
                        next_change = now + 60
                    time.sleep(10)
                stop.set()
                for t in threads:
                    t.join(60)
                deadline = time.monotonic() + 300  # the sync after the last change
                while time.monotonic() < deadline:
                    last = http.get("/v1/sources/soak").json().get("last") or {}
                    if last.get("finished"):
                        syncs[str(last["finished"])] = str(last.get("outcome"))
                        if datetime.fromisoformat(str(last["finished"])).timestamp() > last_change + 1:
                            break
                    time.sleep(5)
            serve.stop()
            serve = None
            final = stored_points(data)
            fresh, _ = fresh_points(tmp, "soak", files)
            baseline = next((mb for minute, mb in rss if minute >= args.warmup), rss[-1][1])
            end_rss = rss[-1][1]
            bad = {code: n for code, n in statuses.items() if code not in (200, 429, 503)}
            failed_syncs = {k: v for k, v in syncs.items() if v != "ok"}
            lines += [
                f"{args.minutes:g} min, {args.clients} clients (think {args.think} s), {args.objects} objects, "
                f"{args.change} changed + 1 deleted + 1 added each minute",
                f"questions: {sum(statuses.values()):,} answered by status {dict(sorted(statuses.items()))}; transport "
                f"errors {len(errors)}; errors other than 429/503: {sum(bad.values())} (floor: 0: "
                f"{'met' if not bad and not errors else 'NOT met'})",
                f"syncs seen: {len(syncs)}, not ok: {len(failed_syncs)} {failed_syncs or ''}(floor: every sync done: "
                f"{'met' if syncs and not failed_syncs else 'NOT met'})",
                f"server RSS: {rss[0][1]:.0f} MB at start, {baseline:.0f} MB after {args.warmup:g} min of warm-up, "
                f"{end_rss:.0f} MB at the end ({(end_rss - baseline) / baseline:+.1%}; floor within 10%: "
                f"{'met' if abs(end_rss - baseline) <= 0.10 * baseline else 'NOT met'}); "
                f"max {max(m for _, m in rss):.0f}",
                f"final points equal to a fresh `dpr ingest` of the final objects: {final == fresh} ({len(final):,})",
                "server RSS MB every 3 minutes: " + ", ".join(
                    f"{minute:.0f}: {mb:.0f}" for minute, mb in every(rss, 3.0)),
            ]
        finally:
            if serve is not None:
                serve.stop()
            server.stop()
    report(lines, RESULTS if args.out else None,
           "Sources soak: dpr serve syncing an s3:// source every minute under questions (issue 70)",
           f"`nice -n 10 .venv/bin/python benchmarks/soak_sources.py --minutes {args.minutes:g} --objects "
           f"{args.objects} --clients {args.clients} --think {args.think:g} --out` (SeaweedFS 4.48 on loopback; "
           "SciFact abstracts; the server's own schedule, DPR_SOURCES__TICK_SECONDS=5).")


if __name__ == "__main__":
    main()
