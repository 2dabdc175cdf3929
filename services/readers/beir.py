"""BEIR folders: ``corpus.jsonl`` (or ``.jsonl.gz``), ``queries.jsonl``, ``qrels/<split>.tsv`` -> ``encoders.data``
records (``Corpus``, ``Queries``, ``Qrels``, ``RetrievalDataset``). Rows follow ``services.readers.jsonl``'s rule;
a malformed file raises ``DataError`` naming the file, the line and the fix."""

from __future__ import annotations

import logging
from pathlib import Path

from encoders.data import Corpus, CorpusDoc, Qrels, Queries, RetrievalDataset
from services.core.errors import ConfigError, DataError
from services.readers.jsonl import read_rows

log = logging.getLogger(__name__)

CORPUS_FIX = 'each line must look like {"_id": "d1", "title": "...", "text": "..."}'
QUERIES_FIX = 'each line must look like {"_id": "q1", "text": "the question"}'
QRELS_FIX = "each row must be 'query-id<TAB>corpus-id<TAB>integer score' after a 'query-id corpus-id score' header"


def beir_corpus_path(folder: Path) -> Path | None:
    """The folder's ``corpus.jsonl`` or ``corpus.jsonl.gz``, if it has one."""
    return next((folder / name for name in ("corpus.jsonl", "corpus.jsonl.gz") if (folder / name).is_file()), None)


def load_corpus(path: Path | str) -> Corpus:
    """A corpus: a BEIR folder's corpus, or a corpus JSONL (``.gz`` allowed). Rows with blank text are kept
    (judgments may name them); ids must be unique."""
    path = Path(path)
    if path.is_dir():
        found = beir_corpus_path(path)
        if found is None:
            raise DataError(
                f"{path}: no corpus.jsonl or corpus.jsonl.gz; a BEIR folder needs corpus, queries and qrels/"
            )
        path = found
    corpus: Corpus = {}
    for row in read_rows(path):
        if row.doc_id in corpus:
            raise DataError(f"{path}: duplicate id {row.doc_id!r}; document ids must be unique")
        corpus[row.doc_id] = CorpusDoc(row.doc_id, row.title, row.text)
    if not corpus:
        raise DataError(f"{path}: no documents; {CORPUS_FIX}")
    return corpus


def load_queries(path: Path) -> Queries:
    """``{_id, text}`` per line; a query needs a non-blank text."""
    queries: Queries = {}
    for row in read_rows(path):
        if row.empty:
            raise DataError(f"{path}: query {row.doc_id!r} has an empty 'text'; {QUERIES_FIX}")
        if row.doc_id in queries:
            raise DataError(f"{path}: duplicate id {row.doc_id!r}; query ids must be unique")
        queries[row.doc_id] = row.text
    return queries


def load_qrels(path: Path) -> Qrels:
    """``query-id<TAB>corpus-id<TAB>score`` with a header line; rows with score <= 0 are not relevant and dropped."""
    if not path.is_file():
        raise DataError(f"{path}: file not found; pass an existing split with --split (e.g. train or test)")
    qrels: Qrels = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            cols = line.rstrip("\n").split("\t")
            if lineno == 1 and cols and cols[0].strip().lower() in {"query-id", "query_id", "qid"}:
                continue
            if len(cols) != 3:
                raise DataError(f"{path}:{lineno}: expected 3 tab-separated columns, got {len(cols)}; {QRELS_FIX}")
            qid, did, score_s = (c.strip() for c in cols)
            try:
                score = int(float(score_s))
            except ValueError as e:
                raise DataError(f"{path}:{lineno}: score {score_s!r} is not a number; {QRELS_FIX}") from e
            if score > 0:
                qrels.setdefault(qid, {})[did] = score
    return qrels


def load_beir(folder: Path | str, split: str = "test") -> RetrievalDataset:
    """A BEIR folder; only queries judged in ``qrels/<split>.tsv`` are kept."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"{folder}: not a directory; a BEIR dataset is a folder with corpus, queries and qrels/")
    corpus = load_corpus(folder)
    queries_path = folder / "queries.jsonl"
    if not queries_path.is_file():
        raise DataError(f"{folder}: no queries.jsonl; a BEIR folder needs corpus, queries and qrels/")
    all_queries = load_queries(queries_path)
    qrels_path = folder / "qrels" / f"{split}.tsv"
    if not qrels_path.is_file():
        have = sorted(p.stem for p in (folder / "qrels").glob("*.tsv")) if (folder / "qrels").is_dir() else []
        raise DataError(
            f"{qrels_path}: no qrels for split {split!r}; available splits: {', '.join(have) or 'none'} (use --split)"
        )
    qrels = _known(load_qrels(qrels_path), all_queries, corpus, qrels_path)
    if not qrels:
        raise DataError(f"{qrels_path}: no judgment matches a query in queries.jsonl and a document in the corpus")
    queries = {q: all_queries[q] for q in all_queries if q in qrels}
    return RetrievalDataset(name=f"{folder.name}/{split}", corpus=corpus, queries=queries, qrels=qrels)


def _known(raw: Qrels, queries: Queries, corpus: Corpus, source: Path) -> Qrels:
    """The judgments whose query and document exist; how many were dropped is logged."""
    qrels: Qrels = {}
    missing_docs = missing_queries = 0
    for qid, rels in raw.items():
        if qid not in queries:
            missing_queries += 1
            continue
        kept = {d: r for d, r in rels.items() if d in corpus}
        missing_docs += len(rels) - len(kept)
        if kept:
            qrels[qid] = kept
    if missing_queries or missing_docs:
        log.warning(
            "qrels name unknown ids; dropped",
            extra={"qrels": str(source), "unknown_queries": missing_queries, "unknown_docs": missing_docs},
        )
    return qrels


def corpus_file(path: Path, fmt: str) -> Path:
    """The one file `dpr adapt` reads: a BEIR folder's corpus (never its queries or qrels) or a corpus JSONL."""
    if fmt not in ("auto", "beir", "jsonl"):
        raise ConfigError(f"--format {fmt!r} is not for dpr adapt; use auto, beir (a folder with corpus.jsonl) or "
                          "jsonl (a corpus JSONL); a SQuAD file carries its questions: give its paragraphs as a "
                          "corpus JSONL")
    if path.is_dir():
        found = beir_corpus_path(path)
        if found is None:
            raise ConfigError(f"{path}: no corpus.jsonl or corpus.jsonl.gz; give a BEIR folder or a corpus JSONL")
        return found
    if not path.is_file():
        raise ConfigError(f"{path}: no such file or folder; give a BEIR folder or a corpus JSONL")
    if fmt == "beir":
        raise ConfigError(f"{path} is a file; --format beir needs a folder with corpus.jsonl")
    if not path.name.lower().endswith((".jsonl", ".jsonl.gz")):
        raise ConfigError(f"{path}: dpr adapt reads a corpus JSONL (.jsonl or .jsonl.gz) or a BEIR folder")
    return path
