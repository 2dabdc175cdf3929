"""Issue 16 on SciFact in one command: BM25, base, fine-tuned, pre-trained + fine-tuned, hybrid, + reranker.

Every choice is made on the dev split (the 100 SciFact train queries `dpr train` holds out, seed 13): which towers
serve alone and under hybrid (dev nDCG@10 through the store), the hybrid fusion
(``services.lab.hybrid.tuning.tune_on_corpus``), and the reranker's N (20 or 50) and whether it is on at all. The test
split is read once, at the end, for every system together (nDCG@10, recall@100, and each system against BM25 and
base with a paired randomization test).

Training runs as real `dpr train` / `dpr train-reranker` subprocesses (one per model) so each reports its own wall
time and peak RSS (``os.wait4``); the two stages of ``--pretrain`` are split in its model card. Reranker latency per
question is measured on the ONNX backend over dev questions' first-stage passages, at N = 20 and 50.

Needs ../shared/data beside the repo (``--shared``). ``--smoke`` runs the same pipeline on a small BEIR slice of
SciFact (60 train queries, 10 test queries, ~200 documents; 2 steps per training) to prove it works end to end; its
figures mean nothing.

Usage: ``.venv/bin/python benchmarks/bench_rerank.py --data-dir /tmp/dpr-bench-rerank [--smoke]
[--finetuned-model NAME] [--pretrained-model NAME] [--reranker NAME | --no-reranker]``; or, to compare towers
trained already (any recipe, e.g. a second mining round), ``--towers LABEL=MODEL`` once per model instead of the
two trainings. The run behind ``results/quality/scifact-towers.json``: ``--data-dir /tmp/bk/data --towers
finetuned=scifact-... --towers finetuned+ance=ance-... --no-reranker --out scifact-towers``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from machine import cpu_flags, script  # benchmarks/ is sys.path[0]

REPO = script()

from encoders.data import RetrievalDataset  # noqa: E402
from encoders.rerank import WEIGHTS  # noqa: E402
from encoders.towers import SentenceTransformerTowers, read_model_card, resolve_model_path  # noqa: E402
from services.core.settings import Settings  # noqa: E402
from services.lab.evaluation.retrieval import Retrieval, Retriever, bm25_retriever, evaluate_systems, score_retrieval  # noqa: E402
from services.lab.evaluation.store_retriever import CHUNK_OVERFETCH, StoreCorpus, hits_to_retrieval  # noqa: E402
from services.lab.hybrid.tuning import TuneResult, tune_on_corpus  # noqa: E402
from services.lab.shared.recipe_files import recipe_text  # noqa: E402
from services.query import QueryOptions, search_many  # noqa: E402
from services.readers import load_beir, load_dev_split  # noqa: E402
from services.store.sparse import default_embedder  # noqa: E402

DATA = REPO.parent / "shared" / "data" / "beir-scifact"
RESULTS = REPO / "benchmarks" / "results" / "quality"
RERANK_NS = (20, 50)
log = logging.getLogger("bench_rerank")


# --- training (subprocesses: wall time and peak RSS each) -------------------------------------------------------


def run_cli(args: list[str], data_dir: Path) -> tuple[dict[str, Any], float, float]:
    """`dpr ARGS --json` in a child process: (its JSON, wall seconds, peak RSS MiB of that child)."""
    import tempfile

    env = {**os.environ, "DPR_DATA_DIR": str(data_dir), "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "entrypoints.cli.main", *args, "--json"], env=env,
                                stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode:
        raise SystemExit(f"dpr {' '.join(args)} failed ({proc.returncode}):\n{stderr[-3000:]}")
    return json.loads(stdout.strip().splitlines()[-1]), round(wall, 1), round(usage.ru_maxrss / 1024, 1)


def train_reranker(args: argparse.Namespace) -> dict[str, Any]:
    """`dpr train-reranker` with a recipe file: the default recipe and this run's caps over it."""
    caps = {"dev_queries": args.dev_queries, **({"max_pairs": args.max_pairs} if args.max_pairs else {})}
    recipe = args.data_dir / "bench-rerank.recipe.toml"
    recipe.parent.mkdir(parents=True, exist_ok=True)
    recipe.write_text(recipe_text(data=caps, train={"max_steps": args.max_steps}, dev={"candidates": max(RERANK_NS)}))
    print(f"training with {recipe}:\n{recipe.read_text()}", flush=True)
    out, wall, rss = run_cli(["train-reranker", str(DATA), "--split", "train", "--name", "bench-rerank",
                              "--recipe", str(recipe)], args.data_dir)
    card = out["card"]
    return {"model": out["model"], "process_wall_s": wall, "process_peak_rss_mib": rss, "steps": card["steps"],
            "train_seconds": card["train_seconds"], "dev_bm25_first_stage": card.get("dev_metrics")}


def train_towers(args: argparse.Namespace, name: str, data: dict[str, Any]) -> dict[str, Any]:
    """`dpr train` with a recipe file: the default recipe, ``data`` and this run's caps over it."""
    caps = {"dev_queries": args.dev_queries, **({"max_pairs": args.max_pairs} if args.max_pairs else {})}
    recipe = args.data_dir / f"{name}.recipe.toml"
    recipe.parent.mkdir(parents=True, exist_ok=True)
    recipe.write_text(recipe_text(data={**caps, **data}, train={"max_steps": args.max_steps}))
    print(f"training with {recipe}:\n{recipe.read_text()}", flush=True)
    out, wall, rss = run_cli(["train", str(DATA), "--split", "train", "--name", name, "--recipe", str(recipe)],
                             args.data_dir)
    card = out["card"]
    stages = card.get("stages") or [{"stage": "finetune", "model": out["model"], "steps": card["steps"],
                                     "train_seconds": card["train_seconds"], "peak_rss_mib": card.get("peak_rss_mib"),
                                     "data": card["training_data"]}]
    return {"model": out["model"], "process_wall_s": wall, "process_peak_rss_mib": rss, "stages": stages,
            "dev_in_memory": (card.get("dev_metrics") or {}).get("after")}


def existing(settings: Settings, name: str) -> dict[str, Any]:
    path, full = resolve_model_path(name, settings.models_dir)
    card = read_model_card(path)
    return {"model": full, "reused": True, "stages": card.get("stages"), "train_seconds": card.get("train_seconds"),
            "peak_rss_mib": card.get("peak_rss_mib"), "distilled_from": card.get("distilled_from")}


# --- data ---------------------------------------------------------------------------------------------------------


def datasets(args: argparse.Namespace) -> tuple[RetrievalDataset, RetrievalDataset]:
    """(dev, test) over ONE corpus object, so each model's corpus is ingested once for both."""
    dev = load_dev_split(DATA, "train", "beir", args.dev_queries)
    test = load_beir(DATA, "test")
    test = RetrievalDataset(test.name, dev.corpus, test.queries, test.qrels, test.answers)
    return dev, test


def write_slice(source: Path, target: Path, train_queries: int, test_queries: int, others: int) -> Path:
    """A small BEIR folder (smoke runs): the first train and test queries, their judged documents and a seeded
    sample of other documents; every step of the benchmark then runs on it in minutes."""
    train, test = load_beir(source, "train"), load_beir(source, "test")
    queries = {**{q: train.queries[q] for q in sorted(train.queries)[:train_queries]},
               **{q: test.queries[q] for q in sorted(test.queries)[:test_queries]}}
    qrels = {"train": {q: train.qrels[q] for q in queries if q in train.qrels},
             "test": {q: test.qrels[q] for q in queries if q in test.qrels}}
    judged = {d for split in qrels.values() for rels in split.values() for d in rels if d in train.corpus}
    rest = sorted(set(train.corpus) - judged)
    keep = sorted(judged | set(random.Random(0).sample(rest, min(others, len(rest)))))
    (target / "qrels").mkdir(parents=True, exist_ok=True)
    with open(target / "corpus.jsonl", "w") as f:
        for d in keep:
            doc = train.corpus[d]
            f.write(json.dumps({"_id": d, "title": doc.title, "text": doc.text}) + "\n")
    with open(target / "queries.jsonl", "w") as f:
        for q, text in queries.items():
            f.write(json.dumps({"_id": q, "text": text}) + "\n")
    for split, rels in qrels.items():
        with open(target / "qrels" / f"{split}.tsv", "w") as f:
            f.write("query-id\tcorpus-id\tscore\n")
            f.writelines(f"{q}\t{d}\t{r}\n" for q, docs in rels.items() for d, r in docs.items())
    return target


# --- reranking through the product's query path -------------------------------------------------------------------


def reranked_retriever(corpus: StoreCorpus, options: QueryOptions, reranker: Any, n: int,
                       latencies: list[float] | None = None, weight: float = 1.0) -> Retriever:
    """The first stage (``options``) with its top ``n`` chunk hits reordered by ``reranker`` (``search_many`` with
    ``rerank=n`` and ``rerank_weight=weight``), then the rest of the first stage; documents by first appearance."""

    def run(dataset: RetrievalDataset, k: int) -> Retrieval:
        store = corpus.prepare(dataset)
        qids = sorted(dataset.queries)
        questions = [dataset.queries[q] for q in qids]
        sparse = default_embedder() if options.mode != "dense" else None
        depth = min(k * CHUNK_OVERFETCH, 1000)
        first = search_many(questions, store=store, towers=corpus.towers, options=replace(options, k=depth, rerank=0),
                            sparse=sparse)
        timed = Timed(reranker, latencies)
        top = search_many(questions, store=store, towers=corpus.towers,
                          options=replace(options, k=n, rerank=n, rerank_weight=weight),
                          sparse=sparse, reranker_for=lambda _: timed)
        merged = []
        for head, hits in zip(top, first, strict=True):
            seen = {h.id for h in head}
            ordered = head + [h for h in hits if h.id not in seen]
            merged.append([replace(h, score=float(len(ordered) - i)) for i, h in enumerate(ordered)])
        return hits_to_retrieval(qids, merged, k)

    return run


class _Memo:
    """The reranker's score of each (question, passage) computed once: the dev grid over N and the weight reranks
    the same pairs many times."""

    def __init__(self, reranker: Any) -> None:
        self.reranker = reranker
        self.name, self.backend, self.fingerprint = reranker.name, reranker.backend, reranker.fingerprint
        self.scores: dict[tuple[str, str], float] = {}

    def score(self, question: str, passages: Any, batch_size: int = 32) -> Any:
        missing = [p for p in dict.fromkeys(passages) if (question, p) not in self.scores]
        if missing:
            for p, x in zip(missing, self.reranker.score(question, missing, batch_size=batch_size), strict=True):
                self.scores[(question, p)] = float(x)
        return np.array([self.scores[(question, p)] for p in passages], dtype=np.float32)


class Timed:
    """A reranker whose ``score`` calls (one per question) append their seconds to ``latencies``."""

    def __init__(self, reranker: Any, latencies: list[float] | None) -> None:
        self.reranker, self.latencies = reranker, latencies
        self.name, self.backend = reranker.name, reranker.backend

    @property
    def fingerprint(self) -> str:
        return str(self.reranker.fingerprint)

    def score(self, question: str, passages: Any, batch_size: int = 32) -> Any:
        t0 = time.perf_counter()
        out = self.reranker.score(question, passages, batch_size=batch_size)
        if self.latencies is not None:
            self.latencies.append(time.perf_counter() - t0)
        return out


def latency(corpus: StoreCorpus, options: QueryOptions, reranker: Any, dev: RetrievalDataset) -> dict[str, Any]:
    out = {}
    for n in RERANK_NS:
        times: list[float] = []
        reranked_retriever(corpus, options, reranker, n, times)(dev, n)
        out[f"N={n}"] = latency_ms(times)
    return out


def latency_ms(seconds: list[float]) -> dict[str, Any]:
    """Mean, p50 and p95 of per-question seconds, in milliseconds."""
    times = sorted(seconds)
    return {"mean_ms": round(1000 * statistics.mean(times), 1), "p50_ms": round(1000 * times[len(times) // 2], 1),
            "p95_ms": round(1000 * times[int(len(times) * 0.95)], 1), "questions": len(times)}


# --- the run ------------------------------------------------------------------------------------------------------


def ndcg(dataset: RetrievalDataset, retrieval: Retrieval) -> float:
    return score_retrieval(dataset, retrieval)[0]["ndcg@10"]


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = Settings(data_dir=args.data_dir)
    out: dict[str, Any] = {"ran_at": datetime.now(UTC).isoformat(timespec="seconds"), "smoke": args.smoke,
                           "load_average_start": os.getloadavg(), "cpu": cpu_flags() or "none"}
    # 1. train (or reuse)
    if args.towers:
        trained = {label: existing(settings, model) for label, model in (t.split("=", 1) for t in args.towers)}
    else:
        trained = {
            "finetuned": existing(settings, args.finetuned_model) if args.finetuned_model
            else train_towers(args, "bench-ft", {}),
            "pretrained+finetuned": existing(settings, args.pretrained_model) if args.pretrained_model
            else train_towers(args, "bench-pt", {"pretrain": "both", "pretrain_max_pairs": args.pretrain_pairs,
                                                 "pretrain_epochs": args.pretrain_epochs}),
        }
    training = dict(trained)
    if not args.no_reranker:
        training["reranker"] = existing(settings, args.reranker) if args.reranker else train_reranker(args)
    out["training"] = training
    print(json.dumps(training, indent=1, default=str), flush=True)
    dev, test = datasets(args)
    # 2. dev: towers alone, hybrid fusion per towers, reranker N
    models = {**({} if args.no_base else {"base": "base"}), **{label: t["model"] for label, t in trained.items()}}
    corpora: dict[str, StoreCorpus] = {}
    tuned: dict[str, TuneResult] = {}
    try:
        for label, spec in models.items():
            path, name = resolve_model_path(spec, settings.models_dir)
            corpora[label] = StoreCorpus(SentenceTransformerTowers(path, name=name), settings=settings,
                                         collection="bench", sparse=True)
            tuned[label] = tune_on_corpus(corpora[label], dev)
            print(f"dev {label}: dense {tuned[label].dense_score:.3f}, hybrid {tuned[label].dev_score:.3f} "
                  f"({tuned[label].choice.label()})", flush=True)
        dense_pick = max(trained, key=lambda m: tuned[m].dense_score)
        hybrid_pick = max(models, key=lambda m: tuned[m].dev_score)
        hybrid_options = tuned[hybrid_pick].choice.options()
        from encoders.rerank import load_reranker

        reranker = None if args.no_reranker else load_reranker(training["reranker"]["model"], settings.models_dir,
                                                               "onnx")
        memo = _Memo(reranker) if reranker is not None else None
        rerank_dev = {} if memo is None else {
            (n, w): ndcg(dev, reranked_retriever(corpora[hybrid_pick], hybrid_options, memo, n, weight=w)(dev, 100))
            for n in RERANK_NS for w in WEIGHTS}
        best_n, best_w = max(rerank_dev, key=lambda nw: (rerank_dev[nw], nw[1])) if rerank_dev else (RERANK_NS[0], 1.0)
        rerank_on = bool(rerank_dev) and rerank_dev[(best_n, best_w)] > tuned[hybrid_pick].dev_score
        out["dev"] = {
            "queries": len(dev.queries),
            "dense_ndcg@10": {m: round(t.dense_score, 4) for m, t in tuned.items()},
            "hybrid_ndcg@10": {m: round(t.dev_score, 4) for m, t in tuned.items()},
            "hybrid_choice": {m: t.choice.to_json() for m, t in tuned.items()},
            "bm25_store_ndcg@10": round(next(iter(tuned.values())).sparse_score, 4),  # the same for any towers
            "rerank_ndcg@10": {f"N={n} w={w:g}": round(v, 4) for (n, w), v in rerank_dev.items()},
            "picked": {"towers": dense_pick, "hybrid": hybrid_pick, "rerank_n": best_n, "rerank_weight": best_w,
                       "rerank_on": rerank_on},
        }
        print(json.dumps(out["dev"], indent=1), flush=True)
        if reranker is not None and not args.no_latency:
            out["reranker_latency_onnx"] = latency(corpora[hybrid_pick], hybrid_options, reranker, dev)
            print("latency:", json.dumps(out["reranker_latency_onnx"]), flush=True)
        if args.dev_only:
            return out
        # 3. test, once
        systems: dict[str, Retriever] = {"bm25": bm25_retriever()}
        for label in models:
            systems[label] = corpora[label].retriever(QueryOptions(mode="dense"))
        systems[f"hybrid ({hybrid_pick})"] = corpora[hybrid_pick].retriever(hybrid_options)
        if reranker is not None:
            systems[f"hybrid ({hybrid_pick}) + rerank N={best_n} w={best_w:g}"] = reranked_retriever(
                corpora[hybrid_pick], hybrid_options, reranker, best_n, weight=best_w)
        report = evaluate_systems(test, systems, k=100)
        report.add_significance(test.qrels)
        print(f"\n{report.dataset}: {report.queries} queries, {report.documents} documents")
        print(report.to_markdown_table(), flush=True)
        out["test"] = report.to_json()
        out["test_table"] = report.to_markdown_table()
    finally:
        for corpus in corpora.values():
            corpus.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/dpr-bench-rerank"))
    parser.add_argument("--shared", type=Path, default=REPO.parent / "shared", help="The ../shared folder.")
    parser.add_argument("--finetuned-model", help="Reuse a trained model instead of training one.")
    parser.add_argument("--pretrained-model", help="Reuse a model `dpr train` made with a recipe's pretrain.")
    parser.add_argument("--reranker", help="Reuse a trained reranker.")
    parser.add_argument("--no-reranker", action="store_true", help="Towers and hybrid only.")
    parser.add_argument("--no-base", action="store_true",
                        help="Skip the untrained base towers (their figures do not change between runs).")
    parser.add_argument("--out", default="rerank",
                        help="Results file name under benchmarks/results/quality (NAME.json).")
    parser.add_argument("--towers", action="append", default=[], metavar="LABEL=MODEL",
                        help="Trained towers to compare, reused (repeatable); replaces the two trainings.")
    parser.add_argument("--no-latency", action="store_true",
                        help="Skip the reranker's latency (measured already for one of its architecture, or the "
                        "machine is busy).")
    parser.add_argument("--dev-only", action="store_true",
                        help="Stop after the dev split (decide whether a reranker is worth a test read first).")
    parser.add_argument("--dev-queries", type=int, default=100)
    parser.add_argument("--pretrain-pairs", type=int, default=2000, help="Cap on stage-1 (ICT + title) pairs.")
    parser.add_argument("--pretrain-epochs", type=float, default=1.0)
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--max-pairs", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="A small slice end to end (figures mean nothing).")
    args = parser.parse_args()
    global DATA
    DATA = args.shared / "data" / "beir-scifact"
    if not DATA.is_dir():
        raise SystemExit(f"needs ../shared/data beside the repo ({DATA} is missing)")
    if args.smoke:  # 60 train queries (10 of them dev), 10 test queries, ~200 documents, 2 steps per training
        DATA = write_slice(DATA, args.data_dir / "scifact-slice", 60, 10, 150)
        args.max_steps, args.max_pairs, args.dev_queries, args.pretrain_pairs = 2, 64, 10, 32
    logging.basicConfig(level=logging.WARNING)
    out = run(args)
    out["load_average_end"] = os.getloadavg()
    name = "rerank-smoke" if args.smoke else args.out
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(f"\nwrote {RESULTS / (name + '.json')}")


if __name__ == "__main__":
    main()
