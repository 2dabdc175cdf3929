"""Snapshot size, time and restore equality through the real store.

    python benchmarks/bench_snapshot.py --data-dir DATA [--queries N] [--out benchmarks/results/reliability/snapshot.md]

Reads the collection under DATA (ingest first, e.g. `dpr --data-dir DATA ingest scifact-600.jsonl`), answers the
first N SciFact test questions in dense, sparse and hybrid mode, takes a snapshot (`services.ops.snapshots`), restores
it into a fresh data dir, answers the same questions there and compares every hit (document, chunk, score). Prints
the CPU model and flags, the commit, and the figures.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from machine import commit, cpu_flags, cpu_model

from services.core.settings import Settings
from services.ops.snapshots import create_snapshot, restore_snapshot
from services.query import QueryOptions
from services.runtime import Runtime

QUERIES = Path(__file__).resolve().parents[2] / "shared" / "data" / "beir-scifact" / "queries.jsonl"


def answers(settings: Settings, questions: list[str]) -> dict[str, list[tuple[str, int, float]]]:
    out = {}
    with Runtime(settings) as runtime:
        for mode in ("dense", "sparse", "hybrid"):
            for q in questions:
                hits = runtime.search(q, QueryOptions(k=10, mode=mode))  # type: ignore[arg-type]
                out[f"{mode}:{q}"] = [(h.passage.doc_id, h.passage.chunk_index, h.score) for h in hits]
    return out


def canonical(hits: list[tuple[str, int, float]]) -> tuple[object, ...]:
    """A hit list up to the order of equal scores: the scores in order, and the hits above the last score (the
    engine orders exact ties, e.g. RRF's, differently from one run to the next, even on the same store; at the
    cut-off k a tie may take either member)."""
    scores = [score for _, _, score in hits]
    floor = min(scores, default=0.0)
    return tuple(scores), tuple(sorted((d, c, s) for d, c, s in hits if s > floor))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    questions = [json.loads(line)["text"] for line in QUERIES.read_text().splitlines()[: args.queries]]
    settings = Settings(data_dir=args.data_dir)
    before = answers(settings, questions)
    with tempfile.TemporaryDirectory(prefix="dpr-snap-") as tmp:
        from services.store import open_store

        store = open_store(settings)
        try:
            made = create_snapshot(settings, store.engine, Path(tmp) / "snaps")  # type: ignore[attr-defined]
        finally:
            store.close()
        store_bytes = sum(p.stat().st_blocks * 512 for p in (settings.store_dir / settings.collection).rglob("*")
                          if p.is_file())
        started = time.perf_counter()
        restored = restore_snapshot(Path(made["snapshot"]), settings.model_copy(update={"data_dir": Path(tmp) / "r"}))
        restore_s = time.perf_counter() - started
        after = answers(settings.model_copy(update={"data_dir": Path(tmp) / "r"}), questions)
    again = answers(settings, questions)  # the original store once more: how much the engine itself varies
    same = sum(before[k] == after[k] for k in before)
    same_self = sum(before[k] == again[k] for k in before)
    ties = sum(canonical(before[k]) == canonical(after[k]) for k in before)
    lines = [
        f"- CPU: {cpu_model()} ({cpu_flags()}); commit {commit()}",
        f"- collection: {made['points']:,} points ({made['generation']}), store on disk {store_bytes / 1e6:.1f} MB",
        f"- snapshot: {made['bytes'] / 1e6:.2f} MB archive, {made['files']} files, created in {made['seconds']:.2f} s",
        f"- restore into a fresh data dir: {restore_s:.2f} s ({restored['points']:,} points)",
        f"- restore equality over {len(questions)} SciFact test questions x dense, sparse, hybrid, k=10 "
        f"({len(before)} distinct lists): {ties} / {len(before)} identical up to the order of equal scores; "
        f"{same} / {len(before)} identical in order too (the original store against itself: {same_self} / "
        f"{len(before)}: the engine orders exact ties, e.g. hybrid RRF, differently from run to run)",
    ]
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
