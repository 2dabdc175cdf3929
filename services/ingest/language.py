"""The language of a collection or a data set, for its BM25 tokenisation: one detection rule, one ``--language``
choice, used by ingest (CLI and API), ``dpr eval``'s BM25 baseline, hard-negative mining and hybrid tuning.

- ``detect_language``: the share of Hangul among the letters of the first documents (up to ``SAMPLE_DOCUMENTS``
  documents and ``SAMPLE_CHARS`` characters); above ``HANGUL_THRESHOLD`` the text is Korean (``ko``), else
  ``en``. Digits, spaces and punctuation do not count, so numbers and markup do not dilute it. Measured
  (``benchmarks/bench_korquad.py`` prints it): KorQuAD paragraphs ~0.9, SciFact / SQuAD 0.00.
- ``resolve_language``: an existing collection keeps the language it was created with (its stored BM25
  configuration); ``auto`` (the default) detects on creation; an explicit language that contradicts the stored
  one is refused with the collection's name and the fix.
- ``for_new_collection`` (in ``services.ingest.pipeline``): the batch that creates a collection with no language chosen
  detects it on its documents; ``prepare_collection`` (``services.ingest.job``, before batches are handed over):
  an explicit ``--language`` is checked against an existing collection, or creates the new collection with it,
  so a worker that writes the first batch uses it too. ``auto`` costs the entry point nothing (no store, no model).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal, cast

from encoders.data import CorpusDoc
from encoders.korean import is_hangul
from encoders.towers import DualEncoder
from services.core.errors import ConfigError, Conflict, TransientError
from services.readers import Document, Item
from services.store.points import CollectionSpec
from services.store.protocol import VectorStore

if TYPE_CHECKING:
    from services.store.sparse import SparseEncoder

log = logging.getLogger(__name__)

Language = Literal["en", "ko"]
LanguageChoice = Literal["auto", "en", "ko"]
LANGUAGE_CHOICES: tuple[str, ...] = ("auto", "en", "ko")
HANGUL_THRESHOLD = 0.3  # share of letters; Korean prose is ~0.9, English ~0.0, so any value in between separates
SAMPLE_DOCUMENTS = 50
LANGUAGE_HELP = (
    "BM25 tokenisation: auto | en | ko. A new collection keeps it (auto: detected on the first documents); an "
    "existing collection keeps the one it was created with."
)
SAMPLE_CHARS = 200_000


def hangul_share(texts: Iterable[str]) -> float:
    """Hangul letters / all letters over the first ``SAMPLE_DOCUMENTS`` texts (at most ``SAMPLE_CHARS`` chars)."""
    letters = hangul = budget = 0
    for text in itertools.islice(texts, SAMPLE_DOCUMENTS):
        part = text[: SAMPLE_CHARS - budget]
        budget += len(part)
        for ch in part:
            if ch.isalpha():
                letters += 1
                hangul += is_hangul(ch)
        if budget >= SAMPLE_CHARS:
            break
    return hangul / letters if letters else 0.0


def detect_language(texts: Iterable[str]) -> Language:
    """``ko`` when Hangul is more than ``HANGUL_THRESHOLD`` of the letters of the first texts, else ``en``."""
    share = hangul_share(texts)
    language: Language = "ko" if share > HANGUL_THRESHOLD else "en"
    log.info("detected language", extra={"language": language, "hangul_share": round(share, 3)})
    return language


def check_choice(value: str | None, option: str = "--language") -> LanguageChoice:
    """``auto`` for None; the value itself when it is a known choice; else a ConfigError naming the choices."""
    choice = (value or "auto").strip().lower()
    if choice not in LANGUAGE_CHOICES:
        raise ConfigError(f"{option} {value!r} is not known; use auto, en or ko")
    return cast(LanguageChoice, choice)


def resolve_language(
    requested: str | None, *, stored: str | None, sample: Iterable[str] = (), collection: str = ""
) -> str:
    """The language to tokenise with: ``stored`` (an existing collection's) unless it contradicts an explicit
    ``requested``, which is an error; with nothing stored, ``requested`` or, for ``auto``, detected on ``sample``."""
    choice = check_choice(requested)
    if stored is not None:
        if choice != "auto" and choice != stored:
            raise Conflict(
                f"collection {collection!r} tokenises BM25 as {stored!r} (chosen when it was created), not "
                f"{choice!r}: drop --language (or pass --language {stored}), or ingest into a new collection "
                f"(--collection NAME --language {choice})"
            )
        return stored
    return choice if choice != "auto" else detect_language(sample)


def corpus_language(requested: str | None, corpus: Mapping[str, CorpusDoc]) -> str:
    """The language of an evaluation / training corpus (its BM25 baseline, mining, tuning): ``requested`` unless
    ``auto``, else detected on its first documents (title + text)."""
    return resolve_language(requested, stored=None, sample=(d.passage for d in corpus.values()))


def for_new_collection(sparse: Any, docs: Iterable[Document]) -> Any:
    """The sparse encoder a collection created now by ``docs`` gets: a chosen one as it is; for ``AutoBm25`` (no
    language chosen) the one for the language detected on the first documents."""
    from services.store.sparse import AutoBm25, embedder_for

    if not isinstance(sparse, AutoBm25):
        return sparse
    return embedder_for(detect_language(f"{d.title} {d.text}" for d in docs))


def collection_spec(towers: DualEncoder, sparse: SparseEncoder | bool | None) -> CollectionSpec:
    """The spec a new collection is created with; a sparse encoder's BM25 configuration (its language) is stored
    in it (``settings["bm25"]``) so every later ingest, query and re-embed tokenises the same way. (Here, below
    ``services.ingest.pipeline``, which re-exports it, so ``prepare_collection`` needs no import of the pipeline.)"""
    from services.store.sparse import BM25_KEY

    config = getattr(sparse, "config", None)
    settings = {BM25_KEY: config()} if callable(config) else {}
    return CollectionSpec(dim=towers.dim, distance=towers.similarity, model=towers.fingerprint,
                          sparse=sparse not in (None, False), settings=settings)


def prepare_collection(
    store: VectorStore, towers: Callable[[], DualEncoder], requested: str | None, items: Iterable[Item]
) -> str | None:
    """Settle an explicit ``--language`` before ingest hands batches over: against an existing collection's (a
    contradiction is refused), or, for a new collection, by creating it with that language now (``towers()``
    and the first document of ``items`` are used only then), so workers that write its first batch use it too.
    ``auto`` does nothing here: the first batch detects the language when it creates the collection
    (``for_new_collection``). Returns the language when settled; None for ``auto`` or when the store is
    unavailable (the batches then meet the same error and report it, as before)."""
    from services.store.sparse import embedder_for, spec_language

    choice = check_choice(requested)
    if choice == "auto":
        return None
    try:
        active = store.active()
    except TransientError as e:  # the job reports the store's state per batch, as it always did
        log.warning("cannot settle the collection's language now: %s", e, extra={"alias": store.alias})
        return None
    if active is not None:
        return resolve_language(choice, stored=spec_language(active.spec), collection=store.alias)
    if any(isinstance(i, Document) for i in items):  # nothing to ingest: no collection either (as before)
        store.ensure_collection(collection_spec(towers(), embedder_for(choice)))
        log.info("collection language", extra={"alias": store.alias, "language": choice})
    return choice
