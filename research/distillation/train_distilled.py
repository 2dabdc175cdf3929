"""Experiment (issue 16, moved out of `dpr train` by issue 39): distil a trained reranker into the towers.

The towers learn the labels (MNRL: in-batch and hard negatives) and, on each question's own candidates, the
reranker's preferences among them (``distill.DistilledMNRL``). Built from the product's own steps: the training set
of ``services.lab.towers.recipe`` (with its hard-negative mining), the model of ``services.lab.towers.trainer``, the
recipe skeleton of
``services.lab.shared.training_run``; only the loss is this experiment's.

    python research/distillation/train_distilled.py DATA --teacher RERANKER [--base NAME] [--hard-negatives 3] \
        [--negatives-from dense --denoise 0.95] [--epochs 2 --lr 1e-5] [--weight 1 --temperature 1] \
        [--negatives-only] [--name scidistill]

Results: README.md beside this folder's parent (research/README.md) and
research/distillation/results/scifact-dev.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, help="BEIR folder, SQuAD JSON or labelled pairs JSONL")
    parser.add_argument("--teacher", required=True, help="a reranker `dpr train-reranker` made")
    parser.add_argument("--base", default="base")
    parser.add_argument("--split", default="train")
    parser.add_argument("--hard-negatives", type=int, default=3)
    parser.add_argument("--negatives-from", default="bm25", choices=("bm25", "dense"))
    parser.add_argument("--denoise", type=float, default=None)
    parser.add_argument("--epochs", type=float, default=2.0)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--weight", type=float, default=1.0, help="weight of the KL term")
    parser.add_argument("--temperature", type=float, default=1.0, help="the teacher's scores are divided by this")
    parser.add_argument("--negatives-only", action="store_true", help="the KL term over the hard negatives alone")
    parser.add_argument("--name", default="distilled")
    args = parser.parse_args()
    print(json.dumps(train_distilled(args), indent=2, default=str))


def train_distilled(args: argparse.Namespace) -> dict:  # type: ignore[type-arg]
    import time
    from dataclasses import replace

    from datasets import Dataset
    from distill import DistilledMNRL, teacher_scores

    from encoders.rerank import load_reranker
    from encoders.towers import resolve_model_path
    from services.core.settings import Settings
    from services.lab.shared.mining import MiningConfig
    from services.lab.shared.rows import pairs_to_columns
    from services.lab.shared.training_run import (
        base_record,
        card_fields,
        data_record,
        fit_towers,
        save_model,
        start_run,
        versioned_name,
    )
    from services.lab.towers.recipe import TrainingData, build_training_set
    from services.lab.towers.trainer import TrainConfig, build_model, passage_transformer, set_passage_tokens

    settings = Settings()
    config = TrainConfig(name=args.name, epochs=args.epochs, learning_rate=args.lr, batch_size=args.batch_size,
                         max_steps=args.max_steps)
    needed = 2 if args.negatives_only else 1
    if args.hard_negatives < needed:
        raise SystemExit(f"the teacher compares a question's candidates: set --hard-negatives {needed} or more")
    base, _ = resolve_model_path(args.base, settings.models_dir)
    mining = MiningConfig(num_negatives=args.hard_negatives, source=args.negatives_from, denoise=args.denoise,
                          model=str(base) if args.negatives_from == "dense" or args.denoise else None)
    teacher = load_reranker(args.teacher, settings.models_dir, settings.rerank.backend or "onnx")
    training = build_training_set(settings, TrainingData(data=args.data, split=args.split, mining=mining))
    started, t0 = start_run(config.threads, config.seed)
    # 1. model
    model = build_model(base, config.shared, config.max_query_tokens, None)
    passage_max = int(passage_transformer(model, False).max_seq_length)
    set_passage_tokens(model, min(config.train_passage_tokens or passage_max, passage_max), False)
    # 2. data: the rows, and the teacher's scores of each row's candidates
    columns = pairs_to_columns(training.pairs, training.corpus or None, config.seed)
    labels, summary = teacher_scores(teacher.score, columns)
    # 3. loss
    loss = DistilledMNRL(model, config.scale, args.weight, args.temperature, args.negatives_only)
    # 5-6. arguments, trainer
    steps, losses = fit_towers(model, config, list(columns), Dataset.from_dict({**columns, "label": labels}), loss,
                               None)
    set_passage_tokens(model, passage_max, False)
    # 7. evaluate
    from services.lab.evaluation.retrieval import evaluate_model_in_memory

    dev = evaluate_model_in_memory(model, training.dev) if training.dev is not None else None
    # 8. save
    card = {"towers": "separate (Router: query, document)", "experiment": "research/distillation",
            "distilled_from": {"teacher": teacher.name, "fingerprint": teacher.fingerprint,
                               "backend": teacher.backend, **summary},
            **card_fields(base=base_record(base),
                          training_data=data_record(training.pairs, {**training.info, "mining": asdict(mining)}),
                          hyperparameters={**asdict(replace(config, max_passage_tokens=passage_max)),
                                           "loss": "DistilledMNRL", "distill_weight": args.weight,
                                           "distill_temperature": args.temperature,
                                           "distill_negatives_only": args.negatives_only},
                          seed=config.seed, started=started, train_seconds=time.perf_counter() - t0, steps=steps,
                          losses=losses, dev_metrics={"before": None, "after": dev} if dev else None)}
    result = save_model(model, settings.models_dir, versioned_name(config.name, started), card, losses)
    return {"model": result.name, "path": str(result.model_dir), "card": result.card}


if __name__ == "__main__":
    main()
