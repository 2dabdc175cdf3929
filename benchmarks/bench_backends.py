"""Quality per inference backend: SciFact test nDCG@10 through the store, base and trained towers, on torch, onnx
(fp32), onnx-int8 and openvino-bf16, one run (issue 68: a path the product may pick loses at most 0.002).

Needs ../shared/data/beir-scifact (exits with a message without it) and, for the trained row, a model trained on
SciFact train under ``--data-dir``/models (``--model``; e.g. ``DPR_DATA_DIR=/tmp/bk/data dpr train
../shared/data/beir-scifact --split train --name scifact``); without one, base only.

Each backend's towers ingest the test corpus into a temporary embedded collection and answer the 300 test claims
through the product's query path (``services.lab.evaluation.store_retriever.compare_systems`` with
``DPR_ENCODER__BACKEND``): the passages and the questions both run on the backend measured. Beside nDCG@10: recall@100,
MRR@10, the cosine of each backend's passage vectors to torch's on a sample, and the paired randomization test of each
backend against torch (the same claims, the same model).

``--no-base`` measures the trained model alone (the base rows of an earlier run stand). ``--split train`` runs the
same measurement on the 809 SciFact train claims, base model only (a model trained on them has seen them): the dev
split on which the default backend is chosen; the test split only reports.

Usage: ``.venv/bin/python benchmarks/bench_backends.py --data-dir /tmp/bk/data [--model scifact]
[--backends torch,onnx-int8] [--split test|train] [--no-base]``; writes
``benchmarks/results/quality/backends.md`` (test) or ``backends-train.md``.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import numpy as np  # noqa: E402
from bench_hotpaths import scifact_dir  # noqa: E402
from machine import commit, machine, script  # benchmarks/ is sys.path[0]

REPO = script()

from encoders.onnx_towers import BACKENDS  # noqa: E402
from encoders.registry import Backend, load_towers  # noqa: E402
from services.core.settings import EncoderSettings, Settings  # noqa: E402
from services.lab.evaluation.store_retriever import compare_systems  # noqa: E402
from services.lab.shared.metrics import paired_randomization, per_query  # noqa: E402
from services.readers import load_beir  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "quality"
FLOOR = 0.002  # the most nDCG@10 a path the product may pick may lose against torch (issue 68)


def settings_for(data_dir: Path, backend: Backend, question: Backend | None = None) -> Settings:
    return Settings(data_dir=data_dir, collection="bench-backends",
                    encoder=EncoderSettings(model="base", backend=backend, question_backend=question or backend))


def parse_rows(text: str) -> list[tuple[Backend, Backend]]:
    """``torch,onnx-int8,onnx-int8/onnx`` -> (passage backend, question backend) pairs; ``P`` means ``P/P``."""
    rows: list[tuple[Backend, Backend]] = []
    for token in text.split(","):
        passage, _, question = token.strip().partition("/")
        for b in (passage, question or passage):
            if b not in BACKENDS:
                raise SystemExit(f"--backends: unknown backend {b!r} in {token!r}; use {', '.join(BACKENDS)}")
        rows.append((passage, question or passage))  # type: ignore[arg-type]
    return rows


def label(passage: str, question: str) -> str:
    return passage if question == passage else f"{passage} (questions {question})"


def cosines(data_dir: Path, spec: str, texts: list[str], backends: list[Backend]) -> dict[str, float]:
    """Mean / min cosine of each of ``backends``' passage vectors to torch's, same texts."""
    s = settings_for(data_dir, "torch")
    ref = load_towers(spec, s.models_dir, backend="torch").encode_documents(texts)
    out: dict[str, float] = {}
    for backend in backends:
        got = load_towers(spec, s.models_dir, backend=backend, cache_dir=s.onnx_cache_dir).encode_documents(texts)
        cos = (ref * got).sum(axis=1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1))
        out[backend] = float(cos.mean())
        out[f"{backend} min"] = float(cos.min())
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--model", default="scifact", help="trained model under --data-dir/models (or a path)")
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help="Comma-separated, torch first (the reference); onnx (fp32) agrees with torch to cosine "
                        "1.0000 at export, so torch,onnx-int8 answers the int8 question in two thirds of the time. "
                        "P/Q: passages on P, questions on Q (DPR_ENCODER__QUESTION_BACKEND), e.g. onnx-int8/onnx.")
    parser.add_argument("--split", choices=("test", "train"), default="test",
                        help="test (report) or train (the dev split for choosing the default; base model only)")
    parser.add_argument("--no-base", dest="base", action="store_false",
                        help="trained model's rows only (the base rows of an earlier run stand; test split)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    scifact = scifact_dir()
    if scifact is None:
        print("bench_backends: needs ../shared/data/beir-scifact beside the repo; nothing measured")
        return 0
    m = machine()
    out = args.out or RESULTS / ("backends.md" if args.split == "test" else f"backends-{args.split}.md")
    test = load_beir(scifact, args.split)
    specs = ["base"]
    if args.split != "test":
        print("train split: base model only (a model trained on SciFact train has seen these claims)", flush=True)
    elif (args.data_dir / "models" / args.model).is_dir() or Path(args.model).is_dir():
        specs = [args.model] if not args.base else [*specs, args.model]
    else:
        print(f"no trained model {args.model!r} under {args.data_dir / 'models'}: base only", flush=True)
    load_start = os.getloadavg()[0]
    rows: list[tuple[str, str, dict[str, float], float]] = []
    runs: dict[tuple[str, str], dict[str, float]] = {}
    combos = parse_rows(args.backends)
    if combos[:1] != [("torch", "torch")]:
        parser.error("--backends must start with torch (the reference)")
    for passage, question in combos:
        for spec in specs:
            started = time.perf_counter()
            settings = settings_for(args.data_dir, passage, question)
            report = compare_systems(test, settings=settings, models=[spec], bm25=False)
            (system,) = report.results
            runs[(spec, label(passage, question))] = per_query(test.qrels, system.run, "ndcg@10")
            rows.append((spec, label(passage, question), system.metrics, time.perf_counter() - started))
            print(f"{spec:10s} {label(passage, question):10s} nDCG@10 {system.metrics['ndcg@10']:.4f} "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)
    sample = [d.passage for d in list(test.corpus.values())[:200]]
    passage_backends = sorted({p for p, _ in combos[1:] if p != "torch"}, key=BACKENDS.index)
    cos = {spec: cosines(args.data_dir, spec, sample, passage_backends) for spec in specs}
    write(out, m, rows, runs, cos, load_start, len(test.queries), args.split)
    print(out.read_text())
    return 0


def write(out: Path, m: dict[str, Any], rows: list[tuple[str, str, dict[str, float], float]],
          runs: dict[tuple[str, str], dict[str, float]], cos: dict[str, dict[str, float]],
          load_start: float, queries: int, split: str = "test") -> None:
    torch = {spec: metrics["ndcg@10"] for spec, backend, metrics, _ in rows if backend == "torch"}
    lines = [
        "# Quality per inference backend (issue 13)", "",
        f"Run {time.strftime('%Y-%m-%d %H:%M')} at commit {commit()} on {m['cpu']} ({m['flags'].replace(' ', ', ')}), "
        f"{m['cores']} cores; load average {load_start:.1f} at start, {os.getloadavg()[0]:.1f} at end. BEIR SciFact "
        f"{split} ({queries} claims{'' if split == 'test' else ': the dev split the default backend is chosen on'}), "
        "dense through a temporary embedded collection; passages and questions on the "
        "backend of the row (questions on another where the row says so). p: paired randomization test against "
        "torch, same model (10,000 permutations).", "",
        "| model | backend | nDCG@10 | delta vs torch | p | recall@100 | MRR@10 | passage cosine to torch "
        "(mean / min, 200 abstracts) | seconds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for spec, backend, metrics, seconds in rows:
        delta = metrics["ndcg@10"] - torch[spec]
        if backend == "torch":
            p, cosine, verdict = "", "1", ""
        else:
            ref, got = runs[(spec, "torch")], runs[(spec, backend)]
            p = f"{paired_randomization([got[q] for q in ref], [ref[q] for q in ref]):.3f}"
            passage = backend.split(" ")[0]
            cosine = f"{cos[spec][passage]:.4f} / {cos[spec][passage + ' min']:.4f}" if passage in cos[spec] else "1"
            verdict = "" if delta >= -FLOOR else f" (over the {FLOOR} floor)"
        lines.append(f"| {spec} | {backend} | {metrics['ndcg@10']:.4f} | {delta:+.4f}{verdict} | {p} | "
                     f"{metrics['recall@100']:.4f} | {metrics['mrr@10']:.4f} | {cosine} | {seconds:.0f} |")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
