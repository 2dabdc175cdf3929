"""Korean lexical terms for BM25: Kiwi morphological analysis (``kiwipiepy``; its model ships in the
``kiwipiepy-model`` wheel, nothing is downloaded), keeping the content morphemes.

Korean glues particles and endings to the word they follow ("학교에서", "학교는", "학교를" are one word each to a
whitespace or Unicode-word tokenizer), so an English-style BM25 sees three unrelated terms where a reader sees
one. Kiwi splits each word into morphemes with part-of-speech tags; ``korean_terms`` keeps the ones that carry
content and drops the grammar:

- kept: common and proper nouns (NNG, NNP), numerals (NR), verb and adjective stems (VV, VA, also their
  irregular forms ``VV-I``/``VA-R`` ...), roots (XR), foreign words (SL), numbers (SN), Hanja (SH), and the
  URL / e-mail / hashtag / serial tokens Kiwi recognises (W_*);
- dropped: particles (J*), endings (E*), affixes (XP*, XS*), dependent nouns and pronouns (NNB, NP: "것", "수",
  "그"; they behave like stop words), auxiliary verbs and copulas (VX, VCP, VCN), adverbs, determiners,
  interjections, punctuation and symbols (S* other than SL/SN/SH).

Latin letters are lower-cased. The analyser costs ~2 s and ~100 MB to build, so one is built per process, on
first use, under a lock; analysis runs under the same lock (Kiwi does not promise concurrent calls on one
instance; one short passage takes well under a millisecond).
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

KEPT_TAGS = frozenset({"NNG", "NNP", "NR", "VV", "VA", "XR", "SL", "SN", "SH"})
KEPT_PREFIXES = ("W_",)  # W_URL, W_EMAIL, W_HASHTAG, W_MENTION, W_SERIAL

_lock = threading.Lock()
_kiwi: Any = None


def _analyser() -> Any:
    """The process's Kiwi, built once (callers hold ``_lock``)."""
    global _kiwi
    if _kiwi is None:
        try:
            from kiwipiepy import Kiwi
        except ImportError as e:  # a broken install, not a user error
            raise RuntimeError(
                "Korean BM25 needs kiwipiepy and its model: pip install kiwipiepy==0.24.1 kiwipiepy-model==0.24.0"
            ) from e
        with warnings.catch_warnings():  # num_workers=0 warns that it means single-threaded since 0.21: wanted
            warnings.filterwarnings("ignore", message="behavior of `num_workers=0`", category=DeprecationWarning)
            _kiwi = Kiwi(num_workers=0)  # single-threaded: the callers' threads are the parallelism
    return _kiwi


def is_hangul(ch: str) -> bool:
    """Hangul syllables, jamo, compatibility jamo and extended jamo."""
    o = ord(ch)
    return 0xAC00 <= o <= 0xD7A3 or 0x1100 <= o <= 0x11FF or 0x3130 <= o <= 0x318F or 0xA960 <= o <= 0xA97F


def has_hangul(text: str) -> bool:
    return any(is_hangul(ch) for ch in text)


def is_content(tag: str) -> bool:
    """True for a morpheme tag ``korean_terms`` keeps (irregular forms such as ``VV-I`` count as their base tag)."""
    return tag.split("-", 1)[0] in KEPT_TAGS or tag.startswith(KEPT_PREFIXES)


def korean_terms(text: str) -> list[str]:
    """The content morphemes of ``text``, in order, Latin lower-cased, with repeats (BM25 counts them)."""
    if not text.strip():
        return []
    with _lock:
        tokens = _analyser().tokenize(text)
    return ["_".join(t.form.lower().split()) for t in tokens if is_content(t.tag) and t.form.strip()]
