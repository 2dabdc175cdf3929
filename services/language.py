"""The language of a collection or a data set, for its BM25 tokenisation: one detection rule, one ``--language``
choice, used by ingest (CLI and API), ``dpr eval``'s BM25 baseline, hard-negative mining and hybrid tuning.

- ``detect_language``: the share of Hangul among the letters of the first documents (up to ``SAMPLE_DOCUMENTS``
  documents and ``SAMPLE_CHARS`` characters); above ``HANGUL_THRESHOLD`` the text is Korean (``ko``), else
  ``en``. Digits, spaces and punctuation do not count, so numbers and markup do not dilute it. Measured
  (``benchmarks/bench_korquad.py`` prints it): KorQuAD paragraphs ~0.9, SciFact / SQuAD 0.00.
- ``resolve_language``: an existing collection keeps the language it was created with (its stored BM25
  configuration); ``auto`` (the default) detects on creation; an explicit language that contradicts the stored
  one is refused with the collection's name and the fix.
- ``prepare_collection``: ingest's entry points call it before they hand batches over, so a new collection is
  created with its language in its spec whichever process (this one or a worker) writes the first batch.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Literal, cast

from encoders.data import CorpusDoc
from encoders.korean import is_hangul
from encoders.towers import DualEncoder
from services.errors import ConfigError, TransientError
from services.readers import Document, Item
from services.store.protocol import VectorStore

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
            raise ConfigError(
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


def prepare_collection(
    store: VectorStore, towers: Callable[[], DualEncoder], requested: str | None, items: Iterable[Item]
) -> str | None:
    """Settle the collection's BM25 language before ingest hands batches over: an existing collection's (checked
    against an explicit ``requested``), or, for a new one, ``requested`` / detected on the first documents of
    ``items``, and the collection created with it (``items`` and ``towers()`` are used only then). Returns it;
    None when the store is unavailable (the batches then meet the same error and report it, as before)."""
    from services.ingest import collection_spec
    from services.sparse import embedder_for, spec_language

    check_choice(requested)
    try:
        active = store.active()
    except TransientError as e:  # the job reports the store's state per batch, as it always did
        log.warning("cannot settle the collection's language now: %s", e, extra={"alias": store.alias})
        return None
    if active is not None:
        return resolve_language(requested, stored=spec_language(active.spec), collection=store.alias)
    docs = (f"{i.title} {i.text}" for i in items if isinstance(i, Document))
    sample = list(itertools.islice(docs, SAMPLE_DOCUMENTS))
    language = resolve_language(requested, stored=None, sample=sample, collection=store.alias)
    if not sample:  # nothing to ingest: no collection either (as before)
        return language
    store.ensure_collection(collection_spec(towers(), embedder_for(language)))
    log.info("collection language", extra={"alias": store.alias, "language": language})
    return language
