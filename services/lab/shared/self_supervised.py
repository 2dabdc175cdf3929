"""Self-supervised (question, passage) pairs from an unlabelled corpus.

- Inverse Cloze Task (ICT, Lee et al. 2019): one sentence of a passage plays the question; the passage without that
  sentence is the positive. With probability ``keep_sentence_prob`` the sentence stays in (as in ORQA), so the
  towers still learn that lexical overlap matters.
- Title / heading -> body: a document's title (or a Markdown / reStructuredText section heading) is the question,
  the text under it the positive.

Every builder is deterministic for a given seed.
"""

from __future__ import annotations

import math
import random
import re
import string
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from encoders.data import Corpus, CorpusDoc, RetrievalDataset, TrainPair, passage_text

SelfSupervisedMode = Literal["ict", "title", "both"]

# A sentence ends at . ! or ? followed by whitespace and anything but a lower-case Latin letter or closing
# punctuation (so "e.g. this" stays whole, while Hangul, other scripts, digits, quotes and brackets start a new
# sentence: Korean prose has no capitals), or at a stop standing alone between spaces (tokenised, lower-cased text
# such as Cranfield's: "the slipstream . an experimental study"), or at a CJK full stop, with or without a space.
# PairConfig's word limits count whitespace-separated words, so text written without spaces (Chinese, Japanese)
# still yields no ICT pair: its sentences split, but each reads as one word.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[^\sa-z,;:)\]])|(?<=\s[.!?])\s+|(?<=[\u3002\uff01\uff1f])\s*(?=\S)")
_MD_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_RST_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+:.])\1{2,}\s*$")


@dataclass(frozen=True)
class PairConfig:
    min_sentence_words: int = 5
    max_sentence_words: int = 64
    min_context_words: int = 20
    max_context_words: int = 200  # ICT context: a window of words around the sentence
    keep_sentence_prob: float = 0.1
    ict_per_doc: int = 1
    min_title_words: int = 2
    min_body_words: int = 20
    max_body_words: int = 200


def split_sentences(text: str) -> list[str]:
    """Rule-based sentence split (good enough for abstracts, docs prose and Korean Wikipedia; no model, no
    download)."""
    text = " ".join(text.split())
    if not text:
        return []
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def ict_pairs(docs: Iterable[CorpusDoc], config: PairConfig | None = None, seed: int = 0) -> list[TrainPair]:
    """ICT pairs: for each document, ``ict_per_doc`` sentences become questions over the rest of a passage window.

    The positive keeps the document title (the passage tower sees titles in production too).
    """
    config = config or PairConfig()
    rng = random.Random(seed)
    pairs: list[TrainPair] = []
    for doc in docs:
        sentences = split_sentences(body_without_title(doc))  # a leading copy of the title is no question
        candidates = [
            i
            for i, s in enumerate(sentences)
            if config.min_sentence_words <= len(s.split()) <= config.max_sentence_words
        ]
        if len(sentences) < 2 or not candidates:
            continue
        for i in rng.sample(candidates, min(config.ict_per_doc, len(candidates))):
            keep = rng.random() < config.keep_sentence_prob
            context = _window(sentences, i, keep, config.max_context_words)
            if len(context.split()) < config.min_context_words:
                continue
            pairs.append(
                TrainPair(
                    question=sentences[i],
                    positive=passage_text(doc.title, context),
                    positive_id=doc.doc_id,
                    relevant_ids=frozenset([doc.doc_id]),
                )
            )
    return pairs


def _window(sentences: Sequence[str], i: int, keep: bool, max_words: int) -> str:
    """Sentences around ``i`` (alternately after and before) up to ``max_words``; sentence ``i`` only if ``keep``."""
    chosen = {i} if keep else set()
    words = len(sentences[i].split()) if keep else 0
    lo, hi = i - 1, i + 1
    while lo >= 0 or hi < len(sentences):
        for j in (hi, lo):
            if 0 <= j < len(sentences) and j not in chosen:
                n = len(sentences[j].split())
                if words + n > max_words and chosen:
                    return " ".join(sentences[k] for k in sorted(chosen))
                chosen.add(j)
                words += n
        lo, hi = lo - 1, hi + 1
    return " ".join(sentences[k] for k in sorted(chosen))


def sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) for Markdown ``#`` headings and reStructuredText underlined (or over+underlined) headings."""
    lines = text.splitlines()
    found: list[tuple[str, list[str]]] = []
    current: tuple[str, list[str]] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        heading = None
        md = _MD_HEADING.match(line)
        if md:
            heading = md.group(2)
        elif (
            i + 1 < len(lines)
            and line.strip()
            and not _RST_UNDERLINE.match(line)
            and _RST_UNDERLINE.match(lines[i + 1])
            and len(lines[i + 1].strip()) >= len(line.strip())
        ):
            heading = line.strip()
            i += 1  # skip the underline
        elif _RST_UNDERLINE.match(line):
            i += 1  # an overline or a stray rule
            continue
        if heading is not None:
            current = (heading.strip(), [])
            found.append(current)
        elif current is not None:
            current[1].append(line)
        i += 1
    return [(h, " ".join(" ".join(body).split())) for h, body in found]


def title_pairs(docs: Iterable[CorpusDoc], config: PairConfig | None = None) -> list[TrainPair]:
    """(title -> opening of the body) for every titled document, and (heading -> section body) for its sections."""
    config = config or PairConfig()
    pairs: list[TrainPair] = []
    for doc in docs:
        heads = sections(doc.text)
        if doc.title and len(doc.title.split()) >= config.min_title_words:
            body = _clip(body_without_title(doc), config.max_body_words)
            if len(body.split()) >= config.min_body_words:
                pairs.append(
                    TrainPair(
                        question=doc.title, positive=body, positive_id=doc.doc_id, relevant_ids=frozenset([doc.doc_id])
                    )
                )
        seen = {doc.title.strip().lower()}
        for heading, body in heads:
            question = f"{doc.title}: {heading}" if doc.title else heading
            if heading.lower() in seen or len(question.split()) < config.min_title_words:
                continue
            seen.add(heading.lower())
            body = _clip(body, config.max_body_words)
            if len(body.split()) >= config.min_body_words:
                pairs.append(
                    TrainPair(
                        question=question, positive=body, positive_id=doc.doc_id, relevant_ids=frozenset([doc.doc_id])
                    )
                )
    return pairs


def body_without_title(doc: CorpusDoc) -> str:
    """``doc.text`` without a leading copy of its title (Cranfield's bodies open with their title: a title -> body
    pair would be a string match). Words compare without case or surrounding punctuation; other bodies are
    returned as they are."""
    title = [t for t in map(_bare, doc.title.split()) if t]
    words = doc.text.split()
    i = matched = 0
    while title and matched < len(title) and i < len(words):
        word = _bare(words[i])
        i += 1
        if not word:
            continue  # a lone " ." or " -"
        if word != title[matched]:
            return doc.text
        matched += 1
    if not title or matched < len(title):
        return doc.text
    rest = words[i:]
    while rest and not _bare(rest[0]):
        rest.pop(0)  # the " ." that closed the title
    return " ".join(rest)


def _bare(word: str) -> str:
    return word.strip(string.punctuation).lower()


PseudoKind = Literal["title", "ict", "keywords"]
PSEUDO_KINDS: tuple[PseudoKind, ...] = ("title", "ict", "keywords")
_WORD = re.compile(r"\w[\w-]*\w")


def pseudo_query_sets(corpus: Corpus, queries: int = 500, seed: int = 0, config: PairConfig | None = None,
                      max_documents: int = 5000, name: str = "corpus",
                      kinds: Sequence[PseudoKind] = ("title", "ict")) -> dict[str, RetrievalDataset]:
    """Label-free dev sets built from an unlabelled corpus, to choose between models for it (``dpr models blend
    --choose-on``): the only labelled questions of a collection a user has not trained on are the ones they have
    not asked yet. Up to ``queries`` each, over at most ``max_documents`` documents (a seeded sample):

    - ``title``: a title is the question, every document under it the answer (a collection's chunks share their
      document's title); every document of the set is its body without the title (``body_without_title``), so
      the answer cannot be found by matching the title string.
    - ``ict``: one sentence of a document's body is the question; that document appears without the sentence
      (and without a leading copy of its title, which it keeps as its title).
    - ``keywords``: 3-5 of a document's 8 heaviest words (tf x idf over the documents; words in one document only
      are left out, so a question is never one string match away) in the order the document uses them, the
      document as it is the answer: the short keyword queries people type.

    ``kinds`` says which are built. A mode yielding fewer than 20 questions is left out (too few to rank models
    by); none at all is an error."""
    unknown = set(kinds) - set(PSEUDO_KINDS)
    if unknown or not kinds:
        raise ValueError(f"pseudo-question kinds must be among {', '.join(PSEUDO_KINDS)}, got {list(kinds)}")
    config = config or PairConfig()
    rng = random.Random(seed)
    docs = sorted(corpus.values(), key=lambda d: d.doc_id)
    if len(docs) > max_documents:
        docs = sorted(rng.sample(docs, max_documents), key=lambda d: d.doc_id)
    out: dict[str, RetrievalDataset] = {}
    if "title" in kinds:
        _title_set(docs, queries, rng, config, name, out)
    if "ict" in kinds:
        _ict_set(docs, queries, rng, config, name, out)
    if "keywords" in kinds:
        _keyword_set(docs, queries, random.Random(f"{seed}-keywords"), name, out)
    if not out:
        raise ValueError(f"no pseudo-questions could be built from the {len(docs)} documents of {name}: they need "
                         "titles, or bodies of several sentences (20 documents at least); choose the blend weight "
                         "with `dpr eval` on labelled questions instead")
    return out


def _title_set(docs: Sequence[CorpusDoc], queries: int, rng: random.Random, config: PairConfig, name: str,
               out: dict[str, RetrievalDataset]) -> None:
    titled = [d for d in docs if len(d.title.split()) >= config.min_title_words
              and len(body_without_title(d).split()) >= config.min_body_words]
    sharing: dict[str, list[str]] = {}  # a title -> every document under it (a collection's chunks share one)
    for d in titled:
        sharing.setdefault(" ".join(d.title.split()), []).append(d.doc_id)
    picked = rng.sample(sorted(sharing), min(queries, len(sharing)))
    if len(picked) >= 20:
        out["title"] = RetrievalDataset(
            name=f"{name}-title{len(picked)}",
            corpus={d.doc_id: CorpusDoc(d.doc_id, "", body_without_title(d)) for d in docs},
            queries={f"title-{i}": title for i, title in enumerate(picked)},
            qrels={f"title-{i}": dict.fromkeys(sharing[title], 1) for i, title in enumerate(picked)})


def _ict_set(docs: Sequence[CorpusDoc], queries: int, rng: random.Random, config: PairConfig, name: str,
             out: dict[str, RetrievalDataset]) -> None:
    ict_corpus = {d.doc_id: d for d in docs}
    ict_queries: dict[str, str] = {}
    for doc in rng.sample(docs, len(docs)):
        if len(ict_queries) >= queries:
            break
        sentences = split_sentences(body_without_title(doc))  # not the title's copy: the title stays on
        candidates = [i for i, s in enumerate(sentences)
                      if config.min_sentence_words <= len(s.split()) <= config.max_sentence_words]
        if len(sentences) < 2 or not candidates:
            continue
        i = rng.choice(candidates)
        rest = " ".join(s for j, s in enumerate(sentences) if j != i)
        if len(rest.split()) < config.min_context_words:
            continue
        ict_queries[f"ict-{doc.doc_id}"] = sentences[i]
        ict_corpus[doc.doc_id] = CorpusDoc(doc.doc_id, doc.title, rest)
    if len(ict_queries) >= 20:
        out["ict"] = RetrievalDataset(name=f"{name}-ict{len(ict_queries)}", corpus=ict_corpus, queries=ict_queries,
                                      qrels={q: {q.removeprefix("ict-"): 1} for q in ict_queries})


def _keyword_set(docs: Sequence[CorpusDoc], queries: int, rng: random.Random, name: str,
                 out: dict[str, RetrievalDataset]) -> None:
    words = {d.doc_id: [w.lower() for w in _WORD.findall(f"{d.title} {d.text}")] for d in docs}
    df: dict[str, int] = {}
    for doc_words in words.values():
        for w in set(doc_words):
            df[w] = df.get(w, 0) + 1
    n = len(docs)
    found: dict[str, str] = {}
    for doc in rng.sample(list(docs), len(docs)):
        if len(found) >= queries:
            break
        doc_words = words[doc.doc_id]
        tf: dict[str, int] = {}
        for w in doc_words:
            if not w.isdigit() and len(w) >= 3 and df[w] >= 2:
                tf[w] = tf.get(w, 0) + 1
        weight = {w: c * math.log(n / df[w]) for w, c in tf.items()}
        top = sorted((w for w in weight if weight[w] > 0), key=lambda w: (-weight[w], w))[:8]
        if len(top) < 3:
            continue
        chosen = set(rng.sample(top, rng.randint(3, min(5, len(top)))))
        first = {w: i for i, w in reversed(list(enumerate(doc_words)))}
        found[f"keywords-{doc.doc_id}"] = " ".join(sorted(chosen, key=first.__getitem__))
    if len(found) >= 20:
        out["keywords"] = RetrievalDataset(name=f"{name}-keywords{len(found)}", corpus={d.doc_id: d for d in docs},
                                           queries=found,
                                           qrels={q: {q.removeprefix("keywords-"): 1} for q in found})


def _clip(text: str, max_words: int) -> str:
    words = text.split()
    return " ".join(words[:max_words])


def self_supervised_pairs(
    docs: Sequence[CorpusDoc],
    mode: SelfSupervisedMode = "both",
    config: PairConfig | None = None,
    seed: int = 0,
    max_pairs: int | None = None,
) -> list[TrainPair]:
    """ICT and/or title pairs over ``docs``, shuffled with ``seed`` and capped at ``max_pairs``."""
    if mode not in ("ict", "title", "both"):
        raise ValueError(f"self-supervised mode must be ict, title or both, got {mode!r}")
    pairs: list[TrainPair] = []
    if mode in ("ict", "both"):
        pairs += ict_pairs(docs, config, seed)
    if mode in ("title", "both"):
        pairs += title_pairs(docs, config)
    rng = random.Random(seed)
    rng.shuffle(pairs)
    if max_pairs is not None:
        pairs = pairs[:max_pairs]
    if not pairs:
        raise ValueError(
            f"no {mode} pairs could be built from {len(docs)} documents; ICT needs passages of several sentences, "
            "title pairs need titles or section headings"
        )
    return pairs
