"""The store's BM25 against a reference BM25 (bm25s), with the same tokens, on every shared collection.

For each collection, every document (title + text, one passage per document) is tokenised once by the product's
sparse encoder (``services.store.sparse``: qdrant-edge Bm25, English stopwords and Snowball stemming; Kiwi morphemes
for Korean); the token hashes are the terms both sides see. Then:

- ``bm25s``: bm25s (method ``lucene``, k1 1.2, b 0.75: the product's k and b, and the IDF Qdrant's IDF modifier
  uses) indexed on those terms (each document's terms repeated by their counts), queried with each question's
  distinct terms;
- ``store (before)``: the real store (embedded qdrant-edge, sparse search) with the document vectors weighted as
  before this change: a fixed average length of 256 tokens (vectors without counts, so the store keeps them);
- ``store (after)``: the real store with the vectors re-weighted by the store from the generation's own
  statistics (``services.store.bm25``), written in ingest-sized batches so the average grows as it would, then
  ``maybe_optimize`` as at the end of an ingest job (it re-weights points more than 5% off the final average);
- ``shortest first``: the same, the documents written shortest first: the worst order for drift (each batch is
  weighted with the average of what is in by then, which stays below the final one until the end), read before
  and after the end-of-job re-weighting.

nDCG@10 on each collection's judged queries. Prints the CPU, the commit, and the table;
``--out`` writes it as markdown.

    nice -n 10 .venv/bin/python benchmarks/bench_bm25.py --out benchmarks/results/quality/bm25.md
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import sys
import tempfile
import time
from pathlib import Path

from machine import commit, cpu_flags, cpu_model, script  # benchmarks/ is sys.path[0]

REPO = script()

from encoders.data import RetrievalDataset  # noqa: E402
from services.lab.shared.metrics import ir_metrics  # noqa: E402
from services.readers.beir import load_beir  # noqa: E402
from services.readers.squad import load_squad  # noqa: E402
from services.store import Store  # noqa: E402
from services.store.edge.engine import EdgeEngine  # noqa: E402
from services.store.points import CollectionSpec, Passage, PassagePoint, SearchRequest  # noqa: E402
from services.store.sparse import Bm25Embedder, embedder_for  # noqa: E402

DATA = Path("/work/shared/data")
K, B = 1.2, 0.75
BATCH = 256  # points per upsert, as an ingest job writes them


def datasets(names: list[str], squad_questions: int) -> dict[str, tuple[RetrievalDataset, str]]:
    out: dict[str, tuple[RetrievalDataset, str]] = {}
    for name in names:
        if name == "scifact":
            out[name] = (load_beir(DATA / "beir-scifact", "test"), "en")
        elif name in ("cranfield", "cisi"):
            out[name] = (load_beir(DATA / name, "test"), "en")
        elif name in ("squad", "korquad"):
            folder = DATA / ("squad-v1.1-dev" if name == "squad" else "korquad-v1.0-dev")
            ds = load_squad(next(folder.glob("*.json*")))
            keep = sorted(ds.queries)[:squad_questions]
            out[name] = (ds.subset(keep), "en" if name == "squad" else "ko")
    return out


def ndcg(ds: RetrievalDataset, run: dict[str, dict[str, float]]) -> float:
    return float(ir_metrics(ds.qrels, run, ["ndcg@10"])["ndcg@10"])


Run = dict[str, dict[str, float]]


def reference(ds: RetrievalDataset, enc: Bm25Embedder, counts: dict[str, dict[int, int]]) -> Run:
    import bm25s

    ids = sorted(counts)
    docs = [[str(t) for t, c in counts[d].items() for _ in range(c)] for d in ids]
    index = bm25s.BM25(method="lucene", k1=K, b=B)
    index.index(docs, show_progress=False)
    vocab = index.vocab_dict
    qids = sorted(ds.queries)
    run: dict[str, dict[str, float]] = {}
    for qid in qids:
        # every token of the question, repeats included (bm25s and Lucene sum over them; so does the store now)
        terms = [str(t) for t, c in enc.term_counts(ds.queries[qid]).items() for _ in range(c) if str(t) in vocab]
        if not terms:
            run[qid] = {}
            continue
        scores = index.get_scores(terms)
        top = scores.argsort()[::-1][:100]
        run[qid] = {ids[i]: float(scores[i]) for i in top if scores[i] > 0}
    return run


def search_all(store: Store, ds: RetrievalDataset, enc: Bm25Embedder) -> Run:
    run: Run = {}
    for qid in sorted(ds.queries):
        hits = store.search(SearchRequest(k=100, mode="sparse", sparse=enc.embed_query(ds.queries[qid])))
        run[qid] = {h.passage.doc_id: h.score for h in hits}
    return run


def through_store(ds: RetrievalDataset, enc: Bm25Embedder, root: Path, before: bool,
                  order: list[str] | None = None) -> tuple[Run | None, Run, float, int]:
    """(run before the end-of-job re-weighting (drift runs only), run after, the store's avg length, points
    re-weighted)."""
    store = Store(EdgeEngine(root, "bm25", idle_release=5))
    store.ensure_collection(CollectionSpec(dim=2, distance="cosine", model="bm25-bench", sparse=True,
                                           settings={"bm25": enc.config()}))
    ids = order or sorted(ds.corpus)
    for start in range(0, len(ids), BATCH):
        points = []
        for d in ids[start : start + BATCH]:
            vector = enc.embed_document(ds.corpus[d].passage)
            if before:  # the old vectors: weighted at the fixed prior, nothing for the store to re-weight
                vector = dataclasses.replace(vector, counts=None)
            points.append(PassagePoint(Passage(doc_id=d, chunk_index=0, text=ds.corpus[d].passage, doc_hash="h",
                                               model="bm25-bench"), dense=[1.0, 0.0], sparse=vector))
        store.upsert(points)
    avg = store.bm25_stats().avg_len or 0.0
    drifted = search_all(store, ds, enc) if order else None
    reweighted = 0 if before else store.bm25_renormalize()  # what maybe_optimize does at the end of an ingest job
    run = search_all(store, ds, enc)
    store.close()
    return drifted, run, avg, reweighted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", default="scifact,cranfield,cisi,squad,korquad")
    parser.add_argument("--squad-questions", type=int, default=2000,
                        help="SQuAD/KorQuAD questions read (all their paragraphs are indexed)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    header = [f"CPU: {cpu_model()} (flags: {cpu_flags() or '-'}); commit {commit()}; "
              f"python {platform.python_version()}",
              f"command: {' '.join(sys.argv)}",
              f"bm25s lucene k1 {K} b {B} on the product's tokens; store = embedded qdrant-edge, sparse search, "
              f"upserts of {BATCH}"]
    print("\n".join(header), flush=True)
    rows = []
    for name, (ds, lang) in datasets(args.sets.split(","), args.squad_questions).items():
        t0 = time.perf_counter()
        enc = embedder_for(lang)
        counts = {d: enc.term_counts(doc.passage) for d, doc in ds.corpus.items()}
        true_avg = sum(sum(c.values()) for c in counts.values()) / len(counts)
        ref = ndcg(ds, reference(ds, enc, counts))
        with tempfile.TemporaryDirectory() as tmp:
            _, old, _, _ = through_store(ds, enc, Path(tmp) / "before", before=True)
            _, new, avg, moved = through_store(ds, enc, Path(tmp) / "after", before=False)
            shortest = sorted(counts, key=lambda d: (sum(counts[d].values()), d))
            drift, fixed, _, moved_drift = through_store(ds, enc, Path(tmp) / "drift", before=False, order=shortest)
        assert drift is not None
        row = (name, len(ds.corpus), len(ds.queries), true_avg, avg, ref, ndcg(ds, old), ndcg(ds, new),
               ndcg(ds, drift), ndcg(ds, fixed), moved, moved_drift)
        rows.append(row)
        print(f"{name}: docs {row[1]}, queries {row[2]}, avg len {true_avg:.1f} (store {avg:.1f}); bm25s {ref:.4f}, "
              f"store before {row[6]:.4f}, after {row[7]:.4f} ({moved} re-weighted), shortest first {row[8]:.4f} -> "
              f"{row[9]:.4f} ({moved_drift} re-weighted) ({time.perf_counter() - t0:.0f} s)", flush=True)
    lines = ["| collection | docs | queries | avg len (tokens) | bm25s | store before (avg 256) | store after | "
             "after - bm25s | shortest first, as written | shortest first, after the end-of-job re-weighting |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, n_docs, n_q, true_avg, _, ref, old, new, drift, fixed, _, moved_drift in rows:
        lines.append(f"| {name} | {n_docs:,} | {n_q:,} | {true_avg:.1f} | {ref:.4f} | {old:.4f} | {new:.4f} | "
                     f"{new - ref:+.4f} | {drift:.4f} ({drift - ref:+.4f}) | {fixed:.4f} ({fixed - ref:+.4f}; "
                     f"{moved_drift:,} points re-weighted) |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.write_text("# BM25 through the store vs bm25s (nDCG@10)\n\n" + "\n\n".join(header) + "\n\n" + table
                            + "\n")


if __name__ == "__main__":
    main()
