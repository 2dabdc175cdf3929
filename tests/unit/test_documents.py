from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from services.core.errors import ConfigError
from services.readers import (
    Document,
    DocumentFailure,
    Skipped,
    detect_format,
    guess_title,
    html_to_text,
    iter_documents,
)

pytestmark = pytest.mark.unit


def _write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        path.write_text(data, encoding="utf-8")
    else:
        path.write_bytes(data)
    return path


def test_folder_mixing_good_and_bad_files_reports_each_bad_one(tmp_path: Path) -> None:
    root = tmp_path / "docs"
    _write(root / "a.md", "# Alpha\n\nAlpha text.")
    _write(root / "sub" / "b.rst", "Beta title\n==========\n\nBeta body.")
    _write(root / "c.html", "<html><head><title>Gamma</title><style>x{}</style></head><body><p>Gamma &amp; co</p>"
           "<script>evil()</script></body></html>")
    _write(root / "bin.txt", b"\x00\x01\x02binary")
    _write(root / "latin1.txt", "caf\xe9".encode("latin-1"))
    _write(root / "empty.txt", "   \n\t")
    _write(root / "big.txt", "x" * 400)
    _write(root / "image.png", b"\x89PNG")
    _write(root / ".hidden" / "secret.md", "# hidden")

    items = list(iter_documents([root], max_bytes=300))
    docs = {i.doc_id: i for i in items if isinstance(i, Document)}
    failures = {Path(i.source).name: i for i in items if isinstance(i, DocumentFailure)}
    skipped = {Path(i.source).name: i.reason for i in items if isinstance(i, Skipped)}

    assert set(docs) == {"docs/a.md", "docs/sub/b.rst", "docs/c.html"}
    assert docs["docs/a.md"].title == "Alpha"
    assert docs["docs/sub/b.rst"].title == "Beta title"
    assert docs["docs/c.html"].title == "Gamma"
    assert "Gamma & co" in docs["docs/c.html"].text and "evil" not in docs["docs/c.html"].text
    assert {k: v.reason for k, v in failures.items()} == {
        "bin.txt": "binary",
        "latin1.txt": "encoding",
        "empty.txt": "empty",
        "big.txt": "oversized",
    }
    assert "re-encode it as UTF-8" in failures["latin1.txt"].error
    assert "DPR_MAX_DOCUMENT_BYTES" in failures["big.txt"].error
    assert set(skipped) == {"image.png", ".hidden"}  # a hidden folder is one skip, with the reason
    assert skipped[".hidden"].startswith("hidden")


def test_doc_ids_are_stable_whatever_the_spelling_of_the_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path / "docs" / "a.txt", "hello")
    monkeypatch.chdir(tmp_path)
    ids_relative = [i.doc_id for i in iter_documents(["docs"]) if isinstance(i, Document)]
    ids_absolute = [i.doc_id for i in iter_documents([tmp_path / "docs" / "."]) if isinstance(i, Document)]
    assert ids_relative == ["docs/a.txt"]
    assert ids_absolute == ids_relative


def test_jsonl_bad_rows_fail_alone(tmp_path: Path) -> None:
    rows = [
        json.dumps({"id": "1", "title": "One", "text": "first", "lang": "en", "nested": {"x": 1}}),
        "{not json",
        json.dumps({"text": "no id"}),
        json.dumps({"_id": "4", "text": ""}),
        json.dumps(["a", "list"]),
        "",
        json.dumps({"_id": 5, "text": "fifth"}),
    ]
    path = _write(tmp_path / "c.jsonl", "\n".join(rows) + "\n")
    items = list(iter_documents([path]))
    docs = [i for i in items if isinstance(i, Document)]
    fails = [i for i in items if isinstance(i, DocumentFailure)]
    assert [d.doc_id for d in docs] == ["1", "5"]
    assert docs[0].metadata == {"lang": "en"}
    assert [(Path(f.source).name, f.reason) for f in fails] == [
        ("c.jsonl:2", "invalid_json"),
        ("c.jsonl:3", "missing_field"),
        ("c.jsonl:4", "empty"),
        ("c.jsonl:5", "invalid_json"),
    ]


def test_beir_folder_and_gz(tmp_path: Path) -> None:
    folder = tmp_path / "beir"
    folder.mkdir()
    with gzip.open(folder / "corpus.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(json.dumps({"_id": "d1", "title": "T", "text": "body"}) + "\n")
    assert detect_format(folder) == "beir"
    docs = list(iter_documents([folder]))
    assert docs == [Document(doc_id="d1", text="body", title="T", source=str(folder / "corpus.jsonl.gz"))]


def test_missing_path_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        list(iter_documents([tmp_path / "nope"]))


def test_doc_hash_changes_with_text_and_title() -> None:
    a = Document(doc_id="x", text="t", title="a")
    assert a.doc_hash == Document(doc_id="x", text="t", title="a", source="elsewhere").doc_hash
    assert a.doc_hash != Document(doc_id="x", text="t2", title="a").doc_hash
    assert a.doc_hash != Document(doc_id="x", text="t", title="b").doc_hash


def test_html_and_titles() -> None:
    title, text = html_to_text("<title> A  B </title><div>x</div><div>y</div>")
    assert title == "A B"
    assert text.split() == ["x", "y"]
    assert guess_title(Path("my_notes.txt"), "no heading here") == "my notes"


def test_ingest_and_training_read_a_jsonl_row_by_the_same_rule(tmp_path: Path) -> None:
    from services.readers import load_corpus

    rows = [{"_id": 5, "text": "five"}, {"id": "x", "title": "T", "text": "ex"}, {"id": "e", "title": "E", "text": " "},
            {"id": "n", "text": ""}]
    path = _write(tmp_path / "c.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    items = list(iter_documents([path]))
    docs = {i.doc_id: (i.title, i.text) for i in items if isinstance(i, Document)}
    corpus = {d.doc_id: (d.title, d.text) for d in load_corpus(path).values()}
    assert {k: docs[k] for k in ("5", "x")} == {k: corpus[k] for k in ("5", "x")}  # same ids, titles and texts
    assert docs["e"] == ("E", "E")  # title only: the title is its searchable text
    failures = [(f.reason, Path(f.source).name) for f in items if isinstance(f, DocumentFailure)]
    assert failures == [("empty", "c.jsonl:4")]  # neither title nor text
    assert corpus["e"] == ("E", " ") and corpus["n"] == ("", "")  # a corpus keeps them as they are (judgments)
