"""A tiny BEIR folder for the tiny-model tests (training, question-only, reranker): 8 topics x 2 documents,
3 questions per topic with train qrels, written in milliseconds. Each test keeps its own passage wording
(``passage``), so what it measured before it measures still."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

TOPICS = ["volcano lava magma", "glacier ice snow", "desert sand dune", "ocean wave tide", "forest tree moss",
          "city street subway", "river bank delta", "mountain peak ridge"]


def short_passage(words: str, j: int) -> str:
    w = words.split()
    return f"{words} fact {j}. The {w[0]} is studied here. Notes on the {w[1]} and the {w[2]}."


def tiny_beir(root: Path, passage: Callable[[str, int], str] = short_passage) -> Path:
    """``root`` as a BEIR folder: documents ``d{topic}-{j}`` (title "The {first word} {j}", text
    ``passage(topic words, j)``), questions ``q{topic}-{j}`` "what about {j-th word}" judged on ``d{topic}-{j % 2}``
    in ``qrels/train.tsv``."""
    root.mkdir(parents=True)
    with open(root / "corpus.jsonl", "w") as f:
        for t, words in enumerate(TOPICS):
            for j in range(2):
                doc = {"_id": f"d{t}-{j}", "title": f"The {words.split()[0]} {j}", "text": passage(words, j)}
                f.write(json.dumps(doc) + "\n")
    (root / "qrels").mkdir()
    with open(root / "queries.jsonl", "w") as q, open(root / "qrels" / "train.tsv", "w") as r:
        r.write("query-id\tcorpus-id\tscore\n")
        for t, words in enumerate(TOPICS):
            for j in range(3):
                q.write(json.dumps({"_id": f"q{t}-{j}", "text": f"what about {words.split()[j]}"}) + "\n")
                r.write(f"q{t}-{j}\td{t}-{j % 2}\t1\n")
    return root
