"""KorQuAD v1.0 dev as a Korean retrieval benchmark, measured with `dpr eval` on the TEST articles.

Needs ../shared/data/korquad-v1.0-dev beside the repo (the official dev file; see its SOURCE.md). Passage =
paragraph, qrel = the question's own paragraph, answer@k = a gold answer inside a retrieved passage (Korean
matching: ``services.lab.shared.metrics.has_answer``). The article split is ``services.readers.squad`` (sha256 of the
title, half the articles test); dev questions for any choice are carved from the TRAIN articles
(``services.readers.load_dev_split``, the ``dpr train`` / ``dpr tune-hybrid`` seed).

Systems, each one `dpr eval ... --format squad --split test --json` run (the command lines are printed):

- always: BM25 with Korean morphemes (``--language ko``) and BM25 with the English tokenisation
  (``--language en``: what every collection got before languages) -- the point of Korean BM25;
- ``--model NAME`` (repeat): dense towers through the real store (``base`` = all-MiniLM-L6-v2, ``multilingual``
  = multilingual-e5-small, a trained model's name or path);
- ``--train BASE`` (repeat): `dpr train DATA --format squad --split train --base BASE` first (extra flags with
  ``--train-args``), wall time and the children's peak RSS recorded, then evaluated like ``--model``;
- ``--hybrid NAME`` (repeat; a ``--model``/``--train`` name, or ``trained:BASE`` for the model ``--train BASE``
  made): fusion tuned on ``--dev-queries`` dev questions of the train articles (``services.lab.hybrid.tuning``, through
  a temporary store with Korean BM25), then `dpr eval --mode hybrid` on test with the chosen fusion.

Also printed: the split counts, the Hangul share that ``services.ingest.language`` detects on (KorQuAD vs English
corpora), the gold-paragraph answer rate under the English-only and the Korean answer matching, machine, commit,
load average. Writes ``benchmarks/results/quality/korquad.md`` (+ ``korquad.json``).

Usage: ``.venv/bin/python benchmarks/bench_korquad.py [--model base] [--train multilingual --train-args "--recipe FILE"]
[--hybrid trained:multilingual]``
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from machine import machine, script  # benchmarks/ is sys.path[0]

REPO = script()


SHARED = next((p / "shared" / "data" for p in REPO.parents if (p / "shared" / "data").is_dir()), REPO.parent / "shared")
DATA = SHARED / "korquad-v1.0-dev" / "KorQuAD_v1.0_dev.json.gz"
ENGLISH = {"SciFact": SHARED / "beir-scifact", "SQuAD": SHARED / "squad-v1.1-dev"}
RESULTS = REPO / "benchmarks" / "results" / "quality"
COLUMNS = ("answer@1", "answer@5", "answer@20", "answer@100", "mrr@10", "ndcg@10")
DPR = [sys.executable, "-c", "from entrypoints.cli.main import main; main()"]


def say(msg: str) -> None:
    print(f"[{datetime.now(UTC).strftime('%H:%M:%S')}] {msg}", flush=True)


def dpr(args: list[str], env: dict[str, str]) -> tuple[dict[str, Any], float]:
    """One `dpr` command in a child process (this checkout's code); its --json output and wall seconds."""
    say("$ dpr " + shlex.join(args))
    t0 = time.perf_counter()
    done = subprocess.run([*DPR, *args], capture_output=True, text=True, env=env, cwd=REPO)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"dpr {shlex.join(args)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1]), seconds


def data_facts(data: Path) -> dict[str, Any]:
    """Split counts, Hangul shares and the gold-paragraph answer rate under both answer matchings."""
    from services.ingest.language import hangul_share
    from services.lab.shared.metrics import has_answer, normalize_answer
    from services.readers import load_beir, load_dev_split, load_squad

    facts: dict[str, Any] = {"splits": {}, "hangul_share": {}}
    for split in ("all", "train", "test"):
        ds = load_squad(data, split)  # type: ignore[arg-type]
        facts["splits"][split] = {"articles": len({d.rsplit("#", 1)[0] for d in ds.corpus}),
                                  "paragraphs": len(ds.corpus), "questions": len(ds.queries)}
    train, test = load_squad(data, "train"), load_squad(data, "test")
    if set(train.corpus) & set(test.corpus):
        raise SystemExit("train and test articles share a paragraph: the article split is broken")
    dev = load_dev_split(data, "train", "squad", 100)
    facts["splits"]["dev (carved from train)"] = {"articles": "-", "paragraphs": len(dev.corpus),
                                                  "questions": len(dev.queries)}
    full = load_squad(data, "all")
    facts["hangul_share"]["KorQuAD"] = hangul_share(d.passage for d in full.corpus.values())
    for name, path in ENGLISH.items():
        if path.is_dir():
            corpus = load_beir(path, "test").corpus if name == "SciFact" else load_squad(
                next(path.glob("*.json*")), "all").corpus
            facts["hangul_share"][name] = hangul_share(d.passage for d in corpus.values())
    english_rule = sum(any(f" {normalize_answer(a)} " in f" {normalize_answer(full.corpus[next(iter(r))].passage)} "
                           for a in full.answers[q]) for q, r in full.qrels.items())
    korean_rule = sum(has_answer(full.corpus[next(iter(r))].passage, full.answers[q]) for q, r in full.qrels.items())
    facts["gold_answer_rate"] = {"SQuAD whole-token rule": english_rule / len(full.qrels),
                                 "has_answer (Korean-aware)": korean_rule / len(full.qrels)}
    return facts


def shown(data: Path) -> str:
    """``../shared/data/...`` as the README writes it, for the default data; else the path given."""
    return "../shared/data/korquad-v1.0-dev" if data == DATA else str(data)


def evaluate(data: Path, extra: list[str], env: dict[str, str]) -> tuple[dict[str, Any], float]:
    return dpr(["eval", str(data), "--format", "squad", "--split", "test", "--json", *extra], env)


def model_system(data: Path, name: str, env: dict[str, str]) -> dict[str, Any]:
    """A dense model through the store; ``base`` means the base model alone."""
    flags = ["--model", "base"] if name == "base" else ["--model", name, "--no-base"]
    out, seconds = evaluate(data, flags, env)
    systems = {k: v for k, v in out["systems"].items() if k != "bm25"}
    (label, result), = systems.items()
    return {"system": f"dense {name}", "metrics": result["metrics"], "seconds": seconds, "label": label}


def train_system(data: Path, base: str, train_args: list[str], env: dict[str, str]) -> dict[str, Any]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    out, seconds = dpr(["train", str(data), "--format", "squad", "--split", "train", "--base", base,
                        "--name", f"korquad-{base}", "--json", *train_args], env)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"model": out["model"], "train_seconds": seconds,
            "train_peak_rss_mib": peak / 1024 if peak > before else None, "card": out.get("card", {})}


def tune(data: Path, name: str, settings: Any, dev_queries: int) -> Any:
    """Fusion chosen on dev questions of the train articles (never test), through a temporary Korean store."""
    from services.lab.evaluation.store_retriever import StoreCorpus, _served_towers
    from services.lab.hybrid.tuning import tune_on_corpus
    from services.readers import load_dev_split

    dev = load_dev_split(data, "train", "squad", dev_queries)
    towers = _served_towers(settings, name)  # the backends `dpr eval` serves it on (DPR_ENCODER__BACKEND)
    corpus = StoreCorpus(towers, settings=settings, collection="tune")  # language detected: ko
    try:
        return tune_on_corpus(corpus, dev), corpus.language
    finally:
        corpus.close()


def hybrid_system(data: Path, name: str, settings: Any, dev_queries: int, env: dict[str, str]) -> dict[str, Any]:
    result, language = tune(data, name, settings, dev_queries)
    c = result.choice
    fusion = ["--fusion", c.fusion, "--rrf-k", str(c.rrf_k), "--weight", str(c.linear_weight)]
    out, seconds = evaluate(data, ["--model", name, "--no-base", "--mode", "hybrid", *fusion], env)
    (label, res), = ((k, v) for k, v in out["systems"].items() if k.endswith("+hybrid"))
    return {"system": f"hybrid {name} ({c.label()}, tuned on {result.tuned_on.get('queries')} dev questions, "
            f"{language} BM25)", "metrics": res["metrics"], "seconds": seconds, "label": label}


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| system | " + " | ".join(COLUMNS) + " | s |", "|---|" + "---:|" * (len(COLUMNS) + 1)]
    for r in rows:
        m = r["metrics"]
        lines.append(f"| {r['system']} | " + " | ".join(f"{m.get(c, float('nan')):.3f}" for c in COLUMNS)
                     + f" | {r['seconds']:.0f} |")
    return "\n".join(lines)


def report(facts: dict[str, Any], rows: list[dict[str, Any]], trained: list[dict[str, Any]], env_info: dict[str, Any],
           commands: list[str]) -> str:
    split_lines = ["| split | articles | paragraphs | questions |", "|---|---:|---:|---:|"]
    split_lines += [f"| {k} | {v['articles']} | {v['paragraphs']} | {v['questions']} |"
                    for k, v in facts["splits"].items()]
    shares = ", ".join(f"{k} {v:.3f}" for k, v in facts["hangul_share"].items())
    gold = ", ".join(f"{k} {v:.4f}" for k, v in facts["gold_answer_rate"].items())
    out = [
        "# KorQuAD v1.0 dev: Korean retrieval (`benchmarks/bench_korquad.py`)",
        "",
        f"Machine: {env_info['cpu']} ({env_info['flags'].replace(' ', ', ')}; {env_info['cores']} usable cores), "
        f"commit {env_info['commit']}, load average {' / '.join(f'{x:.1f}' for x in env_info['load'])} (1/5/15 min) "
        f"at the end, "
        f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}.",
        "",
        "## Data",
        *split_lines,
        "",
        f"Train and test articles share no paragraph (checked). Hangul share of letters (`services.ingest.language`, "
        f"threshold 0.3 -> ko): {shares}. A question's own paragraph contains its gold answer: {gold}.",
        "",
        "## Test articles (`dpr eval ... --format squad --split test`)",
        table(rows),
        "",
    ]
    for t in trained:
        rss = f"{t['train_peak_rss_mib']:.0f} MiB" if t["train_peak_rss_mib"] else "n/a"
        out.append(f"- trained `{t['model']}`: {t['train_seconds']:.0f} s wall, peak RSS {rss}")
    out += ["", "Commands:", "```", *commands, "```", ""]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--model", action="append", default=[], help="dense towers to evaluate (repeat)")
    parser.add_argument("--train", action="append", default=[], help="train one model on this base (repeat)")
    parser.add_argument("--train-args", default="", help="extra `dpr train` flags, e.g. '--recipe one-epoch.toml'")
    parser.add_argument("--hybrid", action="append", default=[], help="model name or trained:BASE (repeat)")
    parser.add_argument("--dev-queries", type=int, default=100)
    parser.add_argument("--data-dir", type=Path, default=None, help="DPR_DATA_DIR (models live here)")
    args = parser.parse_args()
    if not args.data.is_file():
        raise SystemExit(f"{args.data}: not found; this benchmark needs ../shared/data/korquad-v1.0-dev")

    from services.core.settings import Settings

    data_dir = args.data_dir or Path(os.environ.get("DPR_DATA_DIR") or REPO / ".dpr-bench-korquad")
    env = {**os.environ, "PYTHONPATH": str(REPO), "DPR_DATA_DIR": str(data_dir)}
    settings = Settings(data_dir=data_dir)
    commands: list[str] = []
    facts = data_facts(args.data)
    say(json.dumps(facts, ensure_ascii=False))
    rows: list[dict[str, Any]] = []
    for language in ("ko", "en"):
        out, seconds = evaluate(args.data, ["--bm25", "--language", language], env)
        commands.append(f"dpr eval {shown(args.data)} --format squad --split test --bm25 --language {language}")
        rows.append({"system": f"BM25 ({language} tokenisation)", "metrics": out["systems"]["bm25"]["metrics"],
                     "seconds": seconds})
    trained, names = [], {}
    for base in args.train:
        t = train_system(args.data, base, shlex.split(args.train_args), env)
        commands.append(f"dpr train {shown(args.data)} --format squad --split train --base {base} {args.train_args}")
        trained.append(t)
        names[f"trained:{base}"] = t["model"]
    for name in [*args.model, *(t["model"] for t in trained)]:
        rows.append(model_system(args.data, name, env))
        commands.append(f"dpr eval {shown(args.data)} --format squad --split test --model {name}")
    for name in args.hybrid:
        rows.append(hybrid_system(args.data, names.get(name, name), settings, args.dev_queries, env))
        commands.append(f"dpr eval {shown(args.data)} --format squad --split test --model {names.get(name, name)} "
                        "--mode hybrid --fusion ... (tuned on the dev split)")
    print(table(rows))
    md = report(facts, rows, trained, machine(), commands)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "korquad.md").write_text(md)
    (RESULTS / "korquad.json").write_text(json.dumps({"facts": facts, "rows": rows, "trained": trained},
                                                     ensure_ascii=False, indent=1, default=str))
    say(f"wrote {RESULTS / 'korquad.md'}")


if __name__ == "__main__":
    main()
