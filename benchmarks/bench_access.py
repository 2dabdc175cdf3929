"""What the access control costs: ``AccessGate.decide`` alone (stat of keys.json, sha256 of the token, role and
collection checks, token bucket) with 100 keys on file; one audit line (O_APPEND write + fsync); and a whole
GET /v1/status through the ASGI app (TestClient, no sockets) with keys on against keys off, in alternating rounds.
Prints the CPU, the commit, and the medians side by side.

    nice -n 10 .venv/bin/python benchmarks/bench_access.py [--requests 1000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from machine import commit, cpu_model, script  # benchmarks/ is sys.path[0]

REPO = script("tests")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from fastapi.testclient import TestClient
    from kit.fakes import FakeRuntime
    from kit.policy import make_settings

    from entrypoints.api.app import create_app
    from services.access import AccessGate, KeyStore, keys_path
    from services.core.settings import ApiSettings

    print(f"CPU: {cpu_model()}; commit {commit()}; python {platform.python_version()}")
    with tempfile.TemporaryDirectory() as tmp:
        locked_dir, open_dir = Path(tmp) / "locked", Path(tmp) / "open"
        store = KeyStore(keys_path(locked_dir))
        tokens = [store.create("read", name=f"k{i}")[1] for i in range(100)]
        gate = AccessGate(locked_dir, rate=1e9, burst=10**9)
        token = tokens[-1].encode()
        n = 20_000
        t0 = time.perf_counter()
        for _ in range(n):
            gate.decide(token, "read", "passages", "127.0.0.1")
        decide_us = (time.perf_counter() - t0) / n * 1e6
        print(f"AccessGate.decide, 100 keys on file: {decide_us:.1f} us per call ({n:,} calls)")
        appends = 500
        t0 = time.perf_counter()
        for i in range(appends):
            gate.audit_log.append({"action": "DELETE /v1/documents/{doc_id:path}", "target": {"doc_id": str(i)},
                                   "status": 200})
        audit_ms = (time.perf_counter() - t0) / appends * 1e3
        print(f"AuditLog.append (O_APPEND, fsync per line): {audit_ms:.2f} ms per line ({appends} lines, {tmp})")

        api = ApiSettings(rate_limit=1e9, rate_burst=10**9)
        clients = {
            "keys on": (TestClient(create_app(make_settings(data_dir=locked_dir, api=api), runtime=FakeRuntime(),
                                              warm_model=False)), {"X-API-Key": tokens[0]}),
            "keys off": (TestClient(create_app(make_settings(data_dir=open_dir, api=api), runtime=FakeRuntime(),
                                               warm_model=False)), {}),
        }
        per_round: dict[str, list[float]] = {name: [] for name in clients}
        for client, headers in clients.values():
            client.__enter__()
            assert client.get("/v1/status", headers=headers).status_code == 200
        for _ in range(args.rounds):
            for name, (client, headers) in clients.items():
                t0 = time.perf_counter()
                for _ in range(args.requests):
                    client.get("/v1/status", headers=headers)
                per_round[name].append((time.perf_counter() - t0) / args.requests * 1e3)
        for client, _ in clients.values():
            client.__exit__(None, None, None)
    on, off = statistics.median(per_round["keys on"]), statistics.median(per_round["keys off"])
    print(f"GET /v1/status through the app, median of {args.rounds} rounds x {args.requests} requests:")
    print(f"  keys off {off:.3f} ms   keys on {on:.3f} ms   on/off {on / off:.3f}")
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
