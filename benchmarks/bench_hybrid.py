"""Hybrid retrieval (dense + BM25 sparse vectors in one Qdrant collection, fused at query time): quality floors and
latency, in ONE run over the real store (embedded engine, product ingest path, ``search_many``).

Needs ../shared/data beside the repo. Sections (``--sections``, default all, in this order):

- ``scifact``: the corpus is ingested once per model (dense + BM25). The fusion grid (RRF k in {10,30,60,100},
  linear dense weight 0.0..1.0, 100 candidates per branch) is scored on 100 SciFact TRAIN queries held out with
  ``services.readers.load_dev_split`` (the dev queries ``dpr train`` holds out): the best RRF point, the best linear
  point and the overall choice are then reported on the 300 TEST queries beside BM25 (bm25s), BM25 through Qdrant
  (``bm25-store``) and dense. Floor: the chosen hybrid's nDCG@10 >= the best of dense and both BM25s.
- ``squad``: SQuAD v1.1 dev, deterministic article split. Tuned on ``--squad-dev`` questions of the TRAIN
  articles (their paragraphs as the corpus), reported on every question of the TEST articles (their paragraphs).
  Metric: top-20 answer accuracy. Floor: the chosen hybrid's answer@20 >= BM25's (bm25s and bm25-store).
- ``zeroshot``: Cranfield and CISI (test qrels only, no training questions to tune on): the SciFact-tuned choice
  (and the best SciFact RRF point) applied as is. No floor; reported.
- ``latency``: query latency p50/p95, dense vs hybrid (RRF and linear), at ``--points`` passages: the first
  ``--latency-docs`` SciFact abstracts chunked and encoded for real, plus synthetic copies (the ``bench_api``
  recipe: same text and BM25 vector, own doc id, vector ``normalise(v + noise)``, cosine ~0.89 to its source)
  up to ``--points``. Timed end to end (question tower + store, ``services.query.search``) and store-only
  (pre-encoded question vectors, ``store.search``), on real SciFact questions, sequentially.

Models: the base all-MiniLM-L6-v2 always; a trained model too when ``--trained NAME|PATH`` is given or
``--data-dir``/models has an active one.

Usage: ``.venv/bin/python benchmarks/bench_hybrid.py [--data-dir DIR] [--sections scifact,squad,zeroshot,latency]``;
prints every table and writes ``benchmarks/results/quality/hybrid.md`` (+ ``hybrid.json``) after every section.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from machine import script  # benchmarks/ is sys.path[0]

REPO = script()

from encoders import data as d  # noqa: E402
from encoders.towers import DualEncoder, resolve_model_path  # noqa: E402
from services import readers  # noqa: E402
from services.core.settings import Settings  # noqa: E402
from services.lab.evaluation.retrieval import EvalReport, Retrieval, SystemResult, bm25_retriever, score_retrieval  # noqa: E402
from services.lab.evaluation.store_retriever import StoreCorpus, _served_towers  # noqa: E402
from services.lab.hybrid.tuning import FusionChoice, TuneResult, select_best, tune_on_corpus  # noqa: E402
from services.query import QueryOptions  # noqa: E402
from services.readers import load_dev_split  # noqa: E402

DATA = REPO.parent / "shared" / "data"
RESULTS = REPO / "benchmarks" / "results" / "quality"
SECTIONS = ("scifact", "squad", "zeroshot", "latency")
K = 100
# The fixed fusions a collection could serve with no labels (the label-free default is chosen among them on SciFact's
# dev queries, then read on every test set: `defaults` in the results).
LABEL_FREE = (FusionChoice("rrf", rrf_k=60), FusionChoice("linear", linear_weight=0.5))

log = logging.getLogger("bench_hybrid")
STATE: dict[str, Any] = {"sections": {}}


def say(msg: str) -> None:
    print(f"[{datetime.now(UTC).strftime('%H:%M:%S')}] {msg}", flush=True)


def progress(label: str):  # noqa: ANN201
    last = [0.0]

    def on(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] > 30 or done == total:
            last[0] = now
            say(f"  ingest {label}: {done}/{total} documents")

    return on


def timed(dataset: d.RetrievalDataset, name: str, run: Any) -> SystemResult:
    t0 = time.perf_counter()
    retrieval: Retrieval = run(dataset, K)
    seconds = time.perf_counter() - t0
    metrics, curves = score_retrieval(dataset, retrieval)
    say(f"  {name}: " + ", ".join(f"{k} {v:.3f}" for k, v in metrics.items() if k in SHOW))
    return SystemResult(name, metrics, curves, seconds)


SHOW = ("ndcg@10", "recall@100", "answer@20", "answer@5")


def best_of(tuned: TuneResult, fusion: str) -> FusionChoice:
    metric, tie = tuning_metrics_from(tuned)
    return select_best([(c, m) for c, m in tuned.grid if c.fusion == fusion], metric, tie)[0]


def tuning_metrics_from(tuned: TuneResult) -> tuple[str, str]:
    return (tuned.metric, "ndcg@10" if tuned.metric != "ndcg@10" else "recall@100")


def model_list(args: argparse.Namespace, settings: Settings) -> list[tuple[str, DualEncoder]]:
    """The base towers and, when named or active, a trained model; each as the product serves it (passages on
    ``DPR_ENCODER__BACKEND``, default onnx-int8; questions on its question backend)."""
    out = [("base", _served_towers(settings, "base"))]
    spec = args.trained
    if spec is None and (settings.models_dir / "ACTIVE").is_file():
        spec = "active"
    if spec is not None:
        _, name = resolve_model_path(spec, settings.models_dir)
        if name != "base":
            out.append((f"trained:{name}", _served_towers(settings, spec)))
    return out


def hybrid_rows(corpus: StoreCorpus, test: d.RetrievalDataset, label: str, tuned: TuneResult) -> list[SystemResult]:
    """Hybrid at the best RRF and the best linear point of dev, then at each label-free candidate not among them."""
    rows = []
    rrf, linear = best_of(tuned, "rrf"), best_of(tuned, "linear")
    for choice in (rrf, linear):
        mark = " (chosen)" if choice == tuned.choice else ""
        rows.append(timed(test, f"{label}+hybrid {choice.label()}{mark}", corpus.retriever(choice.options())))
    return rows + label_free_rows(corpus, test, label, skip=(rrf, linear))


def label_free_rows(corpus: StoreCorpus, test: d.RetrievalDataset, label: str,
                    skip: tuple[FusionChoice, ...] = ()) -> list[SystemResult]:
    return [timed(test, f"{label}+hybrid {c.label()} (label-free)", corpus.retriever(c.options()))
            for c in LABEL_FREE if c not in skip]


def tune_summary(label: str, tuned: TuneResult) -> dict[str, Any]:
    return {
        "model": label,
        "dev": tuned.tuned_on,
        "metric": tuned.metric,
        "dense": round(tuned.dense_score, 4),
        "bm25_store": round(tuned.sparse_score, 4),
        "chosen": tuned.choice.label(),
        "chosen_score": round(tuned.dev_score, 4),
        "best_rrf": best_of(tuned, "rrf").label(),
        "best_linear": best_of(tuned, "linear").label(),
        "grid": {c.label(): round(m[tuned.metric], 4) for c, m in tuned.grid},
    }


def test_rows(corpus: StoreCorpus, test: d.RetrievalDataset, label: str, tuned: TuneResult,
              results: list[SystemResult]) -> list[SystemResult]:
    """The test rows of one model's store: BM25 through the store (once per section: ``results`` has it after the
    first model), the dense towers, and hybrid at the fusions ``tuned`` chose on dev."""
    rows = []
    if not any(r.system == "bm25-store" for r in results):
        rows.append(timed(test, "bm25-store", corpus.retriever(QueryOptions(mode="sparse"))))
    rows.append(timed(test, label, corpus.retriever(QueryOptions(mode="dense"))))
    return rows + hybrid_rows(corpus, test, label, tuned)


def hybrid_floors(results: list[SystemResult], tunes: list[dict[str, Any]], metric: str, title: str,
                  *, with_dense: bool) -> list[dict[str, Any]]:
    """Per model tuned on dev (``tune_summary``): its dev-chosen hybrid against both BM25s (and its own dense towers
    when ``with_dense``)."""
    by = {r.system: r.metrics[metric] for r in results}
    floors = []
    for label in (t["model"] for t in tunes):
        chosen = next(v for k, v in by.items() if k.startswith(f"{label}+hybrid") and k.endswith("(chosen)"))
        bar = max([by["bm25 (bm25s)"], by["bm25-store"]] + ([by[label]] if with_dense else []))
        against = "dense, bm25s, bm25-store" if with_dense else "bm25s, bm25-store"
        floors.append({"floor": f"{title}: {label}+hybrid (chosen) >= max({against})",
                       "value": round(chosen, 4), "bar": round(bar, 4), "met": chosen >= bar})  # fmt: skip
    return floors


def section_result(test: d.RetrievalDataset, results: list[SystemResult], tunes: list[dict[str, Any]], metric: str,
                   title: str, *, with_dense: bool) -> dict[str, Any]:
    """A tuned section's table, timings, tunes and floors (``hybrid_floors`` on ``metric``)."""
    floors = hybrid_floors(results, tunes, metric, title, with_dense=with_dense)
    report = EvalReport(test.name, len(test.queries), len(test.corpus), results)
    seconds = {r.system: round(r.seconds, 1) for r in results}
    return {"table": report.to_markdown_table(), "queries": len(test.queries), "seconds": seconds,
            "tuning": tunes, "floors": floors, "ndcg": ndcg_of(results)}  # fmt: skip


def ndcg_of(results: list[SystemResult]) -> dict[str, float]:
    return {r.system: round(r.metrics["ndcg@10"], 4) for r in results}


def label_free_summary(sec: dict[str, Any]) -> list[str]:
    """The label-free candidates (base towers) on each BEIR test set beside dense and BM25, their dev scores on
    SciFact's held-out train queries, and the issue's floors: each >= max(dense, BM25) - 0.005; mean >= dense + 0.03."""
    tables = {"scifact": sec.get("scifact", {}).get("ndcg"), **sec.get("zeroshot", {}).get("ndcg", {})}
    tables = {k: v for k, v in tables.items() if v}
    if not tables:
        return []
    names = [c.label() for c in LABEL_FREE]
    lines = ["## Label-free default (base towers, nDCG@10, test)", "",
             "| collection | dense | BM25 (max of bm25s, store) | " + " | ".join(f"hybrid {n}" for n in names) + " |",
             "|---|---|---|" + "---|" * len(names)]  # fmt: skip
    cols: dict[str, list[float]] = {"dense": [], **{n: [] for n in names}}
    floor_rows = []
    for name, by in tables.items():
        bm25 = max(by["bm25 (bm25s)"], by["bm25-store"])
        row = [by["base"]] + [next(v for k, v in by.items() if k.startswith(f"base+hybrid {n}")) for n in names]
        cols["dense"].append(row[0])
        for n, v in zip(names, row[1:], strict=True):
            cols[n].append(v)
            bar = max(row[0], bm25) - 0.005
            floor_rows.append(f"| {name}: hybrid {n} >= max(dense, BM25) - 0.005 | {v:.3f} | {bar:.3f} | "
                              f"{'yes' if v >= bar else 'NO'} |")
        lines.append(f"| {name} | {row[0]:.3f} | {bm25:.3f} | " + " | ".join(f"{v:.3f}" for v in row[1:]) + " |")
    mean = {k: sum(v) / len(v) for k, v in cols.items()}
    lines.append(f"| mean | {mean['dense']:.3f} | | " + " | ".join(f"{mean[n]:.3f}" for n in names) + " |")
    for n in names:
        ok = mean[n] >= mean["dense"] + 0.03
        floor_rows.append(f"| mean: hybrid {n} >= dense + 0.03 | {mean[n]:.3f} | {mean['dense'] + 0.03:.3f} | "
                          f"{'yes' if ok else 'NO'} |")
    dev = next((t for t in sec.get("scifact", {}).get("tuning", []) if t["model"] == "base"), None)
    if dev:
        grid = dev["grid"]  # keyed by FusionChoice.label()
        lines += ["", f"SciFact dev ({dev['dev']['queries']} held-out train queries, nDCG@10): "
                  f"dense {dev['dense']:.3f}, "
                  f"bm25-store {dev['bm25_store']:.3f}, " + ", ".join(f"hybrid {n} {grid[n]:.3f}" for n in names)
                  + ": the label-free default is the best of these on dev."]  # fmt: skip
    return lines + ["", "| floor | value | bar | met |", "|---|---|---|---|", *floor_rows, ""]


# --- sections ------------------------------------------------------------------------------------------------------


def section_scifact(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    folder = DATA / "beir-scifact"
    dev = load_dev_split(folder, "train", "beir", args.dev_queries)
    test = readers.load_beir(folder, "test")
    if set(test.corpus) != set(dev.corpus):
        raise RuntimeError("SciFact train and test corpora differ; expected one corpus")
    test = replace(test, corpus=dev.corpus)  # the same corpus object: ingested once, asked with dev then test
    say(f"scifact: dev {dev.name} ({len(dev.queries)} q), test {test.name} ({len(test.queries)} q), "
        f"{len(test.corpus)} docs")  # fmt: skip
    results = [timed(test, "bm25 (bm25s)", bm25_retriever())]
    tunes = []
    for label, towers in model_list(args, settings):
        corpus = StoreCorpus(towers, settings=settings, workdir=args.work, progress=progress(f"scifact/{label}"))
        try:
            t0 = time.perf_counter()
            corpus.prepare(dev)
            say(f"  ingested {label} in {time.perf_counter() - t0:.0f} s ({corpus.ingest_report.chunks} chunks)")  # type: ignore[union-attr]
            tuned = tune_on_corpus(corpus, dev)
            tunes.append(tune_summary(label, tuned))
            say(f"  {label}: tuned on dev: dense {tuned.dense_score:.3f}, bm25-store {tuned.sparse_score:.3f}, "
                f"chosen {tuned.choice.label()} {tuned.dev_score:.3f}")  # fmt: skip
            STATE.setdefault("scifact_choice", {})[label] = tuned
            results += test_rows(corpus, test, label, tuned, results)
        finally:
            corpus.close()
    return section_result(test, results, tunes, "ndcg@10", "SciFact test nDCG@10", with_dense=True)


def section_squad(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    path = DATA / "squad-v1.1-dev" / "dev-v1.1.json.gz"
    dev = load_dev_split(path, "train", "squad", args.squad_dev)
    test = readers.load_squad(path, "test")
    say(f"squad: dev {dev.name} ({len(dev.queries)} q, {len(dev.corpus)} paragraphs), test {test.name} "
        f"({len(test.queries)} q, {len(test.corpus)} paragraphs)")  # fmt: skip
    results = [timed(test, "bm25 (bm25s)", bm25_retriever())]
    tunes = []
    for label, towers in model_list(args, settings):
        dev_corpus = StoreCorpus(
            towers, settings=settings, workdir=args.work, progress=progress(f"squad-train/{label}")
        )
        try:
            tuned = tune_on_corpus(dev_corpus, dev)
        finally:
            dev_corpus.close()
        tunes.append(tune_summary(label, tuned))
        say(f"  {label}: tuned on dev: dense {tuned.dense_score:.3f}, bm25-store {tuned.sparse_score:.3f}, "
            f"chosen {tuned.choice.label()} {tuned.dev_score:.3f} ({tuned.metric})")  # fmt: skip
        corpus = StoreCorpus(towers, settings=settings, workdir=args.work, progress=progress(f"squad-test/{label}"))
        try:
            results += test_rows(corpus, test, label, tuned, results)
        finally:
            corpus.close()
    return section_result(test, results, tunes, "answer@20", "SQuAD test articles answer@20", with_dense=False)


def section_zeroshot(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    out: dict[str, Any] = {"tables": {}}
    choices: dict[str, TuneResult] = STATE.get("scifact_choice", {})
    for name in ("cranfield", "cisi"):
        test = readers.load_beir(DATA / name, "test")
        say(f"{name}: {len(test.queries)} judged q, {len(test.corpus)} docs")
        results = [timed(test, "bm25 (bm25s)", bm25_retriever())]
        for label, towers in model_list(args, settings):
            corpus = StoreCorpus(towers, settings=settings, workdir=args.work, progress=progress(f"{name}/{label}"))
            try:
                if not any(r.system == "bm25-store" for r in results):
                    results.append(timed(test, "bm25-store", corpus.retriever(QueryOptions(mode="sparse"))))
                results.append(timed(test, label, corpus.retriever(QueryOptions(mode="dense"))))
                tuned = choices.get(label)
                picks = [("scifact-chosen", tuned.choice), ("scifact-best-rrf", best_of(tuned, "rrf"))] if tuned else []
                picks += [("label-free", c) for c in LABEL_FREE]
                seen = set()
                for tag, choice in picks:
                    if choice in seen:
                        continue
                    seen.add(choice)
                    results.append(timed(test, f"{label}+hybrid {choice.label()} ({tag})",
                                         corpus.retriever(choice.options())))  # fmt: skip
            finally:
                corpus.close()
        report = EvalReport(test.name, len(test.queries), len(test.corpus), results)
        out["tables"][name] = report.to_markdown_table()
        out.setdefault("ndcg", {})[name] = ndcg_of(results)
    return out


def section_latency(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    import numpy as np
    from bench_api import build_store, load_docs, load_questions

    from services.query import search
    from services.runtime import Runtime
    from services.store.points import SearchRequest
    from services.store.sparse import default_embedder

    tmp = Path(tempfile.mkdtemp(prefix="bench-hybrid-lat-", dir=args.work))
    cfg = settings.model_copy(update={"data_dir": tmp, "collection": "latency", "qdrant_url": None})
    runtime = Runtime(cfg)
    try:
        say(f"latency: encoding {args.latency_docs} SciFact abstracts, filling to {args.points:,} points")
        built = build_store(runtime, load_docs(args.latency_docs), args.points)
        say(f"  store: {built['points']:,} points ({built['real']} real passages)")
        questions = load_questions(args.queries)
        towers, store, bm25 = runtime.towers, runtime.store, default_embedder()
        modes = {
            "dense": QueryOptions(k=10, mode="dense"),
            "hybrid rrf k=60": QueryOptions(k=10, mode="hybrid", fusion="rrf", rrf_k=60, candidates=100),
            "hybrid linear w=0.5": QueryOptions(
                k=10, mode="hybrid", fusion="linear", linear_weight=0.5, candidates=100
            ),  # fmt: skip
            "sparse": QueryOptions(k=10, mode="sparse"),
        }
        vectors = towers.encode_queries(questions)  # (n, dim)
        rows = {}
        for name, options in modes.items():
            for q in questions[:10]:  # warm-up
                search(q, store=store, towers=towers, options=options, sparse=bm25)
            e2e = []
            for q in questions:
                t = time.perf_counter()
                search(q, store=store, towers=towers, options=options, sparse=bm25)
                e2e.append((time.perf_counter() - t) * 1000)
            only = []
            for i, q in enumerate(questions):
                req = SearchRequest(k=10, mode=options.mode or "dense",
                                    dense=vectors[i].tolist() if options.mode != "sparse" else None,
                                    sparse=bm25.embed_query(q) if options.mode != "dense" else None,
                                    fusion=options.fusion or "rrf", rrf_k=options.rrf_k or 60,
                                    linear_weight=options.linear_weight if options.linear_weight is not None else 0.5,
                                    candidates=options.candidates or 100)  # fmt: skip
                t = time.perf_counter()
                store.search(req)
                only.append((time.perf_counter() - t) * 1000)
            rows[name] = {
                "e2e_p50": statistics.median(e2e), "e2e_p95": float(np.percentile(e2e, 95)),
                "store_p50": statistics.median(only), "store_p95": float(np.percentile(only, 95)),
            }  # fmt: skip
            r = rows[name]
            say(f"  {name}: end-to-end p50 {r['e2e_p50']:.1f} ms, store-only p50 {r['store_p50']:.1f} ms")
        return {"points": built["points"], "real": built["real"], "queries": len(questions), "rows": rows}
    finally:
        runtime.close()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


# --- report --------------------------------------------------------------------------------------------------------


def write_results(args: argparse.Namespace) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    sec = dict(STATE["sections"])
    if args.merge and (RESULTS / "hybrid.json").is_file():  # sections another invocation ran (and only those)
        others = json.loads((RESULTS / "hybrid.json").read_text())
        sec = {**{k: v for k, v in others.items() if k not in sec}, **sec}
    lines = [
        "# Hybrid retrieval (dense + BM25 in one Qdrant collection): quality floors and latency",
        "",
        f"One run of `{' '.join(['benchmarks/bench_hybrid.py', *sys.argv[1:]])}`, started {STATE['started']} on "
        f"{platform.node()} ({os.cpu_count()} cores, shared with other work). Every system below went through the "
        "real embedded store (product ingest path with dense + BM25 sparse vectors, `search_many`), except "
        "`bm25 (bm25s)`, the in-memory baseline (English stopwords, Snowball stemming, k1 1.5, b 0.75). "
        "`bm25-store` is the BM25 sparse vectors alone through Qdrant (qdrant-edge Bm25: word tokens, lower case, "
        "English stopwords, Snowball stemming, k 1.2, b 0.75, avg_len 256; IDF from the collection). Chunk hits "
        "are folded to documents by max score; depth 100 documents (300 chunk hits).",
        "",
    ]
    runs = sorted({(v.get("started", ""), v.get("command", "")) for v in sec.values() if v.get("command")})
    if len(runs) > 1:
        lines += ["Sections came from these invocations of this script (same commit, run concurrently to fit the "
                  "time budget on a shared 2-core machine):", ""]  # fmt: skip
        lines += [f"- started {started}: `{command}`" for started, command in runs]
        lines.append("")
    floors = [f for s in sec.values() for f in s.get("floors", [])]
    if floors:
        lines += ["## Floors", "", "| floor | value | bar | met |", "|---|---|---|---|"]
        lines += [
            f"| {f['floor']} | {f['value']:.3f} | {f['bar']:.3f} | {'yes' if f['met'] else 'NO'} |" for f in floors
        ]
        lines.append("")
    lines += label_free_summary(sec)
    if "scifact" in sec:
        s = sec["scifact"]
        lines += [f"## SciFact (BEIR) test, {s['queries']} queries", "",
                  f"Tuned on {args.dev_queries} TRAIN queries held out with `load_dev_split` (seed 13); test only "
                  "reports. `rrf`/`linear` rows are the best RRF and the best linear grid points on dev; "
                  "`(chosen)` is the overall dev choice (what `dpr tune-hybrid` would store).", "",
                  s["table"], ""]  # fmt: skip
        lines += _tuning_lines(s["tuning"])
    if "squad" in sec:
        s = sec["squad"]
        lines += ["## SQuAD v1.1 dev, article split: test articles", "",
                  f"Tuned on {args.squad_dev} questions of the TRAIN articles (their paragraphs as the corpus, "
                  "answer@20 on dev); reported on every question of the TEST articles over their paragraphs.", "",
                  s["table"], ""]  # fmt: skip
        lines += _tuning_lines(s["tuning"])
    if "zeroshot" in sec:
        lines += ["## Cranfield and CISI (zero-shot)", "",
                  "Only test qrels exist for these collections, so nothing was tuned on them: the SciFact dev choice "
                  "(and the best SciFact RRF point) is applied as is.", ""]  # fmt: skip
        for name, table in sec["zeroshot"]["tables"].items():
            lines += [f"### {name}", "", table, ""]
    if "latency" in sec:
        s = sec["latency"]
        lines += [f"## Query latency at {s['points']:,} passages", "",
                  f"{s['real']} real SciFact passages (chunked, encoded by the base passage tower) plus "
                  f"{s['points'] - s['real']:,} synthetic copies (same text and BM25 vector, own doc id, vector "
                  "normalise(v + noise), cosine ~0.89 to its source): only the dense vectors' distribution is "
                  "synthetic; the scan (exact, no HNSW before `optimize()`) and the sparse index are real. "
                  f"{s['queries']} real SciFact questions, sequential, k=10, 100 candidates per branch. "
                  "End to end = question tower + BM25 query vector + store; store-only = pre-encoded vectors.", "",
                  "| mode | end-to-end p50 ms | p95 ms | store-only p50 ms | p95 ms |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for name, r in s["rows"].items():
            lines.append(f"| {name} | {r['e2e_p50']:.1f} | {r['e2e_p95']:.1f} | {r['store_p50']:.1f} | "
                         f"{r['store_p95']:.1f} |")  # fmt: skip
        lines.append("")
    md = RESULTS / "hybrid.md"
    md.write_text("\n".join(lines))
    (RESULTS / "hybrid.json").write_text(json.dumps(sec, indent=2, default=str) + "\n")
    return md


def _tuning_lines(tunes: list[dict[str, Any]]) -> list[str]:
    lines = []
    for t in tunes:
        grid = ", ".join(f"{k.replace(' c=100', '')} {v:.3f}" for k, v in t["grid"].items())
        lines += [f"Dev ({t['model']}, {t['metric']}, {t['dev']['queries']} questions): dense {t['dense']:.3f}, "
                  f"bm25-store {t['bm25_store']:.3f}; grid: {grid}. Chosen: {t['chosen']} ({t['chosen_score']:.3f}).",
                  ""]  # fmt: skip
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, default=None, help="settings data dir (models); default: a temp dir")
    ap.add_argument("--work", type=Path, default=None, help="where temporary collections go (default: system tmp)")
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument("--trained", default=None, help="a trained model (name under DATA_DIR/models or a path)")
    ap.add_argument("--dev-queries", type=int, default=100)
    ap.add_argument("--squad-dev", type=int, default=1000)
    ap.add_argument("--latency-docs", type=int, default=300)
    ap.add_argument("--points", type=int, default=50_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--merge", action="store_true",
                    help="keep the other sections already in results/quality/hybrid.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if not DATA.is_dir():
        print(f"needs {DATA} beside the repo", file=sys.stderr)
        return 2
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="bench-hybrid-"))
    settings = Settings(data_dir=data_dir)
    STATE["started"] = datetime.now(UTC).isoformat(timespec="seconds")
    wanted = [s.strip() for s in args.sections.split(",") if s.strip()]
    for name in wanted:
        if name not in SECTIONS:
            print(f"unknown section {name!r}; use {', '.join(SECTIONS)}", file=sys.stderr)
            return 2
    for name in wanted:  # in the order given
        t0 = time.perf_counter()
        STATE["sections"][name] = globals()[f"section_{name}"](args, settings)
        STATE["sections"][name]["section_seconds"] = round(time.perf_counter() - t0)
        STATE["sections"][name]["command"] = " ".join(["benchmarks/bench_hybrid.py", *sys.argv[1:]])
        STATE["sections"][name]["started"] = STATE["started"]
        md = write_results(args)
        say(f"section {name} done in {time.perf_counter() - t0:.0f} s; wrote {md}")
    print()
    print(md.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
