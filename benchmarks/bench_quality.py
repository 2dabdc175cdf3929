"""Retrieval quality benchmark: BM25, the base model and trained DPR towers, each section in one run.

Needs ../shared/data beside the repo (exits with a message without it). Sections (``--sections``, default all):

- ``scifact``: train on BEIR SciFact train (100 train queries held out as dev, hyper-parameters chosen there),
  evaluate BM25 / base / trained on the 300 test queries. Floor: trained nDCG@10 >= 0.70 and above BM25 and base.
- ``squad``: SQuAD v1.1 dev, deterministic article split; train on (a capped sample of) the train articles'
  questions with answer-free BM25 negatives, report top-k answer accuracy on the test articles.
- ``selfsup``: no labels: ICT + title pairs from the SciFact corpus; SciFact test nDCG@10 vs the base model.
  Floor: at least the base model's.
- ``zeroshot``: Cranfield and CISI: BM25, base, and the SciFact-trained towers, zero-shot.

Dense systems are evaluated through the real store (temporary embedded collection, product ingest and query).
``--<section>-model NAME`` reuses an already trained model (under ``--data-dir``/models) instead of training.
Results accumulate in ``benchmarks/results/quality/quality.json`` (one key per section), and
``benchmarks/results/quality/quality.md`` is regenerated from it after every section, so sections can run separately.

Usage: ``.venv/bin/python benchmarks/bench_quality.py --data-dir /tmp/dpr-bench [--sections scifact,zeroshot]``
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from machine import script  # benchmarks/ is sys.path[0]

REPO = script()


from services.core.settings import Settings  # noqa: E402
from services.lab.evaluation.retrieval import EvalReport, write_report  # noqa: E402
from services.lab.evaluation.store_retriever import compare_systems  # noqa: E402
from services.lab.shared.mining import MiningConfig  # noqa: E402
from services.lab.towers.recipe import TrainingData, train_model  # noqa: E402
from services.lab.towers.trainer import TrainConfig  # noqa: E402
from services.readers import load_beir, load_squad  # noqa: E402

DATA = REPO.parent / "shared" / "data"
RESULTS = REPO / "benchmarks" / "results" / "quality"
SECTIONS = ("scifact", "squad", "selfsup", "zeroshot")
CACHE: Path | None = None  # --data-dir/eval-cache: base-model retrievals reused across runs (same fingerprint)

# The recipe (defaults of `dpr train`); see the SciFact section's notes for how it was chosen.
RECIPE = dict(
    shared=False, epochs=4.0, batch_size=32, mini_batch_size=0, learning_rate=3e-5, warmup_ratio=0.1,
    train_passage_tokens=128, seed=42,
)  # fmt: skip
MINING = MiningConfig(num_negatives=1, rank_start=0, rank_end=30)

log = logging.getLogger("bench_quality")


def _progress(step: int, total: int, loss: float | None) -> None:
    if step % 5 == 0 or step == total:
        print(f"  step {step}/{total} loss {loss if loss is None else round(loss, 4)}", flush=True)


def _train(
    settings: Settings, data: TrainingData, name: str, **hyper: Any
) -> tuple[str, dict[str, Any]]:
    """`dpr train`'s recipe (``services.lab.towers.recipe``) with ``RECIPE`` and ``hyper`` as hyper-parameters."""
    config = TrainConfig(name=name, **{**RECIPE, **hyper})  # type: ignore[arg-type]
    t0 = time.perf_counter()
    result = train_model(settings, data, config, progress=_progress)
    info = {"model": result.name, "pairs": result.card["training_data"].get("pairs"),
            "train_wall_s": round(time.perf_counter() - t0), "dev": result.card.get("dev_metrics"),
            "hyperparameters": result.card["hyperparameters"]}  # fmt: skip
    return result.name, info


def _card_summary(settings: Settings, model: str) -> dict[str, Any]:
    """What an already trained model's card says about its training (for models passed with --*-model)."""
    from encoders.towers import read_model_card, resolve_model_path

    path, name = resolve_model_path(model, settings.models_dir)
    card = read_model_card(path)
    keys = ("name", "towers", "training_data", "hyperparameters", "train_seconds", "steps", "dev_metrics")
    return {"model": name, **{k: card.get(k) for k in keys}}


def _report(report: EvalReport, section: str, sub: str = "") -> dict[str, Any]:
    # The trained model runs first (the base model's retrieval may come from the cache a --warm-base run is
    # filling); tables read bm25, base, trained.
    order = {"bm25": 0, "base": 1}
    report.results.sort(key=lambda r: order.get(r.system, 2))
    print(f"\n{report.dataset}: {report.queries} queries, {report.documents} documents")
    print(report.to_markdown_table(), flush=True)
    write_report(report, RESULTS / (section + (f"-{sub}" if sub else "")))
    return report.to_json()


def section_scifact(settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    model = args.scifact_model
    if model is None:
        data = TrainingData(DATA / "beir-scifact", split="train", seed=0, mining=MINING)
        model, out["training"] = _train(settings, data, "scifact")
    else:
        out["training"] = _card_summary(settings, model)
    test = load_beir(DATA / "beir-scifact", "test")
    report = compare_systems(test, settings=settings, models=[model, "base"], cache_dir=CACHE)
    out["test"] = _report(report, "scifact")
    m = {r.system: r.metrics["ndcg@10"] for r in report.results}
    trained = m[f"trained:{model}"]
    out["floor"] = {
        "trained_ndcg@10": trained, "bm25": m["bm25"], "base": m["base"],
        "pass": trained >= 0.70 and trained > m["bm25"] and trained > m["base"],
    }  # fmt: skip
    print(f"floor: trained nDCG@10 {trained:.3f} >= 0.70 and > BM25 {m['bm25']:.3f} and > base {m['base']:.3f}: "
          f"{'PASS' if out['floor']['pass'] else 'FAIL'}")  # fmt: skip
    return out


def section_squad(settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    path = DATA / "squad-v1.1-dev" / "dev-v1.1.json.gz"
    model = args.squad_model
    if model is None:
        data = TrainingData(path, split="train", max_pairs=args.squad_pairs, seed=0, mining=MINING)
        model, out["training"] = _train(settings, data, "squad", epochs=1.0)
    test = load_squad(path, "test")
    report = compare_systems(test, settings=settings, models=[model, "base"], cache_dir=CACHE)
    out["test"] = _report(report, "squad")
    return out


def section_selfsup(settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    model = args.selfsup_model
    if model is None:
        mining = MiningConfig(num_negatives=args.selfsup_negatives, rank_start=0, rank_end=30)
        data = TrainingData(
            DATA / "beir-scifact", self_supervised="both", max_pairs=args.selfsup_pairs, seed=0, mining=mining
        )
        model, out["training"] = _train(settings, data, "scifact-selfsup", epochs=1.0, learning_rate=1e-5)
        out["training"]["hard_negatives"] = args.selfsup_negatives
    test = load_beir(DATA / "beir-scifact", "test")
    report = compare_systems(test, settings=settings, models=[model, "base"], bm25=True, cache_dir=CACHE)
    out["test"] = _report(report, "selfsup")
    m = {r.system: r.metrics["ndcg@10"] for r in report.results}
    out["floor"] = {"selfsup": m[f"trained:{model}"], "base": m["base"], "pass": m[f"trained:{model}"] >= m["base"]}
    print(f"floor: self-supervised nDCG@10 {m[f'trained:{model}']:.3f} >= base {m['base']:.3f}: "
          f"{'PASS' if out['floor']['pass'] else 'FAIL'}")  # fmt: skip
    return out


def section_zeroshot(settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    if args.scifact_model is None:
        raise SystemExit("zeroshot needs --scifact-model NAME (the SciFact-trained towers)")
    out: dict[str, Any] = {}
    for name in ("cranfield", "cisi"):
        ds = load_beir(DATA / name, "test")
        report = compare_systems(ds, settings=settings, models=[args.scifact_model, "base"], cache_dir=CACHE)
        out[name] = _report(report, "zeroshot", name)
    return out


def warm_base(settings: Settings) -> None:
    """The base model on every test set, through the store, into the cache (no section is written)."""
    sets = [
        load_beir(DATA / "beir-scifact", "test"),
        load_beir(DATA / "cranfield", "test"),
        load_beir(DATA / "cisi", "test"),
        load_squad(DATA / "squad-v1.1-dev" / "dev-v1.1.json.gz", "test"),
    ]
    for ds in sets:
        report = compare_systems(ds, settings=settings, models=["base"], cache_dir=CACHE)
        print(f"\n{report.dataset}\n{report.to_markdown_table()}", flush=True)


def render_markdown(results: dict[str, Any]) -> str:
    lines = ["# Retrieval quality (benchmarks/bench_quality.py)", ""]
    lines.append("Dense systems are evaluated through the real store: the corpus is ingested into a temporary embedded")
    lines.append("collection (chunked by the passage tower) and queried with the product's query path; chunk hits")
    lines.append("are aggregated to documents by max score. BM25: bm25s, English stopwords, Snowball stemming.")
    lines.append("Metrics: nDCG@10 with linear gains (as trec_eval), SQuAD-normalised answer accuracy.")
    lines.append("A system whose seconds read ~0 reused a cached retrieval (`--data-dir`/eval-cache, keyed by dataset,")
    lines.append("tower fingerprint, chunk settings and k): same towers, same corpus, same store path, measured in an")
    lines.append("earlier run on this machine (`--warm-base`). Wall times are from a machine shared with other work.")
    lines.append("")
    for section in SECTIONS:
        if section not in results:
            continue
        res = results[section]
        lines += [f"## {section}", "", f"run at {res.get('ran_at', '?')}, {res.get('wall_s', '?')} s", ""]
        tables = [res["test"]] if "test" in res else [res[k] for k in ("cranfield", "cisi") if k in res]
        for t in tables:
            lines.append(f"**{t['dataset']}**: {t['queries']} queries, {t['documents']} documents")
            lines.append("")
            names: list[str] = []
            for sys_res in t["systems"].values():
                names += [m for m in sys_res["metrics"] if m not in names]
            lines.append("| system | " + " | ".join(names) + " | seconds |")
            lines.append("|---|" + "---|" * (len(names) + 1))
            for system, sys_res in t["systems"].items():
                vals = " | ".join(f"{sys_res['metrics'][n]:.3f}" for n in names)
                lines.append(f"| {system} | {vals} | {sys_res['seconds']} |")
            lines.append("")
        for note in res.get("notes", []):
            lines += [f"- {note}", ""]
        if "floor" in res:
            lines += [f"Floor: `{json.dumps(res['floor'])}`", ""]
        if "training" in res:
            lines += [f"Training: `{json.dumps(res['training'], default=str)}`", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/dpr-bench"))
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--scifact-model")
    parser.add_argument("--squad-model")
    parser.add_argument("--selfsup-model")
    parser.add_argument("--squad-pairs", type=int, default=1000, help="Cap on SQuAD training questions.")
    parser.add_argument(
        "--warm-base", action="store_true", help="Only evaluate the base model (fills the cache) on every test set."
    )
    parser.add_argument("--selfsup-pairs", type=int, default=1000, help="Cap on self-supervised pairs.")
    parser.add_argument("--selfsup-negatives", type=int, default=0, help="BM25 negatives per self-supervised pair.")
    args = parser.parse_args()
    if not DATA.is_dir():
        raise SystemExit(f"needs ../shared/data beside the repo ({DATA} is missing)")
    logging.basicConfig(level=logging.WARNING)
    settings = Settings(data_dir=args.data_dir)
    global CACHE
    CACHE = args.data_dir / "eval-cache"
    if args.warm_base:
        warm_base(settings)
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    store = RESULTS / "quality.json"
    for section in args.sections.split(","):
        if section not in SECTIONS:
            raise SystemExit(f"unknown section {section!r}; choose from {', '.join(SECTIONS)}")
        print(f"\n=== {section} ===", flush=True)
        t0 = time.perf_counter()
        res = globals()[f"section_{section}"](settings, args)
        res["ran_at"] = datetime.now(UTC).isoformat(timespec="seconds")
        res["wall_s"] = round(time.perf_counter() - t0)
        results = json.loads(store.read_text()) if store.is_file() else {}  # another run may have added sections
        results[section] = res
        if section == "scifact" and args.scifact_model is None:
            args.scifact_model = res["training"]["model"]
        store.write_text(json.dumps(results, indent=2, default=str) + "\n")
        (RESULTS / "quality.md").write_text(render_markdown(results))
    print(f"\nwrote {RESULTS / 'quality.md'}")


if __name__ == "__main__":
    main()
