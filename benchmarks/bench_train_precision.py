"""Issue 68: does `dpr train` in bf16 autocast reach fp32's quality in less time on this CPU?

Runs `dpr train` on BEIR SciFact (train split; the recipe's 100 dev queries held out) with the default recipe, once
with ``precision = "fp32"`` and once with ``precision = "bf16"`` (a recipe file setting only that, and
``--steps``/``--rounds`` when given), alternated ``--repeats`` times, each in a fresh data dir, and prints per run
the wall time, the trainer's own seconds, and the dev nDCG@10 the model card records after training; then the
ratios bf16 / fp32. The default recipe takes hours on 2 cores; ``--steps 60 --rounds 0`` a few minutes each.

Usage: ``.venv/bin/python benchmarks/bench_train_precision.py [--steps N] [--rounds 0] [--repeats 1]``
(needs ../shared/data/beir-scifact); writes ``benchmarks/results/quality/train-precision.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import machine_line, script  # benchmarks/ is sys.path[0]

REPO = script()


def train(data: Path, work: Path, precision: str, steps: int | None, rounds: int | None) -> dict[str, Any]:
    recipe = work / f"recipe-{precision}.toml"
    lines = ["[train]", f'precision = "{precision}"'] + ([f"max_steps = {steps}"] if steps else [])
    lines += ["[rounds]", f"count = {rounds}"] if rounds is not None else []
    recipe.write_text("\n".join(lines) + "\n")
    data_dir = Path(tempfile.mkdtemp(prefix=f"train-{precision}-", dir=work))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPR_") and k != "PYTHONDONTWRITEBYTECODE"}
    env["DPR_DATA_DIR"] = str(data_dir)
    start = time.perf_counter()
    done = subprocess.run([str(REPO / ".venv" / "bin" / "dpr"), "train", str(data), "--recipe", str(recipe),
                           "--json"], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(f"dpr train ({precision}) failed: {done.stderr[-3000:]}")
    card_path = next((data_dir / "models").glob("*/model_card.json"))
    card = json.loads(card_path.read_text())
    after = ((card.get("dev_metrics") or {}).get("after") or {}).get("ndcg@10")
    return {"wall": wall, "train_seconds": float(card.get("train_seconds") or 0), "ndcg": float(after or "nan"),
            "precision": card["hyperparameters"].get("precision"), "stages": stages(data_dir)}


def stages(data_dir: Path) -> list[dict[str, Any]]:
    """Each stage the run went through (its train dir's timings.json, then STAGE.json): seconds, the trainer's
    seconds, dev nDCG@10, whether it was kept."""
    run = next((data_dir / "train").glob("*/timings.json"), None)
    if run is None:
        return []
    out = []
    for stage, seconds in json.loads(run.read_text()).items():
        record = run.parent / f"{stage.replace(' ', '-')}.json"
        got = json.loads(record.read_text()) if record.is_file() else {}
        out.append({"stage": stage, "seconds": float(seconds), "trainer": float(got.get("train_seconds") or 0),
                    "ndcg": got.get("dev_ndcg@10"), "kept": got.get("kept", True)})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=None, help="max_steps of the fine-tune (default: the recipe's)")
    parser.add_argument("--rounds", type=int, default=None, help="mining rounds (default: the recipe's)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path,
                        default=REPO / "benchmarks" / "results" / "quality" / "train-precision.md")
    args = parser.parse_args()
    data = REPO.parent / "shared" / "data" / "beir-scifact"
    if not data.is_dir():
        print("skipped: needs ../shared/data/beir-scifact beside the repository")
        return 0
    runs: dict[str, list[dict[str, Any]]] = {"fp32": [], "bf16": []}
    with tempfile.TemporaryDirectory(prefix="bench-train-precision-") as tmp:
        for _ in range(args.repeats):
            for precision in runs:  # alternated
                runs[precision].append(train(data, Path(tmp), precision, args.steps, args.rounds))
                print(precision, runs[precision][-1], flush=True)
    options = (f" --steps {args.steps}" if args.steps else "") + (
        f" --rounds {args.rounds}" if args.rounds is not None else "")
    rows = [f"# `dpr train` in fp32 and in bf16 autocast (issue 68): `bench_train_precision.py{options}"
            f" --repeats {args.repeats}`", "", machine_line(), "",
            "| precision | wall s (each run) | trainer s | dev nDCG@10 after |", "|---|---|---|---|"]
    for precision, got in runs.items():
        walls = " / ".join(f"{r['wall']:.0f}" for r in got)
        trainer = " / ".join(f"{r['train_seconds']:.0f}" for r in got)
        ndcg = " / ".join(f"{r['ndcg']:.4f}" for r in got)
        rows.append(f"| {precision} | {walls} | {trainer} | {ndcg} |")
    if any(r["stages"] for got in runs.values() for r in got):
        rows += ["", "| precision | run | stage | stage s | trainer s | dev nDCG@10 | kept |",
                 "|---|---|---|---|---|---|---|"]
    for precision, got in runs.items():
        for i, r in enumerate(got, 1):
            rows += [f"| {precision} | {i} | {st['stage']} | {st['seconds']:.0f} | {st['trainer']:.0f} | "
                     f"{st['ndcg']} | {'yes' if st['kept'] else 'no'} |" for st in r["stages"]]
    both = [name for name in (st["stage"] for st in runs["fp32"][0]["stages"])
            if name in {st["stage"] for st in runs["bf16"][0]["stages"]}]
    if both:  # the stages both first runs went through, side by side (the rounds end where one loses on dev)
        def total(r: dict[str, Any]) -> float:
            return sum(st["seconds"] for st in r["stages"] if st["stage"] in both)
        ratio = total(runs["bf16"][0]) / total(runs["fp32"][0])
        rows += ["", f"Stage for stage ({', '.join(both)}): bf16 / fp32 **{ratio:.2f}x**"]
    wall = statistics.median(r["wall"] for r in runs["bf16"]) / statistics.median(r["wall"] for r in runs["fp32"])
    gap = statistics.median(r["ndcg"] for r in runs["bf16"]) - statistics.median(r["ndcg"] for r in runs["fp32"])
    rows += ["", f"bf16 / fp32 wall: **{wall:.2f}x**; dev nDCG@10 bf16 - fp32: **{gap:+.4f}** "
             f"(load after: {' / '.join(f'{x:.1f}' for x in os.getloadavg())})"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(rows) + "\n")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
