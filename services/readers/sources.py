"""What a path holds, and the one entry to read it: documents to ingest (``iter_documents``) or a data set to
train or evaluate on (``load_dataset``)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

from encoders.data import DEV_SPLIT_SEED, RetrievalDataset
from services.core.errors import ConfigError
from services.core.settings import DocumentSettings
from services.readers.beir import beir_corpus_path, load_beir
from services.readers.binary import BINARY_SUFFIXES
from services.readers.files import TEXT_SUFFIXES
from services.readers.folders import iter_files
from services.readers.jsonl import RECORD_SUFFIXES, iter_jsonl
from services.readers.records import IdLedger, Item
from services.readers.sandbox import ParserSandbox
from services.readers.squad import load_squad

InputFormat = Literal["auto", "files", "jsonl", "beir"]
DatasetFormat = Literal["beir", "squad", "jsonl"]


def detect_format(path: Path) -> InputFormat:
    """Documents to ingest: a BEIR folder or corpus file, a JSONL file, else files."""
    if path.is_dir():
        return "beir" if beir_corpus_path(path) is not None else "files"
    name = path.name.lower()
    if name.endswith(RECORD_SUFFIXES):
        return "beir" if name.startswith("corpus.jsonl") else "jsonl"
    return "files"


def iter_documents(
    paths: Iterable[str | Path], fmt: InputFormat = "auto", max_bytes: int = 20_000_000,
    limits: DocumentSettings | None = None, sandbox: ParserSandbox | None = None, defer_binary: bool = False,
) -> Iterator[Item]:
    """Every document (or failure, or skip) under ``paths``, in a stable order; never raises for bad input (only
    for a path that does not exist, or a format that does not fit it). Ids are unique across the whole run: a
    later document under an id already read fails as ``duplicate_id``. Binary documents (PDF, DOCX, PPTX, ODT,
    EPUB) are parsed in ``sandbox`` (default: the process's shared one) within ``limits``, or with
    ``defer_binary`` yielded unparsed as ``filesig.FileRef`` for the batch's runner to parse."""
    ledger = IdLedger()
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise ConfigError(f"{path}: no such file or directory; check the path")
        kind = detect_format(path) if fmt == "auto" else fmt
        if kind == "files":
            yield from iter_files(path, max_bytes, ledger, limits, sandbox, defer_binary=defer_binary)
        elif kind == "jsonl":
            if path.is_dir():
                raise ConfigError(f"{path}: --format jsonl needs a .jsonl file, not a folder")
            yield from iter_jsonl(path, max_bytes, ledger)
        elif kind == "beir":
            corpus = beir_corpus_path(path) if path.is_dir() else path
            if corpus is None:
                raise ConfigError(f"{path}: no corpus.jsonl or corpus.jsonl.gz here; is it a BEIR folder?")
            yield from iter_jsonl(corpus, max_bytes, ledger)
        else:  # pragma: no cover - typer validates the choice
            raise ConfigError(f"unknown format {fmt!r}; use auto, files, jsonl or beir")


def count_documents(paths: Iterable[str | Path], fmt: InputFormat = "auto", budget_s: float = 2.0) -> int | None:
    """About how many documents ``iter_documents`` will yield (text files; lines of plain records files), for a
    progress estimate only: None when a compressed file makes it unknowable cheaply or the look takes longer
    than ``budget_s``. Reads no document."""
    deadline = time.monotonic() + budget_s
    total = 0
    try:
        for raw in paths:
            path = Path(raw)
            kind = detect_format(path) if fmt == "auto" else fmt
            if kind == "beir":
                path = (beir_corpus_path(path) if path.is_dir() else path) or path
            candidates = [path] if not path.is_dir() else (
                Path(d) / f for d, dirs, files in os.walk(path) for f in files if not f.startswith("."))
            for candidate in candidates:
                name = candidate.name.lower()
                if name.endswith(RECORD_SUFFIXES):
                    total += _count_lines(candidate, deadline)
                elif candidate.suffix.lower() in TEXT_SUFFIXES or name.endswith(BINARY_SUFFIXES):
                    total += 1
                if time.monotonic() > deadline:
                    return None
    except (OSError, _TooSlow):
        return None
    return total


class _TooSlow(Exception):
    pass


def _count_lines(path: Path, deadline: float) -> int:
    if path.name.lower().endswith(".gz"):
        raise _TooSlow
    lines = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            lines += chunk.count(b"\n")
            if time.monotonic() > deadline:
                raise _TooSlow
    return lines


def dataset_format(path: Path, fmt: str = "auto") -> DatasetFormat:
    """Training or evaluation data: a BEIR folder, SQuAD JSON or labelled-pairs JSONL (``fmt`` wins unless auto)."""
    if fmt in ("beir", "squad", "jsonl"):
        return fmt  # type: ignore[return-value]
    if fmt != "auto":
        raise ConfigError(f"--format {fmt!r} is not known; use auto, beir, squad or jsonl")
    if path.is_dir():
        return "beir"
    name = path.name.lower()
    if name.endswith((".json", ".json.gz")):
        return "squad"
    if name.endswith((".jsonl", ".jsonl.gz")):
        return "jsonl"
    raise ConfigError(f"{path}: cannot tell the format; pass --format beir|squad|jsonl")


def load_dataset(path: Path, split: str, fmt: str = "auto") -> RetrievalDataset:
    """Queries, corpus and judgments from a BEIR folder (qrels split) or SQuAD JSON (article split)."""
    kind = dataset_format(path, fmt)
    if kind == "beir":
        return load_beir(path, split)
    if kind == "squad":
        return load_squad(path, split)  # type: ignore[arg-type]
    raise ConfigError(f"{path}: labelled pairs JSONL has no queries and judgments; use a BEIR folder or SQuAD JSON")


def load_dev_split(
    path: Path, split: str = "train", fmt: str = "auto", dev_queries: int = 100, seed: int = DEV_SPLIT_SEED
) -> RetrievalDataset:
    """The dev split: ``dev_queries`` questions held out of TRAINING data (a BEIR qrels split, or the train
    articles of a SQuAD file), the same ones `dpr train` keeps out of its pairs. Hyper-parameters, fusion, blends
    and soups are chosen on it; a test split is refused."""
    if split == "test":
        raise ConfigError(
            f"refusing to choose on the test split of {path}: test questions are for reporting only; use a dev "
            "split carved from training data (--split train, with --dev-queries N held-out questions)"
        )
    if dev_queries < 1:
        raise ConfigError(f"--dev-queries must be at least 1, got {dev_queries}")
    kind = dataset_format(path, fmt)
    if kind == "squad" and split != "train":
        raise ConfigError(f"SQuAD dev questions come from the train side of the article split, not {split!r}; "
                          "use --split train")
    full = load_dataset(path, split, kind)  # labelled-pairs JSONL: refused there, it has no questions to hold out
    _, dev = full.held_out(dev_queries, seed=seed)
    if not dev.queries:
        raise ConfigError(f"{full.name} has too few questions to hold {dev_queries} out as a dev split")
    return dev
