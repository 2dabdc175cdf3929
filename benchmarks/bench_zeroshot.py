"""Issue 16's "no domain lost": towers trained on SciFact, searched zero-shot on Cranfield and CISI.

Fine-tuning on one collection costs the others. WiSE-FT (``--blend F``, ``dpr models blend``) trades some of the
in-domain gain back for the base model's breadth, and F has to be chosen without reading Cranfield's or CISI's
test queries, the only labels they have. ``--choose-on`` says on what:

- ``target`` (default; what ``dpr models blend --choose-on`` does for a user): pseudo-questions built from each
  target collection's own documents, no question or judgment read
  (``services.lab.shared.self_supervised.pseudo_query_sets``: 500 titles over the title-less bodies, 500 ICT sentences
  each taken out of its document). One F per collection.
- ``squad``: one out-of-domain dev split for both, the questions of the SQuAD v1.1 dev file's *train* articles
  (the article split; never trained on by a SciFact model, never read as a test set), ``--ood-questions`` of them
  over those articles' paragraphs (session 29's choice: it under-blended for library abstracts).

Rule (``services.lab.towers.wise_ft.pick_blend``), fixed before any test figure is read: the best mean dev nDCG@10 among
the base and each weight of ``--weights``; F = the largest weight within ``--margin`` (0.005) of it. The in-domain
price is read for each pick (the 100 SciFact train claims `dpr train` holds out, seed 13, over the whole SciFact
corpus: ~5 min on 2 cores). The pick is saved as a real model (``blend_saved_model``, as ``dpr models blend``
does), then the test splits are read once: Cranfield and CISI for base, the trained model unblended and the
collection's pick, each dense and hybrid (the product's default fusion, nothing tuned) through the store, with BM25
and paired randomization tests against BM25 and base.

Needs ../shared/data beside the repo (``--shared``) and a SciFact model trained with `dpr train` under the data
dir's models. Usage: ``.venv/bin/python benchmarks/bench_zeroshot.py --model NAME [--choose-on target|squad]
[--data-dir .dpr] [--out zeroshot-blend-chosen-on-target]``. Dev scoring is exact search in memory on torch (whole
documents at the passage tower's length), as `dpr train --dev-baseline` reports.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from machine import commit, cpu_flags, cpu_model, script  # benchmarks/ is sys.path[0]

REPO = script()

from encoders.data import DEV_SPLIT_SEED, RetrievalDataset  # noqa: E402
from encoders.towers import SentenceTransformerTowers, resolve_model_path  # noqa: E402
from services.core.settings import Settings  # noqa: E402
from services.lab.evaluation.retrieval import Retriever, bm25_retriever, evaluate_model_in_memory, evaluate_systems  # noqa: E402
from services.lab.evaluation.store_retriever import StoreCorpus  # noqa: E402
from services.lab.shared.self_supervised import pseudo_query_sets  # noqa: E402
from services.lab.towers.wise_ft import (  # noqa: E402
    BLEND_WEIGHTS,
    blend_saved_model,
    load_blended,
    pick_blend,
    pretrained_root,
    score_blends,
)
from services.query import QueryOptions  # noqa: E402
from services.readers import load_beir, load_corpus, load_dev_split, load_squad  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "quality"


COLLECTIONS = ("cranfield", "cisi")


def scifact_dev(shared: Path, dev_queries: int) -> RetrievalDataset:
    """The in-domain dev split: the SciFact train claims `dpr train` holds out."""
    return load_dev_split(shared / "data" / "beir-scifact", "train", "beir", dev_queries)


def choice_sets(args: argparse.Namespace) -> dict[str, dict[str, RetrievalDataset]]:
    """For each target collection, the dev sets its weight is chosen on (the same SQuAD split for both with
    ``--choose-on squad``; that collection's pseudo-questions with ``target``: its corpus only is read)."""
    if args.choose_on == "squad":
        squad = load_squad(args.shared / "data" / "squad-v1.1-dev", "train")
        picked = sorted(random.Random(args.seed).sample(sorted(squad.queries),
                                                        min(args.ood_questions, len(squad.queries))))
        ood = {"squad-train-articles": squad.subset(picked, name=f"{squad.name}-{len(picked)}q")}
        return dict.fromkeys(COLLECTIONS, ood)
    return {c: pseudo_query_sets(load_corpus(args.shared / "data" / c), queries=args.pseudo_queries,
                                 seed=DEV_SPLIT_SEED, name=c) for c in COLLECTIONS}


def test_zero_shot(settings: Settings, shared: Path, towers: dict[str, dict[str, Path]]) -> dict[str, Any]:
    """Cranfield and CISI test, read once: BM25, and each collection's towers dense and hybrid (default fusion)
    through the store."""
    out: dict[str, Any] = {}
    for collection in COLLECTIONS:
        test = load_beir(shared / "data" / collection, "test")
        systems: dict[str, Retriever] = {"bm25": bm25_retriever()}
        corpora: list[StoreCorpus] = []
        try:
            for label, path in towers[collection].items():
                corpus = StoreCorpus(SentenceTransformerTowers(path, name=path.name), settings=settings,
                                     collection=f"zs-{collection}-{len(corpora)}", sparse=True)
                corpora.append(corpus)
                systems[label] = corpus.retriever(QueryOptions(mode="dense"))
                systems[f"hybrid ({label})"] = corpus.retriever(QueryOptions(mode="hybrid"))
            report = evaluate_systems(test, systems, k=100)
            report.add_significance(test.qrels)
        finally:
            for corpus in corpora:
                corpus.close()
        print(f"\n{report.dataset}: {report.queries} queries, {report.documents} documents")
        print(report.to_markdown_table(), flush=True)
        out[collection] = {"report": report.to_json(), "table": report.to_markdown_table()}
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = Settings(data_dir=args.data_dir)
    model_path, model_name = resolve_model_path(args.model, settings.models_dir)
    base_path = pretrained_root(model_path)
    weights = tuple(sorted({float(w) for w in args.weights.split(",")}, reverse=True))
    out: dict[str, Any] = {"ran_at": datetime.now(UTC).isoformat(timespec="seconds"), "commit": commit(),
                           "cpu_model": cpu_model(), "cpu": cpu_flags() or "none",
                           "load_average_start": os.getloadavg(),
                           "model": model_name, "base": str(base_path), "choose_on": args.choose_on,
                           "margin": args.margin, "weights": list(weights), "collections": {}}
    print(f"{out['cpu_model']} ({out['cpu']}), commit {out['commit']}", flush=True)
    in_domain = scifact_dev(args.shared, args.dev_queries)
    in_domain_scores: dict[float, float] = {}
    blended: dict[float, Path] = {}
    towers: dict[str, dict[str, Path]] = {}
    scored: dict[int, dict[str, dict[str, float]]] = {}  # --choose-on squad: one dev split serves both
    for collection, sets in choice_sets(args).items():
        t0 = time.perf_counter()
        sizes = {name: {"queries": len(ds.queries), "documents": len(ds.corpus)} for name, ds in sets.items()}
        print(f"{collection}: choosing on {json.dumps(sizes)}", flush=True)
        if id(sets) not in scored:
            scored[id(sets)] = score_blends(model_path, sets, weights,
                                            progress=lambda line: print(f"  {line}", flush=True))
        scores = scored[id(sets)]
        pick = pick_blend(scores, weights, args.margin)
        record: dict[str, Any] = {"dev_sets": sizes, "dev_ndcg@10": scores, "picked_weight": pick,
                                  "choice_seconds": round(time.perf_counter() - t0)}
        print(f"{collection}: picked F = {pick}", flush=True)
        towers[collection] = {"base": base_path, "trained": model_path}
        if pick is not None and pick < 1:
            if pick not in blended:
                blended[pick] = blend_saved_model(model_path, settings.models_dir, pick, record={
                    "chosen_on": {"source": f"bench_zeroshot {args.choose_on} {collection}", "scores": scores,
                                  "margin": args.margin}}).model_dir
            record["picked_model"] = blended[pick].name
            towers[collection][f"trained blend {pick:g}"] = blended[pick]
        if pick is not None and not args.no_in_domain:
            if pick not in in_domain_scores:
                in_domain_scores[pick] = score_in_domain(model_path, pick, in_domain)
            record["in_domain_dev_ndcg@10"] = in_domain_scores[pick]
        out["collections"][collection] = record
    if not args.no_test:
        out["test"] = test_zero_shot(settings, args.shared, towers)
    out["load_average_end"] = os.getloadavg()
    return out


def score_in_domain(model_path: Path, weight: float, dev: RetrievalDataset) -> float:
    """SciFact dev nDCG@10 of the trained model blended at ``weight``: the price of the pick at home."""
    score = round(evaluate_model_in_memory(load_blended(model_path, weight), dev)["ndcg@10"], 4)
    print(f"in-domain dev {dev.name} F={weight:g}: {score}", flush=True)
    return score


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="A SciFact model trained with `dpr train`.")
    parser.add_argument("--data-dir", type=Path, default=REPO / ".dpr")
    parser.add_argument("--shared", type=Path, default=REPO.parent / "shared", help="The ../shared folder.")
    parser.add_argument("--choose-on", choices=("target", "squad"), default="target",
                        help="Pseudo-questions of each target collection's corpus, or SQuAD's train articles.")
    parser.add_argument("--weights", default=",".join(f"{w:g}" for w in BLEND_WEIGHTS))
    parser.add_argument("--pseudo-queries", type=int, default=500)
    parser.add_argument("--margin", type=float, default=0.005)
    parser.add_argument("--dev-queries", type=int, default=100)
    parser.add_argument("--ood-questions", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--no-test", action="store_true", help="Dev scores and the picks only.")
    parser.add_argument("--no-in-domain", action="store_true", help="Skip the picks' SciFact dev scores.")
    parser.add_argument("--out", default="zeroshot-blend-chosen-on-target",
                        help="Results file name under benchmarks/results/quality.")
    args = parser.parse_args()
    if not (args.shared / "data").is_dir():
        raise SystemExit(f"{args.shared / 'data'} not found: this benchmark needs ../shared/data beside the repo")
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("DPR_ENCODER__BACKEND", "torch")
    out = run(args)
    path = RESULTS / f"{args.out}.json"
    path.write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
