"""What ``dpr_client`` costs: its import (wall and peak RSS of a fresh process, against bare Python and ``import
httpx``), and its per-search overhead over raw httpx on loopback: the same POST /v1/search against one server
process that answers with a canned body (10 hits of 600-character passages, as ``dpr serve`` would), so the
difference is the client's own work (building and validating ``SearchIn``, parsing hits into ``HitOut``, the retry
loop). Alternating rounds; medians. Prints the machine line.

    nice -n 10 .venv/bin/python benchmarks/bench_client.py [--searches 500] [--rounds 5] [--imports 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from machine import machine_line, script  # benchmarks/ is sys.path[0]

REPO = script()
HIT = {"doc_id": "gnuplot.pdf", "chunk_index": 7, "score": 0.71, "title": "gnuplot", "text": "x" * 600,
       "model": "f" * 16, "source": "gnuplot.pdf", "page": 112, "heading": ["Terminals", "png"], "format": "pdf",
       "place": "gnuplot.pdf p. 112"}
BODY = json.dumps({"hits": [HIT] * 10, "took_ms": 3.2}).encode()
SERVER = f"""
import sys, uvicorn
BODY = {BODY!r}
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({{"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}})
    await send({{"type": "http.response.body", "body": BODY}})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""
# VmHWM, not ru_maxrss: a child's ru_maxrss starts at its parent's RSS at fork (Linux keeps it across exec)
# CPU time beside wall: on a shared machine the wall includes waiting for a core
IMPORT = ("import time; t, c = time.perf_counter(), time.process_time(); {stmt}; "
          "wall, cpu = time.perf_counter() - t, time.process_time() - c; "
          "print(wall, cpu, next(line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM')))")


def imports(stmt: str, runs: int) -> tuple[float, float, float]:
    """Median import wall and CPU time (s) and peak RSS (MB) of ``stmt`` in a fresh interpreter."""
    rows = [subprocess.run([sys.executable, "-c", IMPORT.format(stmt=stmt)], capture_output=True, text=True,
                           check=True, cwd=REPO).stdout.split() for _ in range(runs)]
    wall, cpu, rss = (statistics.median(float(r[i]) for r in rows) for i in range(3))
    return wall, cpu, rss / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--searches", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--imports", type=int, default=10)
    args = parser.parse_args()

    import httpx

    sys.path.insert(0, str(REPO / "tests" / "integration"))
    from api_server import free_port

    from dpr_client import Client

    print(machine_line())
    print("the machine is shared with other sessions' work: compare the figures of one run, not across runs")
    print(f"\nimport in a fresh process (median of {args.imports}): wall, CPU time, peak RSS (VmHWM)")
    for stmt in ("pass", "import httpx", "import httpx; from pydantic import BaseModel, Field",
                 "from dpr_client import AsyncClient, Client"):
        wall, cpu, rss = imports(stmt, args.imports)
        print(f"  {stmt:<53} {wall * 1000:7.1f} ms wall {cpu * 1000:7.1f} ms CPU {rss:6.1f} MB")

    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.post(f"{url}/v1/search", json={"question": "q"}).raise_for_status()
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        body = {"question": "How do I save a plot as a PNG image?", "k": 10}
        raw_ms: list[float] = []
        client_ms: list[float] = []
        with httpx.Client(base_url=url) as raw, Client(url, api_key="") as dpr:
            for _ in range(50):  # warm both
                raw.post("/v1/search", json=body).json()
                dpr.search(body["question"], k=10)
            for _ in range(args.rounds):
                t = time.perf_counter()
                for _ in range(args.searches):
                    hits = raw.post("/v1/search", json=body).json()["hits"]
                raw_ms.append((time.perf_counter() - t) * 1000 / args.searches)
                t = time.perf_counter()
                for _ in range(args.searches):
                    typed = dpr.search(body["question"], k=10).hits
                client_ms.append((time.perf_counter() - t) * 1000 / args.searches)
        assert len(hits) == len(typed) == 10
    finally:
        server.terminate()
        server.wait(10)
    raw_med, client_med = statistics.median(raw_ms), statistics.median(client_ms)
    print(f"\nPOST /v1/search on loopback, 10 hits; {args.rounds} alternating rounds of {args.searches} (median ms per "
          "search)")
    print(f"  raw httpx (post + .json())      {raw_med:6.3f} ms   rounds {', '.join(f'{x:.3f}' for x in raw_ms)}")
    print(f"  dpr_client.Client.search        {client_med:6.3f} ms   rounds "
          f"{', '.join(f'{x:.3f}' for x in client_ms)}")
    print(f"  the client's overhead           {client_med - raw_med:6.3f} ms per search (goal <= 2 ms); ratio "
          f"{client_med / raw_med:.2f}x")
    # The same work without the network (CPU only, so the shared machine's noise is smaller): the body built and
    # the answer read, by the client (SearchIn + SearchOut into HitOut) and by hand (json.dumps + json.loads)
    from dpr_client.client import _routes
    from dpr_client.wire import SearchOut

    def by_client() -> None:
        _routes.search(body["question"], 10, None, None, {})
        SearchOut.model_validate_json(BODY)

    def by_hand() -> None:
        json.dumps(body)
        json.loads(BODY)

    n = args.searches * 10
    for label, work in (("by hand (json.dumps + json.loads)", by_hand),
                        ("the client (SearchIn + SearchOut)", by_client)):
        times = []
        for _ in range(args.rounds):
            t = time.process_time()
            for _ in range(n):
                work()
            times.append((time.process_time() - t) * 1e6 / n)
        print(f"  {label:<34} {statistics.median(times):7.1f} us CPU per search (median of {args.rounds} x {n})")


if __name__ == "__main__":
    main()
