"""Loaders for training and evaluation data, each validating its input.

Three formats:

- BEIR folder: ``corpus.jsonl`` (or ``.jsonl.gz``) ``{_id, title?, text}``, ``queries.jsonl`` ``{_id, text}``,
  ``qrels/<split>.tsv`` with a ``query-id corpus-id score`` header.
- SQuAD v1.1 JSON (``.json`` or ``.json.gz``): every question's positive is its own paragraph. Articles are split
  deterministically (by a hash of the article title) so train and test never share a paragraph.
- Labelled JSONL: one ``{question, passage | positive_id, negatives?}`` object per line.

A malformed file raises ``DataError`` whose message names the file, the line and the fix.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

log = logging.getLogger(__name__)

SquadSplit = Literal["train", "test", "all"]


class DataError(ValueError):
    """An input file is missing or malformed. The message names the file (and line) and says how to fix it."""


@dataclass(frozen=True)
class CorpusDoc:
    doc_id: str
    title: str
    text: str

    @property
    def passage(self) -> str:
        """The text a passage tower sees for this document during training and in-memory evaluation."""
        return passage_text(self.title, self.text)


@dataclass
class RetrievalDataset:
    """Queries, a corpus and relevance judgments (qrels); answers for SQuAD-style data."""

    name: str
    corpus: dict[str, CorpusDoc]
    queries: dict[str, str]  # query id -> question
    qrels: dict[str, dict[str, int]]  # query id -> {doc id: relevance > 0}
    answers: dict[str, list[str]] = field(default_factory=dict)  # query id -> gold answer strings

    def subset(self, query_ids: list[str], name: str | None = None) -> RetrievalDataset:
        """The same corpus with only ``query_ids`` as queries."""
        keep = [q for q in query_ids if q in self.queries]
        return RetrievalDataset(
            name=name or self.name,
            corpus=self.corpus,
            queries={q: self.queries[q] for q in keep},
            qrels={q: self.qrels[q] for q in keep if q in self.qrels},
            answers={q: self.answers[q] for q in keep if q in self.answers},
        )

    def fingerprint(self) -> str:
        """A short hash of queries, qrels and corpus ids (identifies the training data in a model card)."""
        h = hashlib.sha256()
        for qid in sorted(self.queries):
            h.update(f"q\x1f{qid}\x1f{self.queries[qid]}\n".encode())
            for did, rel in sorted(self.qrels.get(qid, {}).items()):
                h.update(f"r\x1f{did}\x1f{rel}\n".encode())
        for did in sorted(self.corpus):
            h.update(f"d\x1f{did}\x1f{len(self.corpus[did].text)}\n".encode())
        return h.hexdigest()[:16]


def labelled_pairs(dataset: RetrievalDataset) -> list[TrainPair]:
    """One pair per (query, relevant document), in a stable order."""
    pairs = []
    for qid in sorted(dataset.queries):
        rels = dataset.qrels.get(qid, {})
        relevant = frozenset(rels)
        for did in sorted(rels):
            pairs.append(
                TrainPair(
                    question=dataset.queries[qid],
                    positive=dataset.corpus[did].passage,
                    positive_id=did,
                    answers=tuple(dataset.answers.get(qid, ())),
                    relevant_ids=relevant,
                )
            )
    return pairs


def passage_text(title: str, text: str) -> str:
    """Title and body as one passage (the title on its own line, as chunks carry it)."""
    title = title.strip()
    text = text.strip()
    if title and text:
        return f"{title}\n{text}"
    return title or text


# --- low-level readers -------------------------------------------------------------------------------------


def _open_text(path: Path) -> Any:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line; a line that is not a JSON object raises DataError."""
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    try:
        with _open_text(path) as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(
                        f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno}); "
                        "each line must hold exactly one JSON object"
                    ) from e
                if not isinstance(obj, dict):
                    raise DataError(
                        f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}; "
                        "each line must hold exactly one JSON object"
                    )
                yield lineno, obj
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e.reason}); re-encode the file as UTF-8") from e
    except (OSError, EOFError) as e:
        if isinstance(e, FileNotFoundError):
            raise DataError(f"{path}: file not found") from e
        raise DataError(f"{path}: cannot read ({e}); check the file is complete and, if .gz, valid gzip") from e


def _require_str(path: Path, lineno: int, obj: dict[str, Any], key: str, fix: str, allow_empty: bool = False) -> str:
    if key not in obj:
        raise DataError(f"{path}:{lineno}: missing field {key!r}; {fix}")
    value = obj[key]
    if isinstance(value, int) and not isinstance(value, bool) and key in {"_id", "positive_id"}:
        value = str(value)
    if not isinstance(value, str):
        raise DataError(f"{path}:{lineno}: field {key!r} must be a string, got {type(value).__name__}; {fix}")
    if not allow_empty and not value.strip():
        raise DataError(f"{path}:{lineno}: field {key!r} is empty; {fix}")
    return value


# --- BEIR ----------------------------------------------------------------------------------------------------


def _beir_corpus_path(folder: Path) -> Path:
    for name in ("corpus.jsonl", "corpus.jsonl.gz"):
        if (folder / name).is_file():
            return folder / name
    raise DataError(f"{folder}: no corpus.jsonl or corpus.jsonl.gz; a BEIR folder needs corpus, queries and qrels/")


def load_corpus_jsonl(path: Path) -> dict[str, CorpusDoc]:
    """A BEIR-style corpus: ``{_id, title?, text}`` per line. Empty text is allowed (some classic corpora have it)."""
    corpus: dict[str, CorpusDoc] = {}
    fix = 'each line must look like {"_id": "d1", "title": "...", "text": "..."}'
    for lineno, obj in iter_jsonl(path):
        doc_id = _require_str(path, lineno, obj, "_id", fix)
        text = _require_str(path, lineno, obj, "text", fix, allow_empty=True)
        title = obj.get("title") or ""
        if not isinstance(title, str):
            raise DataError(f"{path}:{lineno}: field 'title' must be a string; {fix}")
        if doc_id in corpus:
            raise DataError(f"{path}:{lineno}: duplicate _id {doc_id!r}; document ids must be unique")
        corpus[doc_id] = CorpusDoc(doc_id, title, text)
    if not corpus:
        raise DataError(f"{path}: no documents; {fix}")
    return corpus


def load_queries_jsonl(path: Path) -> dict[str, str]:
    queries: dict[str, str] = {}
    fix = 'each line must look like {"_id": "q1", "text": "the question"}'
    for lineno, obj in iter_jsonl(path):
        qid = _require_str(path, lineno, obj, "_id", fix)
        if qid in queries:
            raise DataError(f"{path}:{lineno}: duplicate _id {qid!r}; query ids must be unique")
        queries[qid] = _require_str(path, lineno, obj, "text", fix)
    return queries


def load_qrels_tsv(path: Path) -> dict[str, dict[str, int]]:
    """``query-id<TAB>corpus-id<TAB>score`` with a header line; rows with score <= 0 are not relevant and dropped."""
    if not path.is_file():
        raise DataError(f"{path}: file not found; pass an existing split with --split (e.g. train or test)")
    qrels: dict[str, dict[str, int]] = {}
    fix = "each row must be 'query-id<TAB>corpus-id<TAB>integer score' after a 'query-id corpus-id score' header"
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            cols = line.rstrip("\n").split("\t")
            if lineno == 1 and cols and cols[0].strip().lower() in {"query-id", "query_id", "qid"}:
                continue
            if len(cols) != 3:
                raise DataError(f"{path}:{lineno}: expected 3 tab-separated columns, got {len(cols)}; {fix}")
            qid, did, score_s = (c.strip() for c in cols)
            try:
                score = int(float(score_s))
            except ValueError as e:
                raise DataError(f"{path}:{lineno}: score {score_s!r} is not a number; {fix}") from e
            if score > 0:
                qrels.setdefault(qid, {})[did] = score
    return qrels


def load_beir(folder: Path | str, split: str = "test") -> RetrievalDataset:
    """A BEIR folder; only queries judged in ``qrels/<split>.tsv`` are kept."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"{folder}: not a directory; a BEIR dataset is a folder with corpus, queries and qrels/")
    corpus = load_corpus_jsonl(_beir_corpus_path(folder))
    queries_path = folder / "queries.jsonl"
    if not queries_path.is_file():
        raise DataError(f"{folder}: no queries.jsonl; a BEIR folder needs corpus, queries and qrels/")
    all_queries = load_queries_jsonl(queries_path)
    qrels_path = folder / "qrels" / f"{split}.tsv"
    if not qrels_path.is_file():
        have = sorted(p.stem for p in (folder / "qrels").glob("*.tsv")) if (folder / "qrels").is_dir() else []
        raise DataError(
            f"{qrels_path}: no qrels for split {split!r}; available splits: {', '.join(have) or 'none'} (use --split)"
        )
    raw = load_qrels_tsv(qrels_path)
    qrels: dict[str, dict[str, int]] = {}
    missing_docs = missing_queries = 0
    for qid, rels in raw.items():
        if qid not in all_queries:
            missing_queries += 1
            continue
        kept = {d: r for d, r in rels.items() if d in corpus}
        missing_docs += len(rels) - len(kept)
        if kept:
            qrels[qid] = kept
    if missing_queries or missing_docs:
        log.warning(
            "qrels name unknown ids; dropped",
            extra={"qrels": str(qrels_path), "unknown_queries": missing_queries, "unknown_docs": missing_docs},
        )
    if not qrels:
        raise DataError(f"{qrels_path}: no judgment matches a query in queries.jsonl and a document in the corpus")
    queries = {q: all_queries[q] for q in all_queries if q in qrels}
    return RetrievalDataset(name=f"{folder.name}/{split}", corpus=corpus, queries=queries, qrels=qrels)


# --- SQuAD ---------------------------------------------------------------------------------------------------


def squad_article_split(titles: list[str], test_fraction: float = 0.5) -> dict[str, str]:
    """Deterministic article -> "train" | "test": articles ranked by sha256(title), the first fraction is test."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction}")
    ranked = sorted(titles, key=lambda t: hashlib.sha256(t.encode("utf-8")).hexdigest())
    n_test = max(1, round(len(ranked) * test_fraction)) if len(ranked) > 1 else 0
    return {t: ("test" if i < n_test else "train") for i, t in enumerate(ranked)}


def load_squad(path: Path | str, split: SquadSplit = "all", test_fraction: float = 0.5) -> RetrievalDataset:
    """SQuAD v1.1 JSON. Corpus: the paragraphs of the split's articles (doc id ``<title>#<paragraph index>``).

    Queries: the split's questions; the positive is the question's own paragraph; answers are kept for top-k
    answer accuracy.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    fix = "expected SQuAD v1.1 JSON: {data: [{title, paragraphs: [{context, qas: [{id, question, answers}]}]}]}"
    try:
        with _open_text(path) as f:
            raw = json.load(f)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: not valid JSON ({e.msg}); {fix}") from e
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read ({e}); {fix}") from e
    articles = raw.get("data") if isinstance(raw, dict) else None
    if not isinstance(articles, list) or not articles:
        raise DataError(f"{path}: no 'data' list of articles; {fix}")
    titles = []
    for i, art in enumerate(articles):
        if (
            not isinstance(art, dict)
            or not isinstance(art.get("title"), str)
            or not isinstance(art.get("paragraphs"), list)
        ):
            raise DataError(f"{path}: data[{i}] needs a string 'title' and a 'paragraphs' list; {fix}")
        titles.append(art["title"])
    assignment = squad_article_split(titles, test_fraction) if split != "all" else {}
    corpus: dict[str, CorpusDoc] = {}
    queries: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    answers: dict[str, list[str]] = {}
    for i, art in enumerate(articles):
        title = art["title"]
        if split != "all" and assignment[title] != split:
            continue
        for j, para in enumerate(art["paragraphs"]):
            where = f"{path}: data[{i}].paragraphs[{j}]"
            if not isinstance(para, dict) or not isinstance(para.get("context"), str):
                raise DataError(f"{where} needs a string 'context'; {fix}")
            doc_id = f"{title}#{j}"
            corpus[doc_id] = CorpusDoc(doc_id, title.replace("_", " "), para["context"])
            for k, qa in enumerate(para.get("qas") or []):
                if not isinstance(qa, dict) or not isinstance(qa.get("question"), str) or "id" not in qa:
                    raise DataError(f"{where}.qas[{k}] needs 'id' and a string 'question'; {fix}")
                qid = str(qa["id"])
                queries[qid] = qa["question"]
                qrels[qid] = {doc_id: 1}
                golds = [a.get("text") for a in qa.get("answers") or [] if isinstance(a, dict)]
                answers[qid] = [a for a in golds if isinstance(a, str) and a.strip()]
    if not queries:
        raise DataError(f"{path}: no questions in split {split!r}; {fix}")
    return RetrievalDataset(
        name=f"{path.name.split('.')[0]}/{split}", corpus=corpus, queries=queries, qrels=qrels, answers=answers
    )


# --- labelled JSONL pairs -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainPair:
    """One training example: a question, its positive passage and optional hard-negative passages (texts).

    ``relevant_ids``: every corpus id labelled relevant to the question (never mined as a negative).
    ``answers``: gold answer strings (SQuAD-style); a passage containing one is never mined as a negative.
    """

    question: str
    positive: str
    positive_id: str | None = None
    negatives: tuple[str, ...] = ()
    answers: tuple[str, ...] = ()
    relevant_ids: frozenset[str] = frozenset()


def load_pairs_jsonl(path: Path | str, corpus: dict[str, CorpusDoc] | None = None) -> list[TrainPair]:
    """``{question, passage | positive_id, negatives?, answers?}`` per line.

    ``positive_id`` (and negatives that are corpus ids) need ``corpus``. Negatives are passage texts, or corpus ids
    when a corpus is given.
    """
    path = Path(path)
    fix = (
        'each line must look like {"question": "...", "passage": "..."} or {"question": "...", "positive_id": "d1"} '
        '(with --corpus), optionally with "negatives": ["passage text", ...]'
    )
    pairs: list[TrainPair] = []
    for lineno, obj in iter_jsonl(path):
        question = _require_str(path, lineno, obj, "question", fix)
        positive_id: str | None = None
        if "passage" in obj:
            positive = _require_str(path, lineno, obj, "passage", fix)
        elif "positive_id" in obj:
            positive_id = _require_str(path, lineno, obj, "positive_id", fix)
            if corpus is None:
                raise DataError(
                    f"{path}:{lineno}: 'positive_id' needs a corpus to look passages up; pass --corpus "
                    "(a BEIR corpus.jsonl) or give the passage text in 'passage'"
                )
            if positive_id not in corpus:
                raise DataError(f"{path}:{lineno}: positive_id {positive_id!r} is not in the corpus; {fix}")
            positive = corpus[positive_id].passage
        else:
            raise DataError(f"{path}:{lineno}: needs 'passage' or 'positive_id'; {fix}")
        negatives_raw = obj.get("negatives", [])
        if not isinstance(negatives_raw, list) or not all(isinstance(n, str) and n.strip() for n in negatives_raw):
            raise DataError(f"{path}:{lineno}: 'negatives' must be a list of non-empty strings; {fix}")
        negatives = tuple(corpus[n].passage if corpus is not None and n in corpus else n for n in negatives_raw)
        if not all(n.strip() for n in negatives):
            raise DataError(f"{path}:{lineno}: a negative names a corpus document with no text; drop it")
        answers_raw = obj.get("answers", [])
        if not isinstance(answers_raw, list) or not all(isinstance(a, str) for a in answers_raw):
            raise DataError(f"{path}:{lineno}: 'answers' must be a list of strings; {fix}")
        pairs.append(
            TrainPair(
                question,
                positive,
                positive_id,
                negatives,
                tuple(answers_raw),
                frozenset([positive_id]) if positive_id else frozenset(),
            )
        )
    if not pairs:
        raise DataError(f"{path}: no pairs; {fix}")
    return pairs


def load_corpus_any(path: Path | str) -> dict[str, CorpusDoc]:
    """A corpus for self-supervised pairs: a BEIR folder's corpus or a corpus JSONL (``.gz`` allowed).

    Lines may use ``_id``/``id``/``doc_id`` and ``text``/``title``.
    """
    path = Path(path)
    if path.is_dir():
        return load_corpus_jsonl(_beir_corpus_path(path))
    corpus: dict[str, CorpusDoc] = {}
    fix = 'each line must look like {"_id": "d1", "title": "...", "text": "..."}'
    for lineno, obj in iter_jsonl(path):
        raw_id = obj.get("_id", obj.get("id", obj.get("doc_id", f"line-{lineno}")))
        text = obj.get("text")
        title = obj.get("title") or ""
        if not isinstance(text, str) or not isinstance(title, str):
            raise DataError(f"{path}:{lineno}: 'text' (and 'title' if present) must be strings; {fix}")
        corpus[str(raw_id)] = CorpusDoc(str(raw_id), title, text)
    if not corpus:
        raise DataError(f"{path}: no documents; {fix}")
    return corpus


def split_dev_queries(query_ids: list[str], n_dev: int, seed: int = 13) -> tuple[list[str], list[str]]:
    """Deterministically hold out ``n_dev`` query ids (ranked by a seeded hash) for hyper-parameter choice."""
    if n_dev <= 0:
        return sorted(query_ids), []
    ranked = sorted(query_ids, key=lambda q: hashlib.sha256(f"{seed}\x1f{q}".encode()).hexdigest())
    n_dev = min(n_dev, max(0, len(ranked) - 1))
    return sorted(ranked[n_dev:]), sorted(ranked[:n_dev])
