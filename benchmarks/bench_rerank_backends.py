"""A reranker on each inference backend, side by side in one process: torch, ONNX fp32 and ONNX int8 (what
``DPR_RERANK__BACKEND`` chooses). Over the same dev questions and the same first-stage candidates, each backend in
turn: nDCG@10 of the top N reranked (the reranker alone, and fused with the first stage at the weight the dev split
picks), the reranker's time per question (the latency it adds to `dpr query --rerank N`), and how far its scores
stray from the first backend's.

  python benchmarks/bench_rerank_backends.py --reranker NAME --first-stage TOWERS [--data-dir .dpr]
      [--backends torch,onnx,onnx-int8] [--out rerank-backends]

Needs ``../shared/data/beir-scifact`` (the dev claims carved from its train split, as `dpr train-reranker` holds
them out) and the models under ``--data-dir``/models; prints a table with the machine and commit, writes
``results/quality/OUT.json`` and ``results/quality/OUT.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from bench_rerank import Timed, latency_ms  # noqa: E402
from machine import commit, machine, script  # benchmarks/ is sys.path[0]

REPO = script()

from encoders.data import RetrievalDataset  # noqa: E402
from encoders.rerank import load_reranker  # noqa: E402
from services.core.settings import Settings  # noqa: E402
from services.lab.evaluation.retrieval import Retrieval  # noqa: E402
from services.lab.reranker.recipe import first_stage_retriever  # noqa: E402
from services.lab.reranker.trainer import dev_rerank_metrics  # noqa: E402
from services.readers import load_dev_split  # noqa: E402

DATA = REPO.parent / "shared" / "data" / "beir-scifact"
RESULTS = REPO / "benchmarks" / "results" / "quality"
NS = (20, 50)


class Scored(Timed):
    """``bench_rerank.Timed`` that also keeps each question's scores, to compare backends on the same pairs."""

    def __init__(self, reranker: Any) -> None:
        super().__init__(reranker, [])
        self.scores: dict[str, np.ndarray] = {}

    def score(self, question: str, passages: Sequence[str], batch_size: int = 32) -> np.ndarray:
        out = np.asarray(super().score(question, passages, batch_size=batch_size), dtype=np.float64)
        self.scores[question] = out
        return out


def agreement(scores: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> dict[str, float]:
    """Largest score difference, and the share of questions whose reranked order is the reference's."""
    diffs = [float(np.max(np.abs(scores[q] - reference[q]))) for q in reference]
    same = [bool(np.array_equal(np.argsort(-scores[q], kind="stable"), np.argsort(-reference[q], kind="stable")))
            for q in reference]
    return {"max_abs_diff": round(max(diffs), 5), "same_order": round(sum(same) / len(same), 3)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = Settings(data_dir=args.data_dir)
    dev: RetrievalDataset = load_dev_split(DATA, "train", "beir", args.dev_queries)
    first = first_stage_retriever(settings, args.first_stage)(dev, 100)  # once: every backend reranks these

    def first_stage(_: RetrievalDataset, __: int) -> Retrieval:
        return first

    rows: dict[str, dict[str, Any]] = {}
    reference: dict[int, dict[str, np.ndarray]] = {}
    for backend in args.backends:
        reranker = load_reranker(args.reranker, settings.models_dir, backend)  # type: ignore[arg-type]
        reranker.score(dev.queries[next(iter(dev.queries))], ["warm-up"])  # session start and first-call costs
        for n in NS:
            timed = Scored(reranker)
            metrics = dev_rerank_metrics(timed.score, dev, first_stage, n)
            row = {"backend": backend, "served_by": reranker.backend, "n": n,
                   "before": round(metrics["before"]["ndcg@10"], 4),
                   "alone": metrics["ndcg@10_by_weight"]["1"], "weight": metrics["weight"],
                   "fused": round(metrics["after"]["ndcg@10"], 4), **latency_ms(timed.latencies or [])}
            if n in reference:
                row.update(agreement(timed.scores, reference[n]))
            else:
                reference[n] = timed.scores
            rows[f"{backend} N={n}"] = row
            print(json.dumps(row), flush=True)
    for row in rows.values():  # latency against the first backend's at the same N
        base = rows[f"{args.backends[0]} N={row['n']}"]
        row["p50_vs_first"] = round(base["p50_ms"] / row["p50_ms"], 2)
    return {"ran_at": datetime.now(UTC).isoformat(timespec="seconds"), "commit": commit(), "machine": machine(),
            "reranker": args.reranker, "first_stage": args.first_stage, "dev_queries": len(dev.queries),
            "rows": rows}


def table(out: dict[str, Any]) -> str:
    m = out["machine"]
    head = [f"# Reranker backends: `{out['reranker']}` over the dev top N of `{out['first_stage']}`", "",
            f"{m['cpu']} ({m['flags'].replace(' ', ', ')}), {m['cores']} cores; "
            f"commit {out['commit']}; {out['ran_at']}; "
            f"{out['dev_queries']} dev questions (SciFact train claims held out). `alone`: nDCG@10 with the top N in "
            "the reranker's order; `fused`: at the weight the dev split picks (w); latency: the reranker's time per "
            "question; `speed-up`: the first backend's p50 over this one's; agreement with the first backend's "
            "scores on the same pairs.", "",
            "| backend | N | first stage | alone | fused (w) | mean ms | p50 ms | p95 ms | speed-up "
            "| max abs score diff | same order |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    body = [f"| {r['backend']} ({r['served_by']}) | {r['n']} | {r['before']:.4f} | {r['alone']:.4f} | "
            f"{r['fused']:.4f} ({r['weight']:g}) | {r['mean_ms']:,.0f} | {r['p50_ms']:,.0f} | {r['p95_ms']:,.0f} | "
            f"{r['p50_vs_first']:.2f}x | {r.get('max_abs_diff', '')} | {r.get('same_order', '')} |"
            for r in out["rows"].values()]
    return "\n".join(head + body) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reranker", required=True, help="a reranker model name under --data-dir/models")
    parser.add_argument("--first-stage", required=True, help="towers (a model name) or bm25")
    parser.add_argument("--data-dir", type=Path, default=REPO / ".dpr")
    parser.add_argument("--backends", type=lambda s: s.split(","), default=["torch", "onnx", "onnx-int8"])
    parser.add_argument("--dev-queries", type=int, default=100)
    parser.add_argument("--out", default="rerank-backends")
    args = parser.parse_args()
    if not DATA.is_dir():
        print(f"skipped: {DATA} is not here (it sits beside the repo on a development machine)", file=sys.stderr)
        return 0
    out = run(args)
    text = table(out)
    print(text)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(out, indent=1) + "\n")
    (RESULTS / f"{args.out}.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
