"""What each training recipe gives (issue 16's runs) in one report: ``results/quality/training-recipes.md`` from the
raw result JSON files committed beside it (and the distillation experiment's, beside its script in research/).

Nothing is measured and no figure is typed in: every number is read from a JSON file and every table row names its
file (and the system key in it); the issue's floors are the only constants. Per dataset, each system with the
training stage behind it (seconds, peak RSS) where its file records one; reranker latency; dev-only runs.
Usage: ``python benchmarks/report_recipes.py`` (stdlib only).
"""

from __future__ import annotations

import json
import math
import operator
from functools import cache, reduce
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "quality"
DISTILL = "research/distillation/results/scifact-dev.json"  # an experiment's results live beside its script
OUT = RESULTS / "training-recipes.md"
# The floors: SciFact test nDCG@10; zero-shot margin under base; SQuAD answer@5 (half the gap 0.914 -> 0.955)
SCIFACT_TOWERS, SCIFACT_HYBRID, SCIFACT_RERANK, ZEROSHOT_MARGIN, SQUAD_ANSWER5 = 0.76, 0.79, 0.80, 0.01, 0.9345
SCI = ("ndcg@10", "recall@100", "mrr@10")
WHOLE = ",.0f"  # seconds, MiB, milliseconds
# the reranked hybrid the goal is checked on: the reranker strongest alone on `scipa2`'s dev top 20 whose run read
# the test split (none gains over hybrid on dev: RERANKED_HYBRID_DEV)
RERANKED_HYBRID = "scifact-reranker-over-hybrid-4ep.json"
SQ = ("answer@1", "answer@5", "answer@20", "ndcg@10", "recall@100", "mrr@10")
Row = list[str]
used: list[str] = []  # every file read, for the report's header


@cache
def load(name: str) -> Any:
    used.append(name)
    return json.loads((REPO / name if name.startswith("research/") else RESULTS / name).read_text())


def at(name: str, *path: str | int) -> Any:
    return reduce(operator.getitem, path, load(name))


def trained_key(systems: dict[str, Any]) -> str:
    """`dpr eval --json` names a trained model's system ``trained:NAME``; each of these files holds one."""
    return next(k for k in systems if k.startswith("trained:"))


def num(value: float | None, fmt: str = ".4f") -> str:
    return "" if value is None else format(value, fmt)


def src(name: str, key: str = "") -> str:
    return f"`{name}`" + (f": {key}" if key else "")


def cost(stages: list[dict[str, Any]]) -> Row:
    """Train seconds and peak RSS (MiB) of the stage(s) behind a row: `a + b` seconds, `a / b` MiB per stage."""
    return [" + ".join(num(s.get("train_seconds"), WHOLE) for s in stages),
            " / ".join(num(s.get("peak_rss_mib"), WHOLE) for s in stages)]


def table(headers: Row, rows: list[Row]) -> list[str]:
    align = ["---" if h in ("system", "source", "reranker", "first stage", "dataset") else "---:" for h in headers]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows] + [""]


def fusion(name: str, key: str) -> str:
    c = at(name, "dev", "hybrid_choice", key)
    return f"linear, weight {c['linear_weight']:g}" if c["fusion"] == "linear" else f"rrf k={c['rrf_k']}"


def scifact() -> list[Row]:
    q, a3, a4 = "scifact-towers.json", "scifact-towers-ance3.json", "scifact-towers-ance4.json"
    pt = "scifact-towers-ict-pretrain.json"
    p1, p2 = "scifact-towers-ict-ance1.json", "scifact-towers-ict-ance2.json"
    rr, rh, rc = "scifact-reranker.json", "scifact-reranker-over-hybrid.json", RERANKED_HYBRID
    r2, r3, r4 = "finetuned+ance", "finetuned+ance3", "finetuned+ance4"  # the towers' labels in the files
    k1, k2 = "pretrained+finetuned+ance1", "pretrained+finetuned+ance2"

    def row(label: str, name: str, key: str, stage: str = "", stages: list[Any] | None = None) -> Row:
        metrics = at(name, "test", "systems", key, "metrics")
        trained = stages or [at(name, "training", stage) if stage else {}]
        return [label, *(num(metrics.get(k)) for k in SCI), *cost(trained), src(name, key)]

    def reranked(name: str, label: str) -> Row:
        key = next(k for k in at(name, "test", "systems") if "+ rerank" in k)
        gate = "on" if at(name, "dev", "picked", "rerank_on") else "off"
        return row(f"{label} + reranker `{at(name, 'training', 'reranker', 'model')}` (dev gate: {gate})", name,
                   key, "reranker")

    return [row("BM25", q, "bm25"), row("base (all-MiniLM-L6-v2)", q, "base"),
            row("fine-tuned (BM25 negatives)", q, "finetuned", "finetuned"),
            row("pre-trained (ICT) + fine-tuned (`scipt`)", pt, trained_key(at(pt, "test", "systems")),
                stages=at(pt, "stages")),
            row("fine-tuned + mining round 2 (dense negatives from itself, denoised)", q, r2, r2),
            row("fine-tuned + mining round 3", a3, r3, r3),
            row("fine-tuned + mining round 4 (model lost)", a4, r4, r4),
            row("pre-trained + fine-tuned + round 1 (`scipa1`)", p1, k1, k1),
            row("pre-trained + fine-tuned + round 2 (`scipa2`)", p2, k2, k2),
            row(f"hybrid: round 2 + BM25 ({fusion(q, r2)})", q, f"hybrid ({r2})"),
            row(f"hybrid: round 3 + BM25 ({fusion(a3, r3)})", a3, f"hybrid ({r3})"),
            row(f"hybrid: round 4 + BM25 ({fusion(a4, r4)})", a4, f"hybrid ({r4})"),
            row(f"hybrid: `scipa1` + BM25 ({fusion(p1, k1)})", p1, f"hybrid ({k1})"),
            row(f"hybrid: `scipa2` + BM25 ({fusion(rh, 'scipa2')})", rh, "hybrid (scipa2)"),
            reranked(rr, "hybrid round 3"), reranked(rh, "hybrid `scipa2`"), reranked(rc, "hybrid `scipa2`")]


def lineage() -> str:
    scipa2 = at("scifact-reranker-over-hybrid.json", "training", "scipa2", "model")
    assert scipa2 == at("scifact-towers-ict-ance2.json", "training", "pretrained+finetuned+ance2", "model")
    assert scipa2 == at("zeroshot-blend-chosen-on-target.json", "model")
    assert scipa2 == at("zeroshot-blend-chosen-on-squad.json", "model")
    scipa1 = at("scifact-towers-ict-ance1.json", "training", "pretrained+finetuned+ance1", "model")
    mining = at(DISTILL, "runs", 0, "training_data_mining")
    chain = [at("scifact-towers.json", "training", k, "model") for k in ("finetuned", "finetuned+ance")]
    pretrained = at("scifact-towers-ict-pretrain.json", "model")
    return (f"`scipa2` (`{scipa2}`, in `scifact-reranker-over-hybrid.json` and "
            f"`zeroshot-blend-chosen-on-target.json`) are the towers of `scifact-towers-ict-ance2.json`: a mining "
            f"round from `{scipa1}` (`scipa1`), itself a mining round from `{pretrained}` "
            f"(`scipt`, ICT pre-training then fine-tuning); the `scipa2` "
            f"round's negatives are {mining['num_negatives']} per pair, mined by `scipa1` and denoised at "
            f"{mining['denoise']} (as `{DISTILL}` records for its runs, which share that start and "
            f"those negatives). In the first chain, round 2 continues `{chain[0]}` (the fine-tuned towers) and round "
            f"3 continues round 2 (`{chain[1]}`); round 4's flags were not recorded.")


def squad() -> list[Row]:
    qy, pt = "quality.json", "squad-towers-ict-pretrain.json"
    rb, hy = "squad-soup-rebuilt.json", "squad-soup-hybrid.json"

    def row(label: str, name: str, *path: str, key: str = "", stages: list[Any] | None = None) -> Row:
        systems = at(name, *path, "systems")
        key = key or trained_key(systems)
        return [label, *(num(systems[key]["metrics"].get(k)) for k in SQ), *cost(stages or [{}]), src(name, key)]

    system = at(hy, "system")
    return [row("BM25", "squad-towers-3k-pairs.json", key="bm25"),
            row("base (all-MiniLM-L6-v2)", "squad-towers-3k-pairs.json", key="base"),
            row(f"fine-tuned, {at(qy, 'squad', 'training', 'pairs'):,} pairs (the issue's start)", qy, "squad", "test",
                stages=[{"train_seconds": at(qy, "squad", "training", "train_wall_s")}]),
            row("fine-tuned, a sample of the pairs (`squad3k`), a BM25 negative", "squad-towers-3k-pairs.json"),
            row("fine-tuned, all pairs, a BM25 negative", "squad-towers-all-pairs.json"),
            row("pre-trained (ICT) + fine-tuned, answer windows", pt, "test", stages=at(pt, "stages")),
            row("all pairs + mining round 2 (dense negatives, denoised)", "squad-towers-ance.json"),
            row("all pairs + mining round 3 (chosen on dev)", "squad-towers-ance3.json"),
            row("fine-tuned, all pairs, answer windows", "squad-towers-answer-windows.json"),
            row("answer windows + mining round 2", "squad-towers-answer-windows-ance.json"),
            row("answer windows + round 3, several negatives (cached loss)", "squad-towers-answer-windows-3neg.json"),
            row("soup of round 2 + two rounds 3 (`squadsoup3`)", "squad-soup.json"),
            row("soup, rebuilt chain (`squadsoup3s`, chosen on dev)", rb, "test"),
            [f"hybrid: round 3 + BM25 ({system[system.index('(') + 1:system.index(',')]}, chosen on dev)",
             *(num(at(hy, "metrics").get(k)) for k in SQ), "", "", src(hy, at(hy, "label"))]]


def zeroshot(coll: str) -> list[Row]:
    zt, zs = "zeroshot-blend-chosen-on-target.json", "zeroshot-blend-chosen-on-squad.json"
    a3 = f"scifact-towers-ance3-zeroshot/{coll}.json"
    w, w_squad = at(zt, "collections", coll, "picked_weight"), at(zs, "picked_weight")
    plan = [("BM25", zt, "bm25"), ("base (all-MiniLM-L6-v2)", zt, "base"),
            ("SciFact fine-tuned + mining round 3", a3, trained_key(at(a3, "systems"))),
            ("SciFact `scipa2` (pre-trained + fine-tuned + 2 rounds)", zt, "trained"),
            (f"`scipa2` blended, F = {w:g} chosen on this collection's pseudo-questions", zt, f"trained blend {w:g}"),
            (f"`scipa2` blended, F = {w_squad:g} chosen on SQuAD questions", zs, f"trained blend {w_squad:g}"),
            ("hybrid: base + BM25 (default fusion)", zt, "hybrid (base)"),
            ("hybrid: `scipa2` + BM25", zt, "hybrid (trained)"),
            (f"hybrid: `scipa2` blend {w:g} + BM25", zt, f"hybrid (trained blend {w:g})")]
    systems = {zt: at(zt, "test", coll, "report", "systems"), zs: at(zs, "test", coll, "report", "systems"),
               a3: at(a3, "systems")}
    return [[label, *(num(systems[name][key]["metrics"].get(k)) for k in SCI), src(name, key)]
            for label, name, key in plan]


def latency() -> list[Row]:
    return [[f"`{at(name, 'training', 'reranker', 'model')}`", f"hybrid ({at(name, 'dev', 'picked', 'hybrid')})",
             n.removeprefix("N="), *(num(lat[k], WHOLE) for k in ("mean_ms", "p50_ms", "p95_ms")),
             str(lat["questions"]), src(name, f"reranker_latency_onnx.{n}")]
            for name in ("scifact-reranker.json", "scifact-reranker-over-hybrid.json", RERANKED_HYBRID)
            for n, lat in (load(name).get("reranker_latency_onnx") or {}).items()]


# dev-only reranker runs on `scipa2`'s top 20: file, path to the model card in it
RERANKERS_DEV = (("scifact-reranker-lr1e-4.json", ("output", "card")),
                 ("scifact-reranker-control.json", ("output", "card")),
                 ("scifact-reranker-dense-negatives.json", ("card",)),
                 ("scifact-reranker-from-towers.json", ("output", "card")),
                 ("scifact-reranker-4ep.json", ("output", "card")),
                 ("scifact-reranker-6ep.json", ("output", "card")))

# bench_rerank runs over hybrid (dev grid of N and weight); the last stopped at dev (`--dev-only`)
RERANKED_HYBRID_DEV = ("scifact-reranker-over-hybrid.json", RERANKED_HYBRID,
                       "scifact-reranker-over-hybrid-6ep-dev.json")


def dev_only() -> list[Row]:
    rows: list[Row] = []
    for name, path in RERANKERS_DEV:
        card = at(name, *path)
        dev, hp = card["dev_metrics"], card["hyperparameters"]
        negatives = card["training_data"]["mining"].get("source", "bm25")
        continued = card["base"]["head"].startswith("continued")
        start = ("the towers' passage tower" if "document_" in card["base"]["path"]
                 else f"`{Path(card['base']['path']).name}`'s weights and head" if continued else "MiniLM-L6")
        label = (f"reranker `{card['name']}` ({hp['epochs']:g}{' more' if continued else ''} epoch(s), lr "
                 f"{hp['learning_rate']:g}, {negatives} negatives, from {start}) on `scipa2`'s dev top "
                 f"{dev['candidates']}")
        rows += [["SciFact", f"{label}, alone", num(dev["ndcg@10_by_weight"]["1"]), "", *cost([card]),
                  src(name, ".".join(path) + ".dev_metrics")],
                 ["SciFact", f"{label}, fused at weight {dev['weight']:g} (`scipa2` alone: "
                  f"{num(dev['before']['ndcg@10'])})", num(dev["after"]["ndcg@10"]), "", "", "", src(name)]]
    for name in RERANKED_HYBRID_DEV:  # bench_rerank's dev grid over hybrid: the gate's evidence
        picked = at(name, "dev", "picked")
        best = f"N={picked['rerank_n']} w={picked['rerank_weight']:g}"
        hybrid = at(name, "dev", "hybrid_ndcg@10", picked["hybrid"])
        rows.append(["SciFact", f"hybrid `{picked['hybrid']}` + reranker `{at(name, 'training', 'reranker', 'model')}`"
                     f" at its best dev {best} (hybrid alone: {num(hybrid)}; gate "
                     f"{'on' if picked['rerank_on'] else 'off'})", num(at(name, "dev", "rerank_ndcg@10", best)), "",
                     "", "", src(name, f"dev.rerank_ndcg@10.{best}")])
    ds = DISTILL
    base = at(ds, "baseline_no_distillation")
    rows.append(["SciFact", f"towers, round without distillation (`{base['model']}`)",
                 num(base["dev_metrics"]["after"]["ndcg@10"]), "", *cost([base]), src(ds, "baseline_no_distillation")])
    rows += [["SciFact", f"towers, {run['label']}", num(run["dev_metrics"]["after"]["ndcg@10"]), "",
              num(run["train_seconds"], WHOLE), f"{run['process_peak_rss_gib']} GiB (process)", src(ds, f"runs[{i}]")]
             for i, run in enumerate(at(ds, "runs"))]
    for name, what in (("squad-soup-rebuilt.json", "rebuilt chain"),
                       ("squad-soup-round4.json", "round 4 from the chosen soup")):
        for model, entry in at(name, "training").items():
            after = entry["card"]["dev_metrics"]["after"]
            rows.append(["SQuAD", f"{what}: `{model}`", num(after["ndcg@10"]), num(after["answer@5"], ".2f"),
                         *cost([entry["card"]]), src(name, f"training.{model}.card")])
        test = at(name, "test")  # a dict of systems where the test split was read, else a sentence saying why not
        for model, report in at(name, "dev_soups").items():
            metrics = report["systems"][f"trained:{model}"]["metrics"]
            read = isinstance(test, dict) and f"trained:{model}" in test["systems"]
            rows.append(["SQuAD", f"soup `{model}`" + (" (chosen; its test row is above)" if read else ""),
                         num(metrics["ndcg@10"]), num(metrics["answer@5"], ".2f"), "", "",
                         src(name, f"dev_soups.{model}")])
    rows += [["SQuAD", f"WiSE-FT blend of the chosen soup: `{model}`", num(metrics["ndcg@10"]),
              num(metrics["answer@5"], ".2f"), "", "", src("squad-soup-blend.json", f"dev.{model}")]
             for model, metrics in at("squad-soup-blend.json", "dev").items()]
    return rows


def check(what: str, value: float, floor: float, sources: str, need: str | None = None) -> str:
    """One goal: met when ``value`` reaches ``floor`` and nothing else it ``need``s is missing (a reason)."""
    met = value >= floor and need is None
    return (f"- {what} {value:.4f} >= {floor:.4f}: **{'met' if met else 'not met'}**"
            f"{f' ({need})' if need and value >= floor else ''} ({sources})")


def goals() -> list[str]:
    rh = {k: v["metrics"]["ndcg@10"] for k, v in at("scifact-reranker-over-hybrid.json", "test", "systems").items()}
    rh_src = "`scifact-reranker-over-hybrid.json`"
    rc = at(RERANKED_HYBRID, "test", "systems")
    key = next(k for k in rc if "+ rerank" in k)
    gate, rerank = at(RERANKED_HYBRID, "dev", "picked", "rerank_on"), rc[key]["metrics"]["ndcg@10"]
    reranker = at(RERANKED_HYBRID, "training", "reranker", "model")
    lines = [check("SciFact test nDCG@10, towers (`scipa2`)", rh["scipa2"], SCIFACT_TOWERS, rh_src),
             check("SciFact test nDCG@10, hybrid", rh["hybrid (scipa2)"], SCIFACT_HYBRID, rh_src),
             check(f"SciFact test nDCG@10, hybrid + reranker `{reranker}` ({key.split('+ rerank ')[1]}, dev gate "
                   f"{'on' if gate else 'off'})", rerank, SCIFACT_RERANK, f"`{RERANKED_HYBRID}`",
                   need=None if gate else "the dev gate off: hybrid serves without it")]
    zt = "zeroshot-blend-chosen-on-target.json"
    for coll in ("cranfield", "cisi"):
        s = {k: v["metrics"]["ndcg@10"] for k, v in at(zt, "test", coll, "report", "systems").items()}
        w, floor = at(zt, "collections", coll, "picked_weight"), s["base"] - ZEROSHOT_MARGIN
        name = coll.capitalize() if coll == "cranfield" else coll.upper()
        lines += [check(f"{name} zero-shot nDCG@10, SciFact-trained `scipa2` blended at F = {w:g} (chosen without "
                        f"test queries), against base {s['base']:.4f} - {ZEROSHOT_MARGIN}:", s[f"trained blend {w:g}"],
                        floor, f"`{zt}`; unblended {s['trained']:.4f}: "
                        f"{'met' if s['trained'] >= floor else 'not met'}"),
                  check(f"{name} zero-shot nDCG@10, hybrid (`scipa2` blend {w:g}) against BM25",
                        s[f"hybrid (trained blend {w:g})"], s["bm25"], f"`{zt}`")]
    rb = at("squad-soup-rebuilt.json", "test")
    soup, bm25 = (rb["systems"][k]["metrics"]["answer@5"] for k in (trained_key(rb["systems"]), "bm25"))
    start = at("quality.json", "squad", "test", "systems")
    start = start[trained_key(start)]["metrics"]["answer@5"]
    short = math.ceil(SQUAD_ANSWER5 * rb["queries"]) - round(soup * rb["queries"])
    return lines + [
        check("SQuAD test answer@5, trained dense towers (`squadsoup3s`, the soup chosen on dev)", soup, SQUAD_ANSWER5,
              f"`squad-soup-rebuilt.json`; {max(short, 0)} of {rb['queries']:,} questions short; half the gap "
              f"from the unrounded start {start:.4f} (`quality.json`) to BM25 {bm25:.4f}: {(start + bm25) / 2:.4f}"),
        check("SQuAD test answer@5, hybrid against BM25", at("squad-soup-hybrid.json", "metrics", "answer@5"), bm25,
              "`squad-soup-hybrid.json`, `squad-soup-rebuilt.json`")]


def main() -> None:
    sci, sq = at("scifact-towers.json", "test"), at("squad-soup-rebuilt.json", "test")
    costs = ["train s", "peak RSS MiB", "source"]
    body = ["## Goals", "", *goals(), "",
            f"## SciFact ({sci['dataset']}: {sci['queries']} claims, {sci['documents']:,} documents)", "",
            *table(["system", *SCI, *costs], scifact()), lineage(), "",
            f"## SQuAD v1.1 dev, article split ({sq['dataset']}: {sq['queries']:,} questions, {sq['documents']} "
            "paragraphs)", "", "Labels follow `squad-recipes.md`, which explains each run.", "",
            *table(["system", *SQ, *costs], squad())]
    for coll in ("cranfield", "cisi"):
        report = at("zeroshot-blend-chosen-on-target.json", "test", coll, "report")
        body += [f"## {report['dataset']} zero-shot ({report['queries']} queries, {report['documents']:,} documents)",
                 "", *table(["system", *SCI, "source"], zeroshot(coll))]
    body += ["## Reranker latency per question (ONNX, dev questions)", "",
             *table(["reranker", "first stage", "N", "mean ms", "p50 ms", "p95 ms", "questions", "source"], latency()),
             "## Dev only (test not read)", "",
             *table(["dataset", "system", "dev nDCG@10", "dev answer@5", *costs], dev_only())]
    head = ["# Issue 16: retrieval quality at the field's level", "",
            "Generated by `python benchmarks/report_recipes.py` from " + ", ".join(f"`{n}`" for n in sorted(used))
            + " (under `benchmarks/results/quality/` but for the one under `research/`); no figure here is typed by "
            "hand. "
            "`train s` / `peak RSS MiB`: the "
            "training stage behind that row only (the stages of one model joined by ` + ` and ` / `; empty where the "
            "file does not record it, and on hybrid rows, which train nothing). Metrics are on the test split; the "
            "choices (rounds, soups, fusion, reranker gate) were made on dev.", ""]
    OUT.write_text("\n".join(head + body))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
