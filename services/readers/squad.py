"""SQuAD v1.1 JSON (``.json`` or ``.json.gz``, or a folder holding one) -> an ``encoders.data.RetrievalDataset``.
KorQuAD v1.0 has the same layout (Korean Wikipedia articles) and reads the same way.

Every question's positive is its own paragraph. Articles are split deterministically (by a hash of the article
title) so train and test never share a paragraph. A malformed file raises ``DataError`` naming the file and the fix.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from encoders.data import CorpusDoc, RetrievalDataset
from services.core.errors import DataError
from services.readers.files import open_text

SquadSplit = Literal["train", "test", "all"]

FIX = "expected SQuAD v1.1 JSON: {data: [{title, paragraphs: [{context, qas: [{id, question, answers}]}]}]}"


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
    path = squad_file(Path(path))
    articles = _articles(path)
    assignment = squad_article_split([a["title"] for a in articles], test_fraction) if split != "all" else {}
    ds = RetrievalDataset(name=f"{path.name.split('.')[0]}/{split}", corpus={}, queries={}, qrels={}, answers={})
    for i, art in enumerate(articles):
        if split == "all" or assignment[art["title"]] == split:
            _add_article(ds, art, f"{path}: data[{i}]")
    if not ds.queries:
        raise DataError(f"{path}: no questions in split {split!r}; {FIX}")
    return ds


def squad_file(path: Path) -> Path:
    """``path`` itself, or for a folder (``../shared/data/korquad-v1.0-dev``) the one ``.json`` / ``.json.gz`` in it."""
    if not path.is_dir():
        return path
    found = sorted(p for p in path.iterdir() if p.is_file() and p.name.lower().endswith((".json", ".json.gz")))
    if len(found) != 1:
        names = ", ".join(p.name for p in found) or "none"
        raise DataError(f"{path}: a SQuAD folder must hold exactly one .json or .json.gz file (found: {names}); "
                        "pass the file itself")
    return found[0]


def _articles(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    try:
        with open_text(path) as f:
            raw = json.load(f)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: not valid JSON ({e.msg}); {FIX}") from e
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read ({e}); {FIX}") from e
    articles = raw.get("data") if isinstance(raw, dict) else None
    if not isinstance(articles, list) or not articles:
        raise DataError(f"{path}: no 'data' list of articles; {FIX}")
    for i, art in enumerate(articles):
        if (
            not isinstance(art, dict)
            or not isinstance(art.get("title"), str)
            or not isinstance(art.get("paragraphs"), list)
        ):
            raise DataError(f"{path}: data[{i}] needs a string 'title' and a 'paragraphs' list; {FIX}")
    return articles


def _add_article(ds: RetrievalDataset, art: dict[str, Any], where_article: str) -> None:
    """The article's paragraphs into the corpus, its questions into queries, qrels and answers."""
    title = art["title"]
    for j, para in enumerate(art["paragraphs"]):
        where = f"{where_article}.paragraphs[{j}]"
        if not isinstance(para, dict) or not isinstance(para.get("context"), str):
            raise DataError(f"{where} needs a string 'context'; {FIX}")
        doc_id = f"{title}#{j}"
        ds.corpus[doc_id] = CorpusDoc(doc_id, title.replace("_", " "), para["context"])
        for k, qa in enumerate(para.get("qas") or []):
            if not isinstance(qa, dict) or not isinstance(qa.get("question"), str) or "id" not in qa:
                raise DataError(f"{where}.qas[{k}] needs 'id' and a string 'question'; {FIX}")
            qid = str(qa["id"])
            ds.queries[qid] = qa["question"]
            ds.qrels[qid] = {doc_id: 1}
            golds = [a.get("text") for a in qa.get("answers") or [] if isinstance(a, dict)]
            ds.answers[qid] = [a for a in golds if isinstance(a, str) and a.strip()]
