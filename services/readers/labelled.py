"""Labelled training pairs in JSONL: ``{question, passage | positive_id, negatives?, answers?}`` per line ->
``encoders.data.TrainPair``. A malformed line refuses the file with a ``DataError`` naming the line and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from encoders.data import Corpus, TrainPair
from services.core.errors import DataError
from services.readers.jsonl import iter_objects, row_id, strict

FIX = (
    'each line must look like {"question": "...", "passage": "..."} or {"question": "...", "positive_id": "d1"} '
    '(with --corpus), optionally with "negatives": ["passage text", ...]'
)


def load_pairs_jsonl(path: Path | str, corpus: Corpus | None = None) -> list[TrainPair]:
    """Pairs; ``positive_id`` (and negatives that are corpus ids) need ``corpus``. Negatives are passage texts, or
    corpus ids when a corpus is given."""
    path = Path(path)
    pairs = [_pair(obj, source, corpus) for source, obj in iter_objects(path)]
    if not pairs:
        raise DataError(f"{path}: no pairs; {FIX}")
    return pairs


def _pair(obj: dict[str, Any], source: str, corpus: Corpus | None) -> TrainPair:
    question = _text(obj, "question", source)
    positive_id: str | None = None
    if "passage" in obj:
        positive = _text(obj, "passage", source)
    elif "positive_id" in obj:
        positive_id = strict(_positive_id, obj, source)
        if corpus is None:
            raise DataError(
                f"{source}: 'positive_id' needs a corpus to look passages up; pass --corpus "
                "(a BEIR corpus.jsonl) or give the passage text in 'passage'"
            )
        if positive_id not in corpus:
            raise DataError(f"{source}: positive_id {positive_id!r} is not in the corpus; {FIX}")
        positive = corpus[positive_id].passage
    else:
        raise DataError(f"{source}: needs 'passage' or 'positive_id'; {FIX}")
    negatives_raw = obj.get("negatives", [])
    if not isinstance(negatives_raw, list) or not all(isinstance(n, str) and n.strip() for n in negatives_raw):
        raise DataError(f"{source}: 'negatives' must be a list of non-empty strings; {FIX}")
    negatives = tuple(corpus[n].passage if corpus is not None and n in corpus else n for n in negatives_raw)
    if not all(n.strip() for n in negatives):
        raise DataError(f"{source}: a negative names a corpus document with no text; drop it")
    answers = obj.get("answers", [])
    if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
        raise DataError(f"{source}: 'answers' must be a list of strings; {FIX}")
    relevant = frozenset([positive_id]) if positive_id else frozenset()
    return TrainPair(question, positive, positive_id, negatives, tuple(answers), relevant)


def _text(obj: dict[str, Any], key: str, source: str) -> str:
    if key not in obj:
        raise DataError(f"{source}: missing field {key!r}; {FIX}")
    value = obj[key]
    if not isinstance(value, str):
        raise DataError(f"{source}: field {key!r} must be a string, got {type(value).__name__}; {FIX}")
    if not value.strip():
        raise DataError(f"{source}: field {key!r} is empty; {FIX}")
    return value


def _positive_id(obj: dict[str, Any], source: str) -> str:
    return row_id(obj, source, keys=("positive_id",))
