"""Judgements: a user's "relevant / not relevant" on a search hit, kept as data of the collection.

A judgement names a question, a document and (usually) one of its chunks, never a vector id, so it survives a
re-embed (new generation, same documents and chunk indexes) and a restart. The store is one SQLite file in the
data dir (``DATA_DIR/feedback.sqlite3``, beside the jobs), one row per (collection, question, document, chunk):
repeating a judgement changes nothing, a later judgement of the same pair replaces the earlier one. A question is
kept as asked, with its surrounding whitespace trimmed and inner runs of whitespace collapsed (the key).

``training_pairs`` turns them into labelled pairs for the towers (``encoders.data.TrainPair``: the question, a
positive passage text, the texts judged not relevant to the same question as its negatives); ``export_rows``
gives the same as JSON lines (`dpr feedback export`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
import sqlite3
import threading
import uuid
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from encoders.data import CorpusDoc, RetrievalDataset, TrainPair, passage_text
from services.core.errors import CollectionNotFound, ConfigError
from services.store.points import Passage, point_id
from services.store.protocol import VectorStore

if TYPE_CHECKING:
    from services.core.settings import Settings

log = logging.getLogger(__name__)

FILE_NAME = "feedback.sqlite3"
MAX_QUESTION_CHARS = 2000
MAX_ID_CHARS = 512  # as a document id (services.readers.jsonl.MAX_ID_CHARS)
DOCUMENT = -1  # the chunk column's value for a judgement of a whole document

_SCHEMA = """
CREATE TABLE IF NOT EXISTS judgements (
    collection TEXT NOT NULL,
    question TEXT NOT NULL,
    doc_id TEXT NOT NULL,
    chunk INTEGER NOT NULL,
    relevant INTEGER NOT NULL,
    judged_at TEXT NOT NULL,
    judged_by TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (collection, question, doc_id, chunk)
)
"""


@dataclasses.dataclass(frozen=True)
class Judgement:
    collection: str
    question: str
    doc_id: str
    chunk: int | None  # None: the whole document
    relevant: bool
    judged_at: str = ""
    judged_by: str = ""  # the API key's name (or "cli"), for the audit trail

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Recorded:
    judgement: Judgement
    outcome: str  # "new" | "replaced" (the same pair judged the other way before) | "unchanged" (a repeat)


def normalize_question(question: str) -> str:
    return re.sub(r"\s+", " ", question).strip()


def check(question: str, doc_id: str, chunk: int | None) -> str:
    """The question as stored; refuses an empty or overlong question, document id or a negative chunk."""
    q = normalize_question(question)
    if not q:
        raise ConfigError("feedback: question is empty; send the question the hits answered")
    if len(q) > MAX_QUESTION_CHARS:
        raise ConfigError(f"feedback: question has {len(q):,} characters; at most {MAX_QUESTION_CHARS:,}")
    if not doc_id or len(doc_id) > MAX_ID_CHARS:
        raise ConfigError(f"feedback: doc_id must be 1-{MAX_ID_CHARS} characters, got {len(doc_id)}")
    if chunk is not None and chunk < 0:
        raise ConfigError(f"feedback: chunk must be >= 0 (the hit's chunk_index), got {chunk}")
    return q


class FeedbackStore:
    """The judgements of every collection under one data dir. Thread-safe; several processes may share the file
    (SQLite locks it; writes wait up to 10 s)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None

    @classmethod
    def in_data_dir(cls, data_dir: Path) -> FeedbackStore:
        return cls(Path(data_dir) / FILE_NAME)

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=10.0, check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(_SCHEMA)
            self._db = db
        return self._db

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def __enter__(self) -> FeedbackStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def record(self, collection: str, question: str, doc_id: str, chunk: int | None, relevant: bool,
               judged_by: str = "") -> Recorded:
        """Store one judgement (validated by ``check``; whether the document exists is the caller's check:
        ``resolve``). A repeat is ``unchanged``; the same pair judged the other way is ``replaced``."""
        q = check(question, doc_id, chunk)
        key = (collection, q, doc_id, DOCUMENT if chunk is None else chunk)
        now = datetime.now(UTC).isoformat(timespec="seconds")
        with self._lock:
            db = self._conn()
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute("SELECT relevant, judged_at, judged_by FROM judgements WHERE collection = ? AND "
                                 "question = ? AND doc_id = ? AND chunk = ?", key).fetchone()
                if row is not None and bool(row[0]) == relevant:
                    db.execute("COMMIT")
                    return Recorded(Judgement(collection, q, doc_id, chunk, relevant, row[1], row[2]), "unchanged")
                db.execute("INSERT OR REPLACE INTO judgements VALUES (?, ?, ?, ?, ?, ?, ?)",
                           (*key, int(relevant), now, judged_by))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        outcome = "new" if row is None else "replaced"
        return Recorded(Judgement(collection, q, doc_id, chunk, relevant, now, judged_by), outcome)

    def judgements(self, collection: str | None = None) -> list[Judgement]:
        """Every judgement (of one collection), by collection, question, document, chunk."""
        if not self.path.exists():
            return []
        where, args = ("WHERE collection = ?", (collection,)) if collection is not None else ("", ())
        with self._lock:
            rows = self._conn().execute(
                f"SELECT collection, question, doc_id, chunk, relevant, judged_at, judged_by FROM judgements {where} "
                "ORDER BY collection, question, doc_id, chunk", args).fetchall()
        return [Judgement(c, q, d, None if k == DOCUMENT else int(k), bool(r), at, by)
                for c, q, d, k, r, at, by in rows]

    def counts(self, collection: str) -> dict[str, int]:
        """``{"judgements", "relevant", "not_relevant", "questions"}`` for one collection (zeros when none)."""
        if not self.path.exists():
            return _counts(None, collection)
        with self._lock:
            return _counts(self._conn(), collection)


def _counts(db: sqlite3.Connection | None, collection: str) -> dict[str, int]:
    """The counts of one collection's judgements in ``db`` (None: there is no file, so none)."""
    row = (0, 0, 0) if db is None else db.execute(
        "SELECT COUNT(*), COALESCE(SUM(relevant), 0), COUNT(DISTINCT question) FROM judgements WHERE collection = ?",
        (collection,)).fetchone()
    total, relevant, questions = (int(v) for v in row)
    return {"judgements": total, "relevant": relevant, "not_relevant": total - relevant, "questions": questions}


def counts_in(data_dir: Path, collection: str) -> dict[str, int] | None:
    """The counts for `dpr status`, read-only (nothing is created; a read-only data dir works); None, with a
    warning in the log, when the file cannot be read (status still reports everything else)."""
    path = Path(data_dir) / FILE_NAME
    if not path.exists():
        return _counts(None, collection)
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=10.0)
        try:
            return _counts(db, collection)
        finally:
            db.close()
    except sqlite3.Error as e:
        log.warning("cannot read the judgements", extra={"path": str(path), "error": str(e)})
        return None


# --- what a judgement names: it must exist in the collection -------------------------------------------------


def resolve(store: VectorStore, *, point: str | None = None, doc_id: str | None = None,
            chunk: int | None = None) -> tuple[str, int | None]:
    """``(doc_id, chunk)`` of the passage or document a judgement names (a point id, or a document id with an
    optional chunk index); raises ``CollectionNotFound`` naming what does not exist."""
    if (point is None) == (doc_id is None):
        raise ConfigError("feedback names a point (point_id) or a document (doc_id, optional chunk), exactly one")
    if point is not None:
        if chunk is not None:
            raise ConfigError("feedback: chunk goes with doc_id; a point id already names one chunk")
        try:
            uuid.UUID(point)
        except ValueError:
            raise ConfigError(f"feedback: point_id {point!r} is not a point id (a UUID, the hit's id)") from None
        found = store.passages([point])  # type: ignore[attr-defined]
        if point not in found:
            raise CollectionNotFound(f"point {point!r} is not in collection {store.alias!r}; judge a hit that a "
                                     "search returned (its doc_id and chunk_index)")
        passage = found[point]
        return passage.doc_id, passage.chunk_index
    assert doc_id is not None
    check("?", doc_id, chunk)
    state = store.doc_states([doc_id]).get(doc_id)
    if state is None:
        raise CollectionNotFound(f"document {doc_id!r} is not in collection {store.alias!r}; judge a hit that a "
                                 "search returned")
    if chunk is not None and not store.passages([point_id(doc_id, chunk)]):  # type: ignore[attr-defined]
        raise CollectionNotFound(f"document {doc_id!r} has no chunk {chunk} in collection {store.alias!r} (it has "
                                 f"{state.chunks}: 0-{state.chunks - 1})")
    return doc_id, chunk


# --- judgements as training data ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Judged:
    """One question's judged passages, texts read from the store (title + text as the towers see them)."""

    question: str
    positives: list[tuple[str, str]]  # (passage key "doc#chunk", text)
    negatives: list[tuple[str, str]]

    def to_json(self) -> dict[str, Any]:
        return {"question": self.question,
                "positives": [{"id": k, "text": t} for k, t in self.positives],
                "negatives": [{"id": k, "text": t} for k, t in self.negatives]}


def _texts(store: VectorStore, judgements: Sequence[Judgement]) -> dict[tuple[str, int | None], list[tuple[str, str]]]:
    """(doc, chunk) -> [(key, text)]: one passage for a chunk, every chunk of a judged whole document; judgements
    whose document has gone from the collection are left out."""
    docs = sorted({j.doc_id for j in judgements})
    states = store.doc_states(docs) if docs else {}
    wanted: dict[tuple[str, int | None], list[str]] = {}
    for j in judgements:
        if j.doc_id not in states:
            continue
        chunks = [j.chunk] if j.chunk is not None else list(range(states[j.doc_id].chunks))
        wanted[(j.doc_id, j.chunk)] = [point_id(j.doc_id, c) for c in chunks]
    ids = sorted({i for v in wanted.values() for i in v})
    found: dict[str, Passage] = {}
    for start in range(0, len(ids), 256):
        found.update(store.passages(ids[start : start + 256]))  # type: ignore[attr-defined]
    out: dict[tuple[str, int | None], list[tuple[str, str]]] = {}
    for key, pids in wanted.items():
        texts = [(f"{found[p].doc_id}#{found[p].chunk_index}", passage_text(found[p].title, found[p].text))
                 for p in pids if p in found]
        if texts:
            out[key] = texts
    return out


def judged(store: VectorStore, judgements: Iterable[Judgement]) -> list[Judged]:
    """The judgements grouped by question, with the judged passages' texts (gone documents left out)."""
    items = list(judgements)
    texts = _texts(store, items)
    by_question: dict[str, Judged] = {}
    for j in items:
        passages = texts.get((j.doc_id, j.chunk))
        if not passages:
            continue
        entry = by_question.setdefault(j.question, Judged(j.question, [], []))
        (entry.positives if j.relevant else entry.negatives).extend(passages)
    return [by_question[q] for q in sorted(by_question)]


def training_pairs(store: VectorStore, judgements: Iterable[Judgement]) -> list[TrainPair]:
    """Labelled pairs for `dpr train --feedback`: one ``TrainPair`` per (question, passage judged relevant), with
    the passages judged not relevant to that question as its negatives and every relevant passage of the question
    in ``relevant_ids`` (so a miner never takes one as a negative). Questions with no relevant passage give none."""
    return pairs_of(judged(store, judgements))


def pairs_of(entries: Iterable[Judged]) -> list[TrainPair]:
    """``training_pairs`` of judged questions already read from the store."""
    pairs = []
    for entry in entries:
        relevant = frozenset(k for k, _ in entry.positives)
        negatives = tuple(t for _, t in entry.negatives)
        for key, text in entry.positives:
            pairs.append(TrainPair(question=entry.question, positive=text, positive_id=key, negatives=negatives,
                                   relevant_ids=relevant))
    return pairs


def collection_judged(settings: Settings) -> tuple[list[Judgement], list[Judged]]:
    """The judgements stored with ``settings.collection`` and its judged questions, texts read from its store."""
    from services.store import open_store

    with FeedbackStore.in_data_dir(settings.data_dir) as judgements_store:
        judgements = judgements_store.judgements(settings.collection)
    if not judgements:
        return [], []
    store = open_store(settings)
    try:
        return judgements, judged(store, judgements)
    finally:
        store.close()


def no_pairs_error(collection: str, judgements: int) -> ConfigError:
    return ConfigError(f"collection {collection!r} has no judgement of a relevant passage to learn from "
                       f"({judgements} judgements); judge hits in the console or POST /v1/feedback first")


def judged_dataset(entries: Sequence[Judged], name: str) -> RetrievalDataset:
    """The judged questions that have a relevant passage, as a retrieval dataset over the pool of every judged
    passage (their qrels: the passages judged relevant). `dpr adapt --feedback` holds a slice of it out and
    chooses its model on that slice: real questions, where its pseudo-questions have misled (docs/adapt.md)."""
    corpus: dict[str, CorpusDoc] = {}
    queries: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    for n, entry in enumerate(entries):
        for key, text in (*entry.positives, *entry.negatives):
            corpus.setdefault(key, CorpusDoc(key, "", text))
        if entry.positives:
            queries[f"judged-{n}"] = entry.question
            qrels[f"judged-{n}"] = {key: 1 for key, _ in entry.positives}
    return RetrievalDataset(name, corpus, queries, qrels)


def digest(judgements: Iterable[Judgement]) -> str:
    """A short hash of what was judged (not when or by whom): a run keyed on it restarts when judgements change."""
    rows = sorted((j.question, j.doc_id, -1 if j.chunk is None else j.chunk, j.relevant) for j in judgements)
    return hashlib.sha256(repr(rows).encode()).hexdigest()[:12]


def export_rows(store: VectorStore, judgements: Iterable[Judgement]) -> Iterator[dict[str, Any]]:
    """JSON lines for `dpr feedback export`: ``{"question", "positives": [{id, text}], "negatives": [...]}``."""
    for entry in judged(store, judgements):
        yield entry.to_json()

