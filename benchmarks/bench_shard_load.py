"""What opening an embedded shard costs, with its payload indexes in RAM and memory-mapped (issue 58: every turn of
the lease and every swap makes a serving process load it, holding the GIL), and what the mapped indexes cost
filtered questions.

Copies ``--shard`` (a kept generation's ``shard`` directory, e.g. the no-settings 1M data dir of ``scale.md``) to
``--work``, moves the copy's payload indexes as an index build does (``move_payload_indexes``), then for the
original and the copy, in alternating rounds: ``EdgeShard.load`` (wall, the process's anonymous RSS after it) and
dense questions at ``--ef`` with three filters: 50 ``doc_id`` values (the index answers), ``chunk_index == 0`` and
``source ==`` its most common value (both match nearly every point: the graph checks each point it visits).
Prints the machine line.

    nice -n 10 .venv/bin/python benchmarks/bench_shard_load.py --shard DIR/store/passages/generations/G/shard \
        --work /tmp/shard-load [--rounds 3] [--ef 2048]
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from machine import machine_line, script  # benchmarks/ is sys.path[0]

REPO = script()

PROBE = r"""
import collections, json, sys, time
import numpy as np
from qdrant_edge import EdgeShard, QuantizationSearchParams, ScrollRequest, SearchParams
from services.store.common import Match, Where
from services.store.edge.config import query_request

path, ef = sys.argv[1], int(sys.argv[2])
started = time.perf_counter()
shard = EdgeShard.load(path)
load_s = time.perf_counter() - started
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
anon_mb = int(status["RssAnon"].split()[0]) / 1024
records, _ = shard.scroll(ScrollRequest(limit=5000, with_payload=True))
ids = [r.payload["doc_id"] for r in records]
source = collections.Counter(r.payload.get("source") for r in records).most_common(1)[0][0]
filters = {"doc_id any of 50": Where(must=(Match("doc_id", tuple(ids[:50]), any_of=True),)),
           "chunk_index == 0": Where(must=(Match("chunk_index", (0,)),)),
           "source == most common": Where(must=(Match("source", (source,)),))}
params = SearchParams(hnsw_ef=ef, quantization=QuantizationSearchParams(rescore=True, oversampling=2.0))
questions = np.random.default_rng(0).normal(size=(100, 384)).astype(np.float32)
ms = {}
for name, where in filters.items():
    shard.query(query_request(("dense", questions[0].tolist()), 10, where, False, params))  # warm
    t0 = time.perf_counter()
    for q in questions:
        shard.query(query_request(("dense", q.tolist()), 10, where, False, params))
    ms[name] = (time.perf_counter() - t0) / len(questions) * 1e3
shard.close()
print(json.dumps({"load_s": load_s, "anon_mb": anon_mb, "filter_ms": ms}))
"""


def move_indexes(shard: Path) -> tuple[list[str], float]:
    from qdrant_edge import EdgeShard

    from services.store.edge.config import EdgeLevers, move_payload_indexes

    started, opened = time.perf_counter(), EdgeShard.load(str(shard))
    moved = move_payload_indexes(opened, EdgeLevers())
    opened.flush()
    opened.close()
    return moved, time.perf_counter() - started


def probe(shard: Path, ef: int) -> dict[str, Any]:
    import json

    out = subprocess.run([sys.executable, "-c", PROBE, str(shard), str(ef)], cwd=REPO, env={"PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, check=True)
    answer: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    return answer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shard", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True, help="where the moved copy goes (replaced)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ef", type=int, default=2048)
    args = ap.parse_args()
    print(machine_line())
    copy = args.work / "shard"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(args.shard, copy)
    moved, took = move_indexes(copy)
    print(f"moved {len(moved)} payload indexes of the copy in {took:.1f} s: {', '.join(moved) or 'none'}")
    seen: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for _ in range(args.rounds):
        for label, shard in (("in RAM (as kept)", args.shard), ("memory-mapped", copy)):
            seen[label].append(probe(shard, args.ef))
    names = list(seen["memory-mapped"][0]["filter_ms"])
    print("\n| indexes | load s | anonymous RSS after the load MB | " + " | ".join(f"{n} ms" for n in names) + " |")
    print("|---|---:|---:|" + "---:|" * 3)
    for label, runs in seen.items():
        cells = [_span([r["load_s"] for r in runs]), f"{max(r['anon_mb'] for r in runs):,.0f}"]
        cells += [_span([r["filter_ms"][name] for r in runs]) for name in names]
        print(f"| {label} | " + " | ".join(cells) + " |")


def _span(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"


if __name__ == "__main__":
    main()
