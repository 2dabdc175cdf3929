from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from kit.documents import make_docx, make_epub, make_odt, make_pdf, make_pptx

from services.readers.sniff import sniff, sniff_bytes

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("head", "kind"), [
    (b"%PDF-1.7\n%\xe2\xe3", "pdf"),
    (b"\n\n  junk before %PDF-1.4\n", "pdf"),  # readers accept leading junk in the first KiB
    (b"<!DOCTYPE html><html><body>x</body></html>", "html"),
    (b"\xef\xbb\xbf  \n<html lang='en'>", "html"),
    (b"<?xml version='1.0'?>\n<html xmlns='http://www.w3.org/1999/xhtml'>", "html"),
    (b"<!-- saved --><HEAD><title>t</title>", "html"),
    (b"Plain words about <html> tags", "text"),
    (b"# Title\n\nSome markdown", "text"),
    (b"\x89PNG\r\n\x1a\n", "binary"),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1rest", "ole"),
    (b"abc\x00def", "binary"),
])
def test_kind_by_leading_bytes(head: bytes, kind: str) -> None:
    assert sniff_bytes(head) == kind


def test_containers_by_their_parts(tmp_path: Path) -> None:
    assert sniff(make_pdf(tmp_path / "x.bin", ["hi"])) == "pdf"
    assert sniff(make_docx(tmp_path / "a")) == "docx"  # no suffix at all: content decides
    assert sniff(make_pptx(tmp_path / "b.zip")) == "pptx"
    assert sniff(make_odt(tmp_path / "c.docx")) == "odt"  # a suffix that lies loses
    assert sniff(make_epub(tmp_path / "d.txt")) == "epub"
    with zipfile.ZipFile(tmp_path / "plain.zip", "w") as z:
        z.writestr("readme.txt", "hello")
    assert sniff(tmp_path / "plain.zip") == "zip"
    (tmp_path / "broken.docx").write_bytes(b"PK\x03\x04" + b"\x00" * 40)
    assert sniff(tmp_path / "broken.docx") == "zip"  # a damaged zip is a zip, never a crash


def test_an_html_page_named_pdf_is_html(tmp_path: Path) -> None:
    page = tmp_path / "manual.pdf"
    page.write_text("<!doctype html><html><head><title>Manual</title></head><body><p>Real words.</p></body></html>")
    assert sniff(page) == "html"
