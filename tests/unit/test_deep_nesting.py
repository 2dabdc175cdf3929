"""Nesting in every format the product reads never reaches a recursion limit unguarded (issue 43): a document
nested far past any parser's depth is read or fails alone with a reason, and the other documents of the folder
are read. (JSONL rows and JSON bodies over the API: test_readers_formats.py and test_api_nesting.py.)"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from kit.documents import make_docx, make_epub

from services.readers import Document, DocumentFailure, iter_documents

pytestmark = pytest.mark.unit

DEPTH = 20_000


def _rewrite(src: Path, dest: Path, member_suffix: str, edit: bytes, marker: bytes) -> Path:
    """``src`` with ``edit`` inserted after ``marker`` in its first member ending in ``member_suffix``; stored
    uncompressed, so the depth and not a compression ratio is what the reader meets."""
    done = False
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if not done and info.filename.endswith(member_suffix) and marker in data:
                data = data.replace(marker, marker + edit, 1)
                done = True
            zout.writestr(info.filename, data)
    assert done, f"{member_suffix} with {marker!r} not found in {src}"
    return dest


def test_deeply_nested_documents_are_read_or_fail_alone(tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "deep.html").write_text(
        "<html><body><p>Shallow words stay.</p>" + "<div>" * DEPTH + "deep" + "</div>" * DEPTH + "</body></html>")
    (folder / "deep.md").write_text("Shallow words stay.\n\n" + "> " * DEPTH + "quote\n\n" + "- " * DEPTH + "x\n")
    rst_list = "".join("  " * i + "- item\n" for i in range(500))
    (folder / "deep.rst").write_text("Title\n=====\n\nShallow.\n\n" + rst_list)
    docx_nest = b"<w:sdt>" * DEPTH + b"<w:sdtContent/>" + b"</w:sdt>" * DEPTH
    _rewrite(make_docx(tmp_path / "src.docx"), folder / "deep.docx", "word/document.xml", docx_nest, b"<w:body>")
    epub_nest = b"<div>" * DEPTH + b"deep" + b"</div>" * DEPTH
    _rewrite(make_epub(tmp_path / "src.epub"), folder / "deep.epub", ".xhtml", epub_nest, b"<body>")
    (folder / "ok.txt").write_text("Plain words in a plain file.")

    items = {getattr(item, "doc_id", ""): item for item in iter_documents([folder])}

    assert isinstance(items["docs/ok.txt"], Document)
    assert isinstance(items["docs/deep.rst"], Document)
    for name in ("deep.html", "deep.md", "deep.docx", "deep.epub"):
        item = items[f"docs/{name}"]
        assert isinstance(item, Document | DocumentFailure), (name, item)
        if isinstance(item, DocumentFailure):  # a reason and the file named, never a RecursionError's text
            assert item.reason and name in item.error and "recursion" not in item.error.lower(), item
    for name in ("deep.html", "deep.md"):  # what sits above the nesting is kept
        item = items[f"docs/{name}"]
        assert isinstance(item, Document) and "Shallow words stay." in item.text, item
    docx = items["docs/deep.docx"]
    assert isinstance(docx, DocumentFailure) and "depth" in docx.error.lower(), docx
