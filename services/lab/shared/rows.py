"""Training rows: labelled pairs turned into what a trainer reads, for the towers (``services.lab.towers.trainer``) and
the reranker (``services.lab.reranker.trainer``) alike.

- ``fit_answers``: a positive whose answer lies past the training cut becomes a window around the answer.
- ``pairs_to_columns``: (question, positive, negative_1..n) columns, short negative lists padded at random.
- ``pairs_fingerprint``: what the model card records to tell training sets apart.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from encoders.data import CorpusDoc, TrainPair

log = logging.getLogger(__name__)


def fit_answers(pairs: Sequence[TrainPair], tokenizer: Any, budget: int) -> tuple[list[TrainPair], int]:
    """Positives whose first answer occurrence ends past ``budget`` tokens, cut to ``budget`` tokens around it.

    Training cuts each passage to its first ``train_passage_tokens`` tokens; a SQuAD or KorQuAD paragraph longer
    than that often has its answer past the cut (SQuAD dev on MiniLM at 128 tokens: 13% of pairs; KorQuAD on
    multilingual-e5: 39%), and the question is then taught to match a passage that does not answer it. Such a
    positive becomes its title line (the text before the first newline, as chunks carry it) and a window of the
    body with the answer in its middle, which is what a chunk of the ingested paragraph holding the answer looks
    like. Pairs without answers, or whose answer already fits, stay as they are. Returns the pairs and how many
    were cut.
    """
    out: list[TrainPair] = []
    cut = 0
    for pair in pairs:
        window = _answer_window(pair, tokenizer, budget) if pair.answers else None
        if window is None:
            out.append(pair)
        else:
            out.append(replace(pair, positive=window))
            cut += 1
    if cut:
        log.info("positives cut around their answers", extra={"pairs": cut, "budget_tokens": budget})
    return out, cut


def _answer_window(pair: TrainPair, tokenizer: Any, budget: int) -> str | None:
    text = pair.positive
    spans = [(i, i + len(a)) for a in pair.answers if a and (i := text.find(a)) >= 0]
    if not spans or budget < 8:
        return None
    a_start, a_end = min(spans)
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    ends = [e for _, e in offsets]
    if len(offsets) <= budget or ends[budget - 1] >= a_end:
        return None  # the whole passage, or the answer, fits in the cut training makes anyway
    newline = text.find("\n")
    head = text[: newline + 1] if 0 <= newline < a_start else ""
    first = sum(1 for e in ends if e <= len(head))  # tokens of the title line
    room = budget - first
    answer_tokens = [k for k, (s, e) in enumerate(offsets) if e > a_start and s < a_end]
    if room < len(answer_tokens) + 2:
        return None  # no window of the body can hold the answer
    lo, hi = answer_tokens[0], answer_tokens[-1] + 1
    start = max(first, min(lo - (room - (hi - lo)) // 2, len(offsets) - room))
    end = min(len(offsets), start + room)
    return head + text[offsets[start][0]: offsets[end - 1][1]]


def pairs_to_columns(
    pairs: Sequence[TrainPair], corpus: dict[str, CorpusDoc] | None, seed: int
) -> dict[str, list[str]]:
    """(question, positive, negative_1..n) columns. n is the most negatives any pair has; a pair with fewer gets
    random corpus passages (plain random negatives) so that every row has the same columns."""
    if not pairs:
        raise ValueError("no training pairs")
    n_neg = max(len(p.negatives) for p in pairs)
    rng = random.Random(seed)
    pool = [d.passage for d in corpus.values()] if corpus else sorted({p.positive for p in pairs})
    columns: dict[str, list[str]] = {"question": [], "positive": []}
    for i in range(n_neg):
        columns[f"negative_{i + 1}"] = []
    filled = 0
    for p in pairs:
        columns["question"].append(p.question)
        columns["positive"].append(p.positive)
        negatives = list(p.negatives)
        while len(negatives) < n_neg:
            candidate = rng.choice(pool)
            if candidate != p.positive and candidate not in negatives:
                negatives.append(candidate)
                filled += 1
        for i, text in enumerate(negatives[:n_neg]):
            columns[f"negative_{i + 1}"].append(text)
    if filled:
        log.info("padded short negative lists with random passages", extra={"random_negatives": filled})
    return columns


def pairs_fingerprint(pairs: Sequence[TrainPair]) -> str:
    h = hashlib.sha256()
    for p in pairs:
        h.update(p.question.encode())
        h.update(b"\x1f")
        h.update(hashlib.sha256(p.positive.encode()).digest())
        for n in p.negatives:
            h.update(hashlib.sha256(n.encode()).digest())
        h.update(b"\n")
    return h.hexdigest()[:16]


