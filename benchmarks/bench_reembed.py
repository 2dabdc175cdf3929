"""Re-embed throughput beside plain ingest throughput, on the same passages, in one run.

Corpus: the first ``--docs`` BEIR SciFact abstracts (needs ../shared/data/beir-scifact beside the repo), default
chunking. Models: the base model (all-MiniLM-L6-v2) and a second, real model of the same size (the base model
with one layer's weights scaled by 1.05, saved under the temp data dir: a different fingerprint, the same compute).
Steps, all in this process, embedded store (as `dpr ingest` / `dpr reembed` without a broker):

1. ingest with the base model into a fresh store (chunk, encode, BM25, upsert);
2. re-embed that collection with the second model (scroll the stored passages, encode, BM25, upsert into the new
   generation, catch-up, verify, swap) - the whole `dpr reembed` path, timed end to end and split into copy and
   finalize (catch-up + verify + swap);
3. ingest with the second model into another fresh store (the same encoder work as step 2, for the ratio);
4. step 1 again (the machine is shared: the spread of 1 and 4 shows the noise).

Usage: ``.venv/bin/python benchmarks/bench_reembed.py [--docs 300]``; writes
``benchmarks/results/ingest-speed/reembed.md``.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path

from machine import machine_line, script  # benchmarks/ is sys.path[0]

REPO = script("tests")  # kit.tiny_models: the second model, as tests/integration/test_reembed.py builds it


DATA = REPO.parent / "shared" / "data" / "beir-scifact"
OUT = REPO / "benchmarks" / "results" / "ingest-speed" / "reembed.md"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=300)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if not DATA.is_dir():
        sys.exit(f"needs {DATA} (BEIR SciFact) beside the repo")

    from kit.tiny_models import second_base_model

    from encoders.towers import SentenceTransformerTowers, base_model_path
    from services import lifecycle as rb
    from services.core.settings import Settings
    from services.ingest.executor import ingest_here
    from services.ingest.pipeline import IngestPipeline
    from services.readers import Document, load_beir
    from services.runtime import local_jobs
    from services.store import Store
    from services.store.edge.engine import EdgeEngine
    from services.store.sparse import default_embedder

    corpus = load_beir(DATA, "test").corpus
    docs = [Document(doc_id=d.doc_id, text=d.text, title=d.title, source="scifact")
            for d in list(corpus.values())[: args.docs]]
    work = Path(tempfile.mkdtemp(prefix="dpr-bench-reembed-"))
    rows: list[tuple[str, int, float, str]] = []
    try:
        settings = Settings(data_dir=work)
        base = SentenceTransformerTowers(base_model_path(), name="base")
        v2 = SentenceTransformerTowers(second_base_model(settings.models_dir / "v2"), name="v2")
        sparse = default_embedder()
        base.encode_documents(["warm up"]), v2.encode_documents(["warm up"])  # load both models before timing

        def ingest(towers: SentenceTransformerTowers, alias: str, label: str) -> Store:
            store = Store(EdgeEngine(work / "store", alias))
            t0 = time.perf_counter()
            pipeline = IngestPipeline(store=store, towers=towers, chunking=settings.chunk, sparse=sparse,
                                      batch_size=settings.encoder.batch_size)
            report = ingest_here(pipeline, docs, local_jobs(work / alias))
            seconds = time.perf_counter() - t0
            rows.append((label, report.chunks, seconds, f"{len(docs)} documents"))
            return store

        store = ingest(base, "a", "1. ingest, base model")

        t0 = time.perf_counter()
        state = rb.plan(store, v2, model_name="v2")
        assert state is not None
        copied = 0
        for batch in rb.pending_batches(store, state, settings.reembed.batch_size):
            copied += rb.copy_batch(store, state, batch, v2, sparse, settings.encoder.batch_size)
        t_copy = time.perf_counter() - t0
        t1 = time.perf_counter()
        result = rb.finalize(store, state, v2, sparse)
        t_final = time.perf_counter() - t1
        total = time.perf_counter() - t0
        assert result.outcome == "activated" and result.verification and result.verification.ok
        rows.append(("2. re-embed, second model (end to end)", copied, total,
                     f"copy {t_copy:.1f} s + catch-up/verify/swap {t_final:.2f} s"))
        rows.append(("   2a. copy only (scroll, encode, upsert)", copied, t_copy, ""))
        store.close()
        ingest(v2, "b", "3. ingest, second model").close()
        ingest(base, "c", "4. ingest, base model (again)").close()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    head = "| step | passages | seconds | passages/s | note |\n|---|---:|---:|---:|---|"
    lines = [head] + [f"| {label} | {n} | {s:.1f} | {n / s:.1f} | {note} |" for label, n, s, note in rows]
    ingest_rates = [n / s for label, n, s, _ in rows if "ingest" in label]
    ratio = (rows[1][1] / rows[1][2]) / (sum(ingest_rates) / len(ingest_rates))
    table = "\n".join(lines)
    summary = f"re-embed / mean ingest throughput: {ratio:.2f}"
    print(table)
    print(summary)
    from services.core.settings import Settings

    backend = Settings().encoder.passages
    print(machine_line())
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        "# Re-embed vs ingest throughput\n\n"
        f"`.venv/bin/python benchmarks/bench_reembed.py --docs {args.docs}` (shared machine: use the ratios). BEIR "
        "SciFact abstracts, default chunking, embedded store, in-process (no broker), the passage tower on "
        f"{backend} (chosen from the CPU).\n\n{machine_line()}\n\n" + table + f"\n\n{summary}\n\n"
        "Re-embedding reads the stored passage text (no source files, no parsing, no chunking) and does the same "
        "encoder work as ingest, so its throughput is bounded by the passage tower, like ingest's. The extra "
        "cost over the copy is the catch-up + verification scans and the swap.\n"
    )
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
