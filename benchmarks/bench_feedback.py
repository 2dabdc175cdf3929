"""Learning from users' judgements (issue 41's feedback floor): do towers trained on 50 judged questions beat the
base on SciFact test?

What a team does, simulated with SciFact's train labels standing in for the users:
1. ``dpr ingest`` the SciFact corpus (5,183 abstracts) into a fresh data dir, with the base towers;
2. ``dpr serve`` on loopback; ``--questions`` train claims (never one of the 100 ``dpr train`` holds out for dev,
   never a test claim) are asked through ``POST /v1/search`` (top ``--hits``, dense), and each hit is judged
   through ``POST /v1/feedback``: relevant when the train qrels list its document, else not relevant, as a user
   pressing the console's buttons would;
3. ``dpr train --feedback`` (the judgements are the only training data: no dev split, so the single
   fine-tune), timed with ``/usr/bin/time``; or, with ``--learn adapt``, ``dpr adapt SCIFACT --feedback`` (the
   corpus's pseudo-questions plus the judgements; a held-out share of the judged questions chooses the model);
4. ``dpr eval SCIFACT --split test --model FB --mode dense``: base and the feedback-trained towers through the
   store, SciFact test read once, with the paired randomization test ``dpr eval`` reports.

Usage::

    nice -n 10 .venv/bin/python benchmarks/bench_feedback.py --out benchmarks/results/quality/feedback.md
    .venv/bin/python benchmarks/bench_feedback.py --learn adapt --out benchmarks/results/quality/feedback-adapt.md
    .venv/bin/python benchmarks/bench_feedback.py --questions 5 --max-docs 300 --smoke   # a trial, no test read

Needs ``../shared/data/beir-scifact`` and GNU ``/usr/bin/time``; about 20-40 min on 2 cores (the ingest and the
two evaluations' ingests dominate).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from machine import commit, machine_line, script  # benchmarks/ is sys.path[0]

REPO = script()
from serve_process import DPR, ServeProcess  # noqa: E402

from encoders.data import split_dev_queries  # noqa: E402

SCIFACT = REPO.parent / "shared" / "data" / "beir-scifact"
N_DEV = 100  # what `dpr train` holds out of the train split (its --dev-queries default)


def train_labels(folder: Path) -> tuple[dict[str, str], dict[str, set[str]]]:
    """Train claims (id -> text) outside the dev hold-out, and their relevant document ids."""
    qrels: dict[str, set[str]] = {}
    with open(folder / "qrels" / "train.tsv", encoding="utf-8") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            if int(row["score"]) > 0:
                qrels.setdefault(row["query-id"], set()).add(row["corpus-id"])
    kept, _dev = split_dev_queries(sorted(qrels), N_DEV)
    texts = {}
    with open(folder / "queries.jsonl", encoding="utf-8") as f:
        for line in f:
            q = json.loads(line)
            if q["_id"] in kept:
                texts[q["_id"]] = q["text"]
    return texts, {q: qrels[q] for q in texts}


def small_corpus(folder: Path, dest: Path, max_docs: int, wanted: set[str]) -> Path:
    """A BEIR folder with the first ``max_docs`` documents plus every one ``wanted`` names (a trial's corpus)."""
    dest.mkdir(parents=True, exist_ok=True)
    with gzip.open(folder / "corpus.jsonl.gz", "rt", encoding="utf-8") as f, \
            open(dest / "corpus.jsonl", "w", encoding="utf-8") as out:
        for n, line in enumerate(f):
            if n < max_docs or json.loads(line)["_id"] in wanted:
                out.write(line)
    (dest / "queries.jsonl").write_bytes((folder / "queries.jsonl").read_bytes())
    (dest / "qrels").mkdir(exist_ok=True)
    for split in ("train.tsv", "test.tsv"):
        (dest / "qrels" / split).write_bytes((folder / "qrels" / split).read_bytes())
    return dest


def run(cmd: list[str], env: dict[str, str], timed: bool = False) -> tuple[dict[str, Any], dict[str, float]]:
    """Run a ``dpr ... --json`` command; its JSON and (``timed``) wall seconds and peak RSS MiB."""
    prefix = ["/usr/bin/time", "-f", "TIME %e %M"] if timed else []
    t0 = time.perf_counter()
    p = subprocess.run(prefix + cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    usage = {"wall_s": round(wall, 1)}
    for line in p.stderr.splitlines():
        if line.startswith("TIME "):
            _, _, rss = line.split()
            usage["peak_rss_mib"] = round(int(rss) / 1024, 1)
    return json.loads(p.stdout), usage


def judge(url: str, questions: dict[str, str], qrels: dict[str, set[str]], hits_per_q: int) -> dict[str, Any]:
    """Ask each question through the API and judge its hits as the labels say; counts of what was posted."""
    out = {"questions": 0, "judged": 0, "relevant": 0, "questions_with_a_relevant_hit": 0, "outcomes": {}}
    with httpx.Client(base_url=url, timeout=60) as http:
        for qid, text in questions.items():
            r = http.post("/v1/search", json={"question": text, "k": hits_per_q, "mode": "dense"})
            r.raise_for_status()
            found = False
            for hit in r.json()["hits"]:
                relevant = hit["doc_id"] in qrels[qid]
                found |= relevant
                f = http.post("/v1/feedback", json={"question": text, "doc_id": hit["doc_id"],
                                                    "chunk": hit["chunk_index"], "relevant": relevant})
                f.raise_for_status()
                outcome = f.json()["outcome"]
                out["outcomes"][outcome] = out["outcomes"].get(outcome, 0) + 1
                out["judged"] += 1
                out["relevant"] += relevant
            out["questions"] += 1
            out["questions_with_a_relevant_hit"] += found
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", type=int, default=50, help="train claims judged through the API")
    ap.add_argument("--hits", type=int, default=5, help="hits judged per question")
    ap.add_argument("--seed", type=int, default=0, help="which train claims are asked")
    ap.add_argument("--max-docs", type=int, default=0, help="a trial: the first N documents (+ the judged ones)")
    ap.add_argument("--smoke", action="store_true", help="a trial: evaluate on 20 train claims, never on test")
    ap.add_argument("--learn", choices=("train", "adapt"), default="train",
                    help="dpr train --feedback (default) or dpr adapt CORPUS --feedback")
    ap.add_argument("--data-dir", type=Path, help="default: a temporary one")
    ap.add_argument("--out", type=Path, help="write the markdown here")
    args = ap.parse_args()
    if not SCIFACT.is_dir():
        print(f"needs {SCIFACT} (BEIR SciFact); not found", file=sys.stderr)
        return 2
    machine, at = machine_line(), commit()
    print(machine, flush=True)
    texts, qrels = train_labels(SCIFACT)
    asked_ids = sorted(random.Random(args.seed).sample(sorted(texts), args.questions))
    asked = {q: texts[q] for q in asked_ids}
    with tempfile.TemporaryDirectory(prefix="bench-feedback-") as tmp:
        data_dir = args.data_dir or Path(tmp) / "data"
        corpus = SCIFACT
        if args.max_docs:
            corpus = small_corpus(SCIFACT, Path(tmp) / "beir", args.max_docs, set().union(*qrels.values()))
        env = {k: v for k, v in os.environ.items() if not k.startswith("DPR_")}
        env |= {"DPR_DATA_DIR": str(data_dir), "HF_HUB_OFFLINE": "1"}
        steps: dict[str, Any] = {}
        ingest, steps["ingest"] = run([DPR, "ingest", str(corpus), "--json"], env, timed=True)
        print(f"ingested: {ingest.get('chunks')} passages ({steps['ingest']})", flush=True)
        server = ServeProcess(env, Path(tmp) / "serve.log")
        try:
            server.wait_ready()
            t0 = time.perf_counter()
            judged = judge(server.url, asked, qrels, args.hits)
            judged["seconds"] = round(time.perf_counter() - t0, 1)
        finally:
            server.stop()
        print(f"judged: {judged}", flush=True)
        listed, _ = run([DPR, "feedback", "list", "--json"], env)
        learn = ([DPR, "adapt", str(corpus), "--feedback", "--name", "fba", "--json"] if args.learn == "adapt"
                 else [DPR, "train", "--feedback", "--name", "fb", "--json"])
        trained, steps["train"] = run(learn, env, timed=True)
        print(f"trained: {trained.get('model')} ({steps['train']})", flush=True)
        split = ["--split", "train", "--max-queries", "20"] if args.smoke else ["--split", "test"]
        evaluated, steps["eval"] = run([DPR, "eval", str(corpus), *split, "--model", trained["model"], "--mode",
                                        "dense", "--json"], env, timed=True)
    record = {"machine": machine, "commit": at, "args": {k: str(v) for k, v in vars(args).items()},
              "asked": asked_ids, "judged": judged, "feedback": listed.get("counts", listed.get("summary")),
              "ingest": {k: ingest.get(k) for k in ("documents", "chunks", "seconds")},
              "train": {"model": trained.get("model"), **{k: v for k, v in (trained.get("card") or {}).items()
                                                          if isinstance(v, (int, float, str))}},
              "steps": steps, "eval": evaluated,
              "adaptation": (trained.get("card") or {}).get("adaptation")}
    text = report(record, args)
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
        args.out.with_suffix(".json").write_text(json.dumps(record, indent=1, default=str), encoding="utf-8")
    return 0


def _metrics(evaluated: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(system, metrics) rows of a ``dpr eval --json`` document, whatever its nesting."""
    systems = evaluated.get("systems") or evaluated.get("results") or {}
    if isinstance(systems, dict):
        return [(name, m) for name, m in systems.items() if isinstance(m, dict)]
    return [(s.get("name", "?"), s) for s in systems if isinstance(s, dict)]


def learn_command(args: argparse.Namespace) -> str:
    return "dpr adapt SCIFACT --feedback" if args.learn == "adapt" else "dpr train --feedback --rounds 0"


def adaptation_lines(adaptation: dict[str, Any] | None) -> list[str]:
    """`dpr adapt`'s own dev figures (held-out pseudo-questions and judged questions) and what it chose."""
    if not adaptation:
        return []
    dev = adaptation["dev"]
    kinds = list(dev["queries"])
    lines = ["", f"`dpr adapt`'s dev (nDCG@10, held out; the gate: {' + '.join(dev.get('gate') or kinds)}; "
                 f"chosen: {adaptation['chosen']}, gain {dev['gain']:+.4f}, activates on a gain: "
                 f"{adaptation['gain_on_dev']}); judgements: {adaptation.get('feedback')}", "",
             "| candidate | " + " | ".join(f"{k} ({dev['queries'][k]} q)" for k in kinds) + " |",
             "|---|" + "---:|" * len(kinds)]
    for key, row in dev["scores"].items():
        lines.append(f"| {key} | " + " | ".join(f"{row.get(k, float('nan')):.4f}" for k in kinds) + " |")
    lines += ["", f"Stage seconds: {adaptation.get('stage_seconds')}; peak RSS {adaptation.get('peak_rss_mib')} MiB."]
    return lines


def report(record: dict[str, Any], args: argparse.Namespace) -> str:
    j, s = record["judged"], record["steps"]
    lines = [
        "# Feedback: towers trained on users' judgements (issue 41)" if args.learn == "train" else
        "# `dpr adapt --feedback`: pseudo-questions plus users' judgements, the held-out judged questions choosing",
        "",
        f"Machine: {record['machine']}.",
        f"Command: `benchmarks/bench_feedback.py --questions {args.questions} --hits {args.hits} --seed {args.seed}"
        + (f" --max-docs {args.max_docs}" if args.max_docs else "") + (" --smoke" if args.smoke else "")
        + (" --learn adapt" if args.learn == "adapt" else "") + "`",
        "",
        f"- Judged through the API: {j['questions']} SciFact train claims (none of `dpr train`'s 100 dev claims), "
        f"{j['judged']} hits ({args.hits} each), {j['relevant']} relevant; {j['questions_with_a_relevant_hit']} "
        f"questions had a relevant hit in their top {args.hits} (only those give a training pair). "
        f"{j['seconds']} s for the searches and judgements.",
        f"- Ingest of the corpus ({record['ingest']['documents']} documents, {record['ingest']['chunks']} passages): "
        f"{s['ingest']}. `{learn_command(args)}`: {s['train']} "
        f"({record['train']}). Evaluation: {s['eval']}.",
        "",
        "| system | " + ("SciFact train, 20 claims (smoke)" if args.smoke else "SciFact test") + " nDCG@10 | MRR@10 | "
        "recall@100 | vs base: nDCG@10 difference, p |",
        "|---|---:|---:|---:|---|",
    ]
    significance = record["eval"].get("significance") or {}
    for name, m in _metrics(record["eval"]):
        cells = [m.get(k, m.get("metrics", {}).get(k)) for k in ("ndcg@10", "mrr@10", "recall@100")]
        versus = significance.get(name, {}).get("base")
        paired = f"{versus['delta']:+.4f}, p {versus['p']:.4f}" if versus else ""
        lines.append(f"| {name} | " + " | ".join(f"{c:.4f}" if isinstance(c, float) else str(c) for c in cells)
                     + f" | {paired} |")
    lines += adaptation_lines(record.get("adaptation"))
    lines += ["", "p: `dpr eval`'s paired randomization test (10,000 sign flips of the per-query differences). "
              "Raw: the `.json` beside this file (`dpr eval --json` as printed)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
