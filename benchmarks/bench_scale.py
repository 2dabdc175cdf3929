"""Scale of one embedded collection (issue 42): N passages, each memory lever, in-process.

For each lever configuration (``--levers``: fp32, int8, int8-disk, and each with HNSW m 32 / ef_construct 200:
fp32-m32, int8-m32, int8-disk-m32; budget-32 / budget-16: no lever set, ``DPR_EDGE__MEMORY_BUDGET_MB`` 32 or 16, the
budget choosing at the build, issue 56; old-defaults: the engine's m 16 graph; one-segment: ``DPR_EDGE__SEGMENTS=1``,
one graph where a build otherwise makes one per CPU core) a fresh data dir gets a collection of
``--passages`` points through the real store (``EdgeEngine.from_settings``, the layout `dpr serve` reads):

- **real part**: the first ``--real-docs`` SciFact abstracts, chunked with the passage tower's tokenizer and
  embedded by the real passage tower (``encoder.backend``, onnx-int8 by default), with their BM25 vectors;
- **synthetic bulk**: vectors drawn from a Gaussian fitted to the real passage vectors (their mean and covariance,
  shrunk by 1e-3 on the diagonal, then normalised to unit length), each with the text and BM25 vector of a real
  passage (cycled), so payload bytes and the sparse index are realistic; ids ``synNNN``. Deterministic per chunk
  (seed, chunk), so the exact scan regenerates them instead of holding N x dim floats.

Then: upsert rate; the HNSW build (``store.optimize()``: a child process on a copy) with a thread querying the
store meanwhile (p50 / p99 and queries answered during the build); after it, dense and hybrid (RRF) p50 / p99 of
the store search with pre-encoded real SciFact questions (the question tower's own time is reported once,
beside); recall@10 of dense search against the exact scan (numpy over every vector); disk per passage (``du`` of
the generation); RSS growth of this process from opening the built store to after the queries. With ``--keep
DIR`` the data dirs stay, and ``benchmarks/bench_load.py --data-dir DIR/<lever>/dpr`` serves one.

Usage::

    nice -n 10 .venv/bin/python benchmarks/bench_scale.py --passages 50000 --real-docs 300 --queries 100
    # the issue's run (hours on 2 cores; see benchmarks/results/query-speed/scale.md):
    nice -n 10 .venv/bin/python benchmarks/bench_scale.py --passages 1000000 --real-docs 5183 --queries 300 \
        --keep /data/scale1m --out benchmarks/results/query-speed/scale.md
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from machine import commit, machine_line, script, upsert_stream  # benchmarks/ is sys.path[0]

REPO = script()

import numpy as np  # noqa: E402
from bench_api import load_docs, load_questions  # noqa: E402
from bench_load import percentile  # noqa: E402

from services.core.settings import Settings  # noqa: E402
from services.core.store_settings import EdgeSettings  # noqa: E402
from services.ingest.language import collection_spec  # noqa: E402
from services.ingest.pipeline import chunk_document  # noqa: E402
from services.readers import Document  # noqa: E402
from services.runtime import Runtime  # noqa: E402
from services.store import Store  # noqa: E402
from services.store.common import LABEL_FREE_FUSION  # noqa: E402
from services.store.edge.engine import EdgeEngine  # noqa: E402
from services.store.points import CollectionSpec, Passage, PassagePoint, SearchRequest, SparseVector  # noqa: E402

SCIFACT = REPO.parent / "shared" / "data" / "beir-scifact"
CHUNK = 50_000  # synthetic vectors generated (and scanned) per chunk
LEVERS: dict[str, dict[str, Any]] = {
    "fp32": {},
    "fp32-m32": {"hnsw_m": 32, "hnsw_ef_construct": 200},
    "old-defaults": {"hnsw_m": 16, "hnsw_ef_construct": 100},  # the engine's graph, the defaults before issue 56
    "one-segment": {"segments": 1},  # one graph, as builds made before the split into one segment per core
    "int8": {"quantization": "int8", "rescore": True, "oversampling": 2.0},
    "int8-disk": {"quantization": "int8", "rescore": True, "oversampling": 2.0, "vectors_on_disk": True},
    "int8-m32": {"quantization": "int8", "rescore": True, "oversampling": 2.0, "hnsw_m": 32, "hnsw_ef_construct": 200},
    "int8-disk-m32": {"quantization": "int8", "rescore": True, "oversampling": 2.0, "vectors_on_disk": True,
                      "hnsw_m": 32, "hnsw_ef_construct": 200},
    "budget-32": {"memory_budget_mb": 32},  # the budget chooses (fp32 itself: the default budget's choice)
    "budget-16": {"memory_budget_mb": 16},
}


def rss_kb(field: str = "VmRSS") -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def resident_by_file(marker: str = "/generations/") -> dict[str, float]:
    """This process's resident MB of memory-mapped store files, by kind (``vector_storage-dense/matrix.dat``,
    ``wal``, ``payload_index``...), from /proc/self/smaps: which parts of the store the RSS is."""
    groups: dict[str, float] = {}
    path = ""
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(None, 5)
        if head and "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
            path = head[5].strip() if len(head) > 5 else ""
        elif line.startswith("Rss:") and marker in path:
            rel = path.split("/shard/", 1)[-1]
            parts = rel.split("/")
            if parts[0] == "segments" and len(parts) > 2:
                kind = "payload_index" if parts[2] == "payload_index" else "/".join(parts[2:])
            else:
                kind = parts[0]
            kind = "".join("N" if c.isdigit() else c for c in kind)
            groups[kind] = groups.get(kind, 0.0) + int(line.split()[1]) / 1024
    return dict(sorted(groups.items(), key=lambda kv: -kv[1]))


class Corpus:
    """Real passages (vectors, texts, BM25) and a Gaussian fitted to their vectors for the synthetic bulk."""

    def __init__(self, runtime: Runtime, docs: list[Document], seed: int) -> None:
        towers, sparse = runtime.towers, runtime.sparse
        self.passages: list[tuple[Document, Any]] = []
        for doc in docs:
            chunks, _ = chunk_document(doc, towers, runtime.settings.chunk)
            self.passages += [(doc, c) for c in chunks]
        texts = [c.encoder_text for _, c in self.passages]
        t0 = time.perf_counter()
        self.vectors = np.asarray(towers.encode_documents(texts, batch_size=32), dtype=np.float32)  # (n_real, dim)
        self.encode_pps = len(texts) / (time.perf_counter() - t0)
        self.sparse: list[SparseVector] = [sparse.embed_document(t) for t in texts]
        self.fingerprint = towers.fingerprint
        self.spec = collection_spec(towers, sparse)
        self.n_real, self.dim = self.vectors.shape
        self.mean = self.vectors.mean(axis=0)  # (dim,)
        cov = np.cov(self.vectors, rowvar=False) + 1e-3 * np.eye(self.dim)  # (dim, dim), shrunk: n_real may be < dim
        self.factor = np.linalg.cholesky(cov).astype(np.float32)  # (dim, dim)
        self.seed = seed

    def chunk(self, start: int, total: int) -> np.ndarray:
        """Vectors of points ``start .. start+CHUNK`` (real first, then synthetic), unit length."""
        stop = min(total, start + CHUNK)
        out = np.empty((stop - start, self.dim), dtype=np.float32)  # (m, dim)
        real = max(0, min(stop, self.n_real) - start)
        if real:
            out[:real] = self.vectors[start:start + real]
        if stop - start > real:
            rng = np.random.default_rng([self.seed, start // CHUNK])
            z = rng.standard_normal((stop - start - real, self.dim), dtype=np.float32)  # (m, dim)
            x = self.mean + z @ self.factor.T
            out[real:] = x / np.linalg.norm(x, axis=1, keepdims=True)
        return out

    def point(self, k: int, vector: np.ndarray) -> PassagePoint:
        i = k % self.n_real
        doc, c = self.passages[i]
        synthetic = k >= self.n_real
        passage = Passage(
            doc_id=f"syn{k}" if synthetic else doc.doc_id, chunk_index=0 if synthetic else c.index, text=c.text,
            title=c.title, doc_hash=doc.doc_hash, source="synthetic" if synthetic else "scifact",
            model=self.fingerprint,
        )
        return PassagePoint(passage=passage, dense=vector.tolist(), sparse=self.sparse[i])

    def index_of(self, doc_id: str, chunk_index: int) -> int:
        if doc_id.startswith("syn"):
            return int(doc_id[3:])
        if not hasattr(self, "_real_index"):
            self._real_index = {(d.doc_id, c.index): i for i, (d, c) in enumerate(self.passages)}
        return self._real_index[(doc_id, chunk_index)]


def test_split() -> tuple[list[str], list[str], dict[str, dict[str, int]]]:
    """SciFact's test split through the product's loader: question ids (sorted), their texts and the qrels."""
    from services.readers import load_dataset

    test = load_dataset(SCIFACT, "test")
    qids = sorted(test.queries)
    return qids, [test.queries[q] for q in qids], dict(test.qrels)


def ndcg10(qids: list[str], answers: list[Any], qrels: dict[str, dict[str, int]]) -> float:
    """nDCG@10 of documents, each at its best passage's score (``dpr eval``'s aggregation), one answer per id."""
    from services.lab.evaluation.store_retriever import hits_to_retrieval
    from services.lab.shared.metrics import ir_metrics

    return ir_metrics(qrels, hits_to_retrieval(qids, answers, 10).run, ["ndcg@10"])["ndcg@10"]


def exact_top10(corpus: Corpus, total: int, queries: np.ndarray) -> np.ndarray:
    """Exact top 10 point indexes per question, scanning every vector chunk by chunk."""
    best_s = np.full((len(queries), 10), -np.inf, dtype=np.float32)  # (q, 10)
    best_i = np.zeros((len(queries), 10), dtype=np.int64)
    for start in range(0, total, CHUNK):
        scores = queries @ corpus.chunk(start, total).T  # (q, m)
        s = np.concatenate([best_s, scores], axis=1)
        ids = np.concatenate([best_i, np.broadcast_to(np.arange(start, start + scores.shape[1]), scores.shape)], axis=1)
        top = np.argsort(-s, axis=1)[:, :10]
        best_s, best_i = np.take_along_axis(s, top, 1), np.take_along_axis(ids, top, 1)
    return best_i


def timed(store: Store, requests: list[SearchRequest]) -> tuple[list[float], list[Any]]:
    times, answers = [], []
    for r in requests:
        t = time.perf_counter()
        answers.append(store.search(r))
        times.append((time.perf_counter() - t) * 1000)
    return times, answers


def stats(ms: list[float]) -> str:
    if not ms:
        return "-"
    s = sorted(ms)
    return f"{statistics.median(s):.1f} / {percentile(s, 0.99):.1f}"


def du_bytes(path: Path) -> int:
    """Allocated bytes (``du``: sparse files count what they hold)."""
    done = subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[0]) * 1024


def recall(corpus: Corpus, answers: list[Any], truth: np.ndarray) -> float:
    found = [
        len({corpus.index_of(h.passage.doc_id, h.passage.chunk_index) for h in hits} & set(truth[q].tolist()))
        for q, hits in enumerate(answers)
    ]
    return sum(found) / (10 * len(found))


def search_sweep(settings: Settings, corpus: Corpus, dense: list[SearchRequest], truth: np.ndarray, efs: list[int],
                 oversampling: list[float] | None = None,
                 hybrid: list[SearchRequest] | None = None) -> list[dict[str, Any]]:
    """The same generation searched at each HNSW ef (and, with ``oversampling``, each int8 oversampling factor: the
    candidates re-scored with the fp32 vectors are k x that); one row per setting: ``ef``, ``oversampling`` (None:
    the generation's), ``dense_ms``, ``hybrid_ms`` (with ``hybrid`` requests, else empty) and ``recall10``."""
    rows = []
    factors: list[float | None] = list(oversampling) if oversampling else [None]
    for ef in efs:
        for factor in factors:
            update: dict[str, Any] = {"hnsw_ef": ef or None} if factor is None else {"hnsw_ef": ef or None,
                                                                                     "oversampling": factor}
            tuned = Store(EdgeEngine.from_settings(settings.model_copy(
                update={"edge": settings.edge.model_copy(update=update)})))
            timed(tuned, dense[:10])
            dense_ms, got = timed(tuned, dense)
            hybrid_ms = timed(tuned, hybrid)[0] if hybrid else []
            tuned.close()
            rows.append({"ef": ef, "oversampling": factor, "dense_ms": dense_ms, "hybrid_ms": hybrid_ms,
                         "recall10": recall(corpus, got, truth)})
            print(f"ef {ef} oversampling {factor}: dense {stats(dense_ms)} ms, hybrid {stats(hybrid_ms)} ms, "
                  f"recall@10 {rows[-1]['recall10']:.3f}", flush=True)
    return rows


FUSIONS: dict[str, dict[str, Any]] = {"rrf": {"fusion": "rrf"}, "linear": dict(LABEL_FREE_FUSION)}


def as_requests(dense_q: np.ndarray, sparse_q: list[SparseVector], fusion: str = "rrf"
                ) -> tuple[list[SearchRequest], list[SearchRequest]]:
    """The questions as dense and as hybrid requests; ``fusion``: ``rrf`` (``SearchRequest``'s default, inside the
    engine) or ``linear`` (the label-free fusion a collection without `dpr tune-hybrid` serves)."""
    dense = [SearchRequest(k=10, mode="dense", dense=v.tolist()) for v in dense_q]
    hybrid = [SearchRequest(k=10, mode="hybrid", dense=v.tolist(), sparse=sq, **FUSIONS[fusion])
              for v, sq in zip(dense_q, sparse_q, strict=True)]
    return dense, hybrid


def sweep_report(args: argparse.Namespace, machine: str, corpus: Corpus, dense_q: np.ndarray,
                 sparse_q: list[SparseVector], truth: np.ndarray) -> str:
    """``--searched-only``: each kept lever's generation at each ef x oversampling, dense and hybrid, as markdown."""
    dense, hybrid = as_requests(dense_q, sparse_q, args.fusion)
    lines = [f"Machine: {machine}", f"Commit {args.commit}; `bench_scale.py --searched-only {args.searched_only} "
             f"--passages {args.passages} --real-docs {args.real_docs} --queries {args.queries} --levers "
             f"{' '.join(args.levers)} --ef-sweep {' '.join(map(str, args.ef_sweep))} --oversampling-sweep "
             f"{' '.join(map(str, args.oversampling_sweep))} --fusion {args.fusion}`", "",
             "| lever | HNSW ef | int8 oversampling | dense p50 / p99 ms | hybrid p50 / p99 ms | hybrid / dense p50 | "
             "recall@10 vs exact |", "|---|---|---|---|---|---|---|"]
    for name in args.levers:
        settings = Settings(data_dir=args.searched_only / name / "dpr", edge=EdgeSettings(**LEVERS[name]))
        quantized = LEVERS[name].get("quantization") == "int8"
        for row in search_sweep(settings, corpus, dense, truth, args.ef_sweep,
                                args.oversampling_sweep if quantized else None, hybrid):
            ratio = statistics.median(row["hybrid_ms"]) / max(1e-9, statistics.median(row["dense_ms"]))
            lines.append(f"| {name} | {row['ef']} | {row['oversampling'] or '-'} | {stats(row['dense_ms'])} | "
                         f"{stats(row['hybrid_ms'])} | {ratio:.2f} | {row['recall10']:.3f} |")
    return "\n".join(lines) + "\n"


def run_lever(name: str, corpus: Corpus, total: int, root: Path, dense_q: np.ndarray, sparse_q: list[SparseVector],
              truth: np.ndarray, ef: int | None, sweep: list[int],
              judged: tuple[list[str], dict[str, dict[str, int]]] | None = None, fusion: str = "rrf") -> dict[str, Any]:
    settings = Settings(data_dir=root / name / "dpr", edge=EdgeSettings(**LEVERS[name], hnsw_ef=ef))
    store = Store(EdgeEngine.from_settings(settings))
    store.ensure_collection(corpus.spec)
    t0 = time.perf_counter()
    upsert_stream(store, (corpus.point(start + j, v) for start in range(0, total, CHUNK)
                          for j, v in enumerate(corpus.chunk(start, total))))
    upsert_s = time.perf_counter() - t0
    dense, hybrid = as_requests(dense_q, sparse_q, fusion)
    # the build, with a thread asking questions meanwhile (exact scans: the graph is not there yet), one every 20 ms
    during: list[float] = []
    stop = threading.Event()

    def ask() -> None:
        i = 0
        while not stop.is_set():
            t = time.perf_counter()
            store.search(dense[i % len(dense)])
            during.append((time.perf_counter() - t) * 1000)
            i += 1
            stop.wait(0.02)  # a steady trickle of questions (~50/s at most), not a loop that starves the build

    asker = threading.Thread(target=ask, name="during-build", daemon=True)
    t0 = time.perf_counter()
    asker.start()
    built = store.optimize()
    build_s = time.perf_counter() - t0
    stop.set()
    asker.join()
    store.close()
    generation = next((root / name / "dpr" / "store" / settings.collection / "generations").iterdir())
    disk, memory = du_bytes(generation), store.memory(generation.name)
    # reopened, as a serving process finds it
    before_kb, before_anon, before_file = rss_kb(), rss_kb("RssAnon"), rss_kb("RssFile")
    store = Store(EdgeEngine.from_settings(settings))
    timed(store, dense[:10])  # warm the shard's maps
    cpu = time.process_time()  # this process's CPU, the engine's search threads included
    dense_ms, answers = timed(store, dense)
    dense_cpu, cpu = (time.process_time() - cpu) * 1000 / len(dense), time.process_time()
    hybrid_ms, _ = timed(store, hybrid)
    hybrid_cpu = (time.process_time() - cpu) * 1000 / len(hybrid)
    rss_growth_mb = (rss_kb() - before_kb) / 1024
    anon_mb, file_mb = (rss_kb("RssAnon") - before_anon) / 1024, (rss_kb("RssFile") - before_file) / 1024
    resident = resident_by_file()
    store.close()
    by_ef = {row["ef"]: (stats(row["dense_ms"]), row["recall10"]) for row in search_sweep(settings, corpus, dense,
                                                                                            truth, sweep)}
    return {
        "lever": name, "points": total, "upsert_pps": total / upsert_s, "built": built, "build_s": build_s,
        "during_ms": during, "dense_ms": dense_ms, "hybrid_ms": hybrid_ms, "dense_cpu": dense_cpu,
        "hybrid_cpu": hybrid_cpu, "recall10": recall(corpus, answers, truth),
        "by_ef": by_ef, "ndcg10": ndcg10(judged[0], answers, judged[1]) if judged else None,
        "disk_bytes": disk, "disk_per_passage": disk / total, "rss_growth_mb": rss_growth_mb,
        "anon_mb": anon_mb, "file_mb": file_mb, "resident": resident, "memory": memory,
    }


def hybrid_ef_report(args: argparse.Namespace, machine: str, dense_q: np.ndarray,
                     sparse_q: list[SparseVector]) -> str:
    """``--searched-only --hybrid-ef-sweep``: each kept lever's generation asked dense at ``--ef`` and hybrid (fused
    by ``--fusion``) with its dense branch at each ``hybrid_ef``, interleaved question by question;
    each hybrid top 10 against the same question's hybrid with an exact fp32 dense branch (every point, on-top
    ones included), the sparse branch and the fusion unchanged; and the dense branch's own recall of the exact
    top ``candidates`` (the depth it hands the fusion) at that ef."""
    from qdrant_edge import QuantizationSearchParams
    from qdrant_edge import SearchParams as EdgeSearchParams

    dense, hybrid = as_requests(dense_q, sparse_q, args.fusion)
    lines = [f"Machine: {machine}", f"Commit {args.commit}; `bench_scale.py --searched-only {args.searched_only} "
             f"--queries {args.queries} --levers {' '.join(args.levers)} --ef {args.ef} --hybrid-ef-sweep "
             f"{' '.join(map(str, args.hybrid_ef_sweep))} --fusion {args.fusion}`", "",
             "| lever | points | dense: HNSW ef | dense p50 / p99 ms | hybrid: dense-branch ef | hybrid p50 / p99 ms | "
             "hybrid / dense p50 | hybrid top 10 vs exact-branch hybrid (ties at the cut counted) | same, strict | "
             "dense branch: recall@100 vs exact |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name in args.levers:
        base = Settings(data_dir=args.searched_only / name / "dpr", edge=EdgeSettings(**LEVERS[name], hnsw_ef=args.ef))
        exact = Store(EdgeEngine.from_settings(base))
        exact.engine.dense.fused_search_params = exact.engine.dense.search_params = EdgeSearchParams(  # type: ignore[attr-defined]
            exact=True, quantization=QuantizationSearchParams(ignore=True))
        t0 = time.perf_counter()
        reference = [exact.search(r) for r in hybrid]
        exact_s = time.perf_counter() - t0
        depth = hybrid[0].candidates  # what the dense branch hands the fusion
        deep = [SearchRequest(k=depth, mode="dense", dense=v.tolist()) for v in dense_q]
        branch_truth = [{h.id for h in exact.search(r)} for r in deep]
        points = exact.count()
        exact.close()
        stores = {ef: Store(EdgeEngine.from_settings(base.model_copy(
            update={"edge": base.edge.model_copy(update={"hybrid_ef": ef})}))) for ef in args.hybrid_ef_sweep}
        first = stores[args.hybrid_ef_sweep[0]]
        timed(first, dense[:10])
        dense_ms: list[float] = []
        hybrid_ms: dict[int, list[float]] = {ef: [] for ef in stores}
        answers: dict[int, list[Any]] = {ef: [] for ef in stores}
        for i, request in enumerate(dense):  # interleaved: a load that drifts weighs on every column alike
            dense_ms += timed(first, [request])[0]
            for ef, store in stores.items():
                ms, got = timed(store, [hybrid[i]])
                hybrid_ms[ef] += ms
                answers[ef] += got
        for store in stores.values():
            store.close()
        for ef in stores:
            loose, strict = agreement(answers[ef], reference)
            ratio = statistics.median(hybrid_ms[ef]) / max(1e-9, statistics.median(dense_ms))
            branch = Store(EdgeEngine.from_settings(base.model_copy(
                update={"edge": base.edge.model_copy(update={"hnsw_ef": ef})})))
            found = sum(len({h.id for h in branch.search(r)} & t) for r, t in zip(deep, branch_truth, strict=True))
            branch.close()
            lines.append(f"| {name} | {points:,} | {args.ef} | {stats(dense_ms)} | {ef} | {stats(hybrid_ms[ef])} | "
                         f"{ratio:.2f} | {loose:.3f} | {strict:.3f} | {found / (depth * len(deep)):.3f} |")
            print(lines[-1], flush=True)
        lines.append(f"\n{name}: the exact-branch hybrid reference took {exact_s / len(hybrid) * 1000:.0f} ms a "
                     "question.")
    return "\n".join(lines) + "\n"


def recalibrate(data_dir: Path) -> None:
    """``--recalibrate``: the build's calibration run again (this commit's ``services/store/calibrate.py``) on each
    generation kept under ``data_dir``, with its build's own time budget, and recorded in its ``index.json`` as a
    build would (the old record printed first)."""
    from qdrant_edge import EdgeShard

    from services.store.edge.build_child import calibrate_built
    from services.store.edge.config import LEVERS_FILE, EdgeLevers
    from services.store.edge.index import INDEX_RECORD, SHARD

    for gen in sorted((data_dir / "store").glob("*/generations/*")):
        record = json.loads((gen / INDEX_RECORD).read_text(encoding="utf-8"))
        old = record.get("calibration") or {}
        if "build_seconds" not in old:
            print(f"{gen}: no build calibration recorded; skipped", flush=True)
            continue
        levers = EdgeLevers.from_json(json.loads((gen / LEVERS_FILE).read_text(encoding="utf-8")))
        spec = CollectionSpec.from_json(json.loads((gen / "spec.json").read_text(encoding="utf-8")))
        shard = EdgeShard.load(str(gen / SHARD))
        try:
            new = calibrate_built(shard, gen / SHARD, levers, old["target"], old["build_seconds"], spec)
        finally:
            shard.close()
        print(f"{gen}\n  old: {json.dumps(old)}\n  new: {json.dumps(new)}", flush=True)
        (gen / INDEX_RECORD).write_text(json.dumps(record | {"calibration": new}), encoding="utf-8")


def agreement(answers: list[Any], reference: list[Any]) -> tuple[float, float]:
    """Share of each top 10 that is in the reference's: counting a hit that scores at least the reference's 10th
    (a tie at the cut: RRF scores are sums of rank terms, so equal scores are common), and strictly by id."""
    loose = strict = 0
    for hits, ref in zip(answers, reference, strict=True):
        ids = {h.id for h in ref}
        cut = min((h.score for h in ref), default=float("inf"))
        strict += sum(h.id in ids for h in hits)
        loose += sum(h.id in ids or h.score >= cut - 1e-12 for h in hits)
    n = 10 * max(1, len(answers))
    return loose / n, strict / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--passages", type=int, default=1_000_000, help="points in all; 0: the real passages alone")
    ap.add_argument("--real-docs", type=int, default=300, help="SciFact abstracts embedded by the real tower")
    ap.add_argument("--queries", type=int, default=100, help="real SciFact questions")
    ap.add_argument("--levers", nargs="+", default=["fp32", "int8", "int8-disk"], choices=list(LEVERS))
    ap.add_argument("--ef", type=int, default=None, help="search-time HNSW ef (default: the engine's)")
    ap.add_argument("--ef-sweep", type=int, nargs="*", default=[64, 128, 256],
                    help="also search at these ef (with --searched-only, 0: the calibrated ef, no setting)")
    ap.add_argument("--recalibrate", action="store_true",
                    help="with --searched-only: run the build's ef calibration again on each kept generation and "
                         "record it (as this commit's rule would have chosen at its build)")
    ap.add_argument("--fusion", choices=sorted(FUSIONS), default="rrf",
                    help="the hybrid requests' fusion: rrf (the results so far) or linear (what `dpr serve` answers "
                         "with no `dpr tune-hybrid` record)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", type=Path, help="keep the data dirs here (one per lever)")
    ap.add_argument("--out", type=Path, help="write the markdown here")
    ap.add_argument("--searched-only", type=Path, metavar="DIR",
                    help="build nothing: search the data dirs an earlier run kept in DIR (the same --passages, "
                         "--real-docs, --seed: the synthetic bulk is regenerated for the exact scan) at each "
                         "--ef-sweep x --oversampling-sweep")
    ap.add_argument("--ndcg", action="store_true",
                    help="ask SciFact's test questions (--queries ignored) and report each lever's nDCG@10 (by "
                         "document); with --real-docs 5183 every judged abstract is in the collection")
    ap.add_argument("--oversampling-sweep", type=float, nargs="*", default=[2.0, 4.0, 8.0])
    ap.add_argument("--hybrid-ef-sweep", type=int, nargs="*", default=None,
                    help="with --searched-only and --ef: hybrid queries with their dense branch at each of these "
                         "ef (DPR_EDGE__HYBRID_EF) beside dense at --ef, against an exact dense branch")
    args = ap.parse_args()
    if not SCIFACT.is_dir():
        print(f"needs {SCIFACT} (BEIR SciFact); not found", file=sys.stderr)
        return 2
    machine = machine_line()
    args.commit = commit()
    print(machine, flush=True)
    if args.recalibrate:
        if not args.searched_only:
            print("--recalibrate needs --searched-only DIR", file=sys.stderr)
            return 2
        for name in args.levers:
            recalibrate(args.searched_only / name / "dpr")
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        root = args.keep or Path(tmp)
        runtime = Runtime(Settings(data_dir=Path(tmp) / "models"))
        # the hybrid-ef sweep compares the engine with itself: no real part to embed, no exact dense scan
        corpus = None if args.hybrid_ef_sweep else Corpus(runtime, load_docs(args.real_docs), args.seed)
        if args.passages <= 0 and corpus is not None:  # the real passages alone
            args.passages = corpus.n_real
        judged = None
        if args.ndcg:
            qids, qs, qrels = test_split()
            judged = (qids, qrels)
        else:
            qs = load_questions(args.queries)
        qt = runtime.question_towers
        qt.encode_queries(qs[:4])
        encode_ms = []
        for q in qs:
            t = time.perf_counter()
            qt.encode_queries([q])
            encode_ms.append((time.perf_counter() - t) * 1000)
        dense_q = np.asarray(qt.encode_queries(qs), dtype=np.float32)  # (q, dim)
        sparse_q = [runtime.sparse.embed_query(q) for q in qs]
        if args.hybrid_ef_sweep:
            if not args.searched_only or args.ef is None:
                print("--hybrid-ef-sweep needs --searched-only DIR and --ef", file=sys.stderr)
                return 2
            text = hybrid_ef_report(args, machine, dense_q, sparse_q)
            runtime.close()
            print(text)
            if args.out:
                args.out.write_text(text, encoding="utf-8")
            return 0
        assert corpus is not None
        print(f"{corpus.n_real} real passages ({corpus.encode_pps:.1f}/s); exact top 10 over {args.passages:,}...",
              flush=True)
        t0 = time.perf_counter()
        truth = exact_top10(corpus, args.passages, dense_q)
        scan_s = time.perf_counter() - t0
        if args.searched_only:
            text = sweep_report(args, machine, corpus, dense_q, sparse_q, truth)
            runtime.close()
            print(text)
            if args.out:
                args.out.write_text(text, encoding="utf-8")
            return 0
        results = []
        for name in args.levers:
            if (root / name).exists():
                shutil.rmtree(root / name)
            r = run_lever(name, corpus, args.passages, root, dense_q, sparse_q, truth, args.ef, args.ef_sweep, judged,
                          args.fusion)
            results.append(r)
            print(json.dumps({k: v for k, v in r.items() if not k.endswith("_ms")}), flush=True)
        runtime.close()
    text = report(args, machine, corpus, results, encode_ms, scan_s)
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 0


def report(args: argparse.Namespace, machine: str, corpus: Corpus, results: list[dict[str, Any]],
           encode_ms: list[float], scan_s: float) -> str:
    lines = [
        f"Machine before: {machine}",
        f"Machine after: {machine_line()}",
        f"Started at commit {args.commit}; command: `nice -n 10 .venv/bin/python benchmarks/bench_scale.py --passages "
        f"{args.passages} --real-docs {args.real_docs} --queries {args.queries} --levers {' '.join(args.levers)} "
        f"--ef-sweep {' '.join(map(str, args.ef_sweep))}" + (f" --ef {args.ef}" if args.ef else "")
        + (" --ndcg" if args.ndcg else "") + (f" --fusion {args.fusion}" if args.fusion != "rrf" else "") + "`",
        "",
        f"{args.passages:,} points: {corpus.n_real:,} real SciFact passages (first {args.real_docs} abstracts, "
        f"{corpus.dim}-dim, embedded here at {corpus.encode_pps:.1f} passages/s), the rest synthetic: unit vectors "
        "from a Gaussian fitted to the real ones (mean, covariance + 1e-3 I), each with a real passage's text and "
        f"BM25 vector. {len(encode_ms)} real SciFact questions{' (the test split)' if args.ndcg else ''}; "
        "question tower alone p50 / p99 "
        f"{stats(encode_ms)} ms (not in the store figures below). Exact scan for recall: numpy, {scan_s:.1f} s.",
        "",
        "| lever | upsert points/s | HNSW build s | during build: queries, p50 / p99 ms | dense p50 / p99 ms | "
        "hybrid p50 / p99 ms | hybrid / dense p50 | CPU ms a question, dense / hybrid | recall@10 vs exact | "
        "disk per passage | RSS growth MB (anon + file-backed) | SciFact nDCG@10 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ratio = statistics.median(r["hybrid_ms"]) / max(1e-9, statistics.median(r["dense_ms"]))
        lines.append(
            f"| {r['lever']} | {r['upsert_pps']:,.0f} | {r['build_s']:.0f} | {len(r['during_ms'])}, "
            f"{stats(r['during_ms'])} | {stats(r['dense_ms'])} | {stats(r['hybrid_ms'])} | {ratio:.2f} | "
            f"{r['dense_cpu']:.1f} / {r['hybrid_cpu']:.1f} | {r['recall10']:.3f} | "
            f"{r['disk_per_passage'] / 1024:.1f} KB | {r['rss_growth_mb']:.0f} "
            f"({r['anon_mb']:.0f} + {r['file_mb']:.0f}) | "
            + (f"{r['ndcg10']:.4f} |" if r["ndcg10"] is not None else "- |")
        )
    if args.ef_sweep:
        lines += ["", "Dense search of the same generations at other HNSW ef (p50 / p99 ms, recall@10 vs exact):", "",
                  "| lever | " + " | ".join(f"ef {e}" for e in args.ef_sweep) + " |",
                  "|---|" + "---|" * len(args.ef_sweep)]
        for r in results:
            cells = [f"{r['by_ef'][e][0]}, {r['by_ef'][e][1]:.3f}" for e in args.ef_sweep]
            lines.append(f"| {r['lever']} | " + " | ".join(cells) + " |")
    lines += ["", "Where each generation's vectors live and why (`dpr status`'s memory line):", ""]
    lines += [f"- {r['lever']}: {r['memory']['choice']} ({r['memory']['reason']})" for r in results]
    lines += ["", "Resident MB of the store's mapped files after the queries, by kind (/proc/self/smaps):", ""]
    for r in results:
        top = ", ".join(f"{k} {v:.1f}" for k, v in list(r["resident"].items())[:8])
        lines.append(f"- {r['lever']}: {sum(r['resident'].values()):.0f} MB: {top}")
    lines += [
        "",
        "Levers: " + "; ".join(f"{k}: {v or 'engine defaults'}" for k, v in LEVERS.items() if k in args.levers)
        + ". Store figures are `Store.search` in-process with pre-encoded questions (one thread, sequential).",
        "RSS growth: this process's VmRSS from reopening the built store to after the queries (the store's "
        "resident share), split into anonymous memory and file-backed pages (memory-mapped segments: page cache, "
        "reclaimable under pressure).",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
