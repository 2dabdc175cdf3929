"""The binary-format readers on small documents written by the formats' own libraries: text with its place
(page, slide, heading path), tables as rows, and every hostile file a failure with its reason, the others read."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from kit.documents import make_docx, make_epub, make_odt, make_pdf, make_pptx, make_zip_bomb

from services.core.settings import DocumentSettings
from services.readers import Document, DocumentFailure, Skipped, iter_documents
from services.readers import docx as docx_reader
from services.readers import epub as epub_reader
from services.readers import odt as odt_reader
from services.readers import pdf as pdf_reader
from services.readers import pptx as pptx_reader
from services.readers.office import SafeZip
from services.readers.protocol import Info, ParseFailure
from services.readers.records import Section
from services.readers.sources import count_documents

pytestmark = pytest.mark.unit
LIMITS = DocumentSettings()


def _sections(parts: list[object]) -> list[Section]:
    return [p for p in parts if isinstance(p, Section)]


def _info(parts: list[object]) -> Info:
    info = parts[-1]
    assert isinstance(info, Info)
    return info


def test_pdf_one_section_per_page_under_its_bookmark(tmp_path: Path) -> None:
    path = make_pdf(tmp_path / "m.pdf", ["Intro words\nsecond line", "Setup (steps)", "More setup"],
                    outline=[("Introduction", 0), ("Installing", 1)])
    parts = list(pdf_reader.read(path, LIMITS))
    sections = _sections(parts)
    assert [(s.page, s.heading, s.text) for s in sections] == [
        (1, ("Introduction",), "Intro words\nsecond line"),
        (2, ("Installing",), "Setup (steps)"),
        (3, ("Installing",), "More setup"),  # the bookmark in force carries over
    ]
    assert _info(parts).pages_total == 3


def test_pdf_page_cap_reads_the_first_pages_and_reports_the_rest(tmp_path: Path) -> None:
    path = make_pdf(tmp_path / "long.pdf", [f"page {i}" for i in range(1, 8)])
    items = list(iter_documents([path], limits=DocumentSettings(max_pages=3)))
    doc, failure = items
    assert isinstance(doc, Document) and [s.page for s in doc.sections] == [1, 2, 3]
    assert doc.metadata == {"pages": 7, "pages_skipped": 4}
    assert isinstance(failure, DocumentFailure) and failure.reason == "too_many_pages"
    assert "DPR_DOCUMENTS__MAX_PAGES" in failure.error


def test_pdf_with_blank_pages_keeps_the_pages_with_text(tmp_path: Path) -> None:
    path = make_pdf(tmp_path / "m.pdf", ["one", "", "three"])
    parts = list(pdf_reader.read(path, LIMITS))
    assert [s.page for s in _sections(parts)] == [1, 3]
    assert _info(parts).pages_empty == 1


def test_docx_heading_path_and_table_rows(tmp_path: Path) -> None:
    parts = list(docx_reader.read(make_docx(tmp_path / "g.docx"), LIMITS))
    sections = _sections(parts)
    assert [s.heading for s in sections] == [("Installing",), ("Installing", "On Windows"), ("Using",)]
    assert "name | size | kind\nsetup.exe | 12 MB | installer" in sections[1].text
    assert _info(parts).title == "Field Guide"


def test_pptx_slide_numbers_titles_and_tables(tmp_path: Path) -> None:
    sections = _sections(list(pptx_reader.read(make_pptx(tmp_path / "s.pptx"), LIMITS)))
    assert [(s.page, s.heading) for s in sections] == [
        (1, ("Quarterly results",)), (2, ("Next steps",)), (3, ("Numbers",))]
    assert "Revenue grew in every region." in sections[0].text
    assert "region | growth\nnorth | 12%" in sections[2].text


def test_odt_heading_path_and_table_rows(tmp_path: Path) -> None:
    sections = _sections(list(odt_reader.read(make_odt(tmp_path / "g.odt"), LIMITS)))
    assert [s.heading for s in sections] == [("Installing",), ("Installing", "On Linux")]
    assert "distro | command\ndebian | apt install app" in sections[1].text


def test_epub_chapters_in_spine_order_with_headings(tmp_path: Path) -> None:
    parts = list(epub_reader.read(make_epub(tmp_path / "b.epub"), LIMITS))
    sections = _sections(parts)
    headings = [s.heading for s in sections]
    assert headings.index(("Beginnings", "The harbour")) < headings.index(("Endings",))
    assert any("Ships came in at dawn." in s.text for s in sections)
    assert any("a | b" in s.text for s in sections)
    assert _info(parts).title == "A Small Book"


def test_folder_reads_every_format_by_content_with_its_place(tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    make_pdf(folder / "manual.pdf", ["Chapter text"], outline=[("Start", 0)])
    make_docx(folder / "guide.docx")
    make_pptx(folder / "deck.pptx")
    make_odt(folder / "notes.odt")
    make_epub(folder / "book.epub")
    make_docx(folder / "renamed.bin")  # a DOCX under another name is still a DOCX
    (folder / "readme.md").write_text("# Readme\n\nplain text still works\n")
    items = {i.doc_id: i for i in iter_documents([folder]) if isinstance(i, Document)}
    assert set(items) == {"docs/manual.pdf", "docs/guide.docx", "docs/deck.pptx", "docs/notes.odt",
                          "docs/book.epub", "docs/renamed.bin", "docs/readme.md"}  # text files still read
    assert {d: items[d].format for d in items if d != "docs/readme.md"} == {
        "docs/manual.pdf": "pdf", "docs/guide.docx": "docx", "docs/deck.pptx": "pptx", "docs/notes.odt": "odt",
        "docs/book.epub": "epub", "docs/renamed.bin": "docx"}
    assert items["docs/manual.pdf"].sections[0].page == 1
    assert items["docs/manual.pdf"].sections[0].heading == ("Start",)
    assert json.loads(json.dumps(items["docs/guide.docx"].to_json()))["sections"][1]["heading"] == [
        "Installing", "On Windows"]


def test_a_pdf_name_holding_html_is_read_as_html_and_text_is_refused(tmp_path: Path) -> None:
    (tmp_path / "saved.pdf").write_text("<!doctype html><html><head><title>Saved page</title></head>"
                                        "<body><p>Words from the web.</p></body></html>")
    (tmp_path / "fake.pdf").write_text("just some words, not a PDF")
    items = list(iter_documents([tmp_path]))
    html = next(i for i in items if isinstance(i, Document))
    assert html.format == "html" and html.text == "Words from the web." and html.title == "Saved page"
    refused = next(i for i in items if isinstance(i, DocumentFailure))
    assert refused.reason == "mislabelled" and "fake.pdf" in refused.error and "plain text" in refused.error


def test_hostile_documents_fail_alone_with_reason_and_fix(tmp_path: Path) -> None:
    good = make_pdf(tmp_path / "a-good.pdf", ["fine words"])
    make_pdf(tmp_path / "b-locked.pdf", ["secret"], password="pw")
    make_pdf(tmp_path / "c-scan.pdf", ["", ""])
    (tmp_path / "d-cut.pdf").write_bytes(good.read_bytes()[:300])
    make_zip_bomb(tmp_path / "e-bomb.docx", make_docx(tmp_path / "template.bin"))
    (tmp_path / "template.bin").unlink()
    (tmp_path / "f-notzip.docx").write_bytes(b"PK\x03\x04 broken")
    items = list(iter_documents([tmp_path]))
    docs = [i.doc_id for i in items if isinstance(i, Document)]
    reasons = {Path(i.source).name: i.reason for i in items if isinstance(i, DocumentFailure)}
    assert docs == [f"{tmp_path.name}/a-good.pdf"]
    assert reasons == {"b-locked.pdf": "encrypted", "c-scan.pdf": "no_text_layer", "d-cut.pdf": "corrupt",
                       "e-bomb.docx": "zip_bomb", "f-notzip.docx": "mislabelled"}
    errors = {Path(i.source).name: i.error for i in items if isinstance(i, DocumentFailure)}
    assert "qpdf --decrypt" in errors["b-locked.pdf"]
    assert "OCR is not enabled" in errors["c-scan.pdf"]
    assert "DPR_DOCUMENTS__MAX_UNCOMPRESSED_BYTES" in errors["e-bomb.docx"]


def test_a_truncated_pdf_keeps_the_pages_that_survive(tmp_path: Path) -> None:
    whole = make_pdf(tmp_path / "whole.pdf", [f"page {i} text" for i in range(1, 21)]).read_bytes()
    cut = tmp_path / "cut.pdf"
    cut.write_bytes(whole[: len(whole) * 2 // 3])
    doc, failure = list(iter_documents([cut]))
    assert isinstance(doc, Document) and doc.metadata.get("salvaged") is True
    assert 5 < len(doc.sections) < 20 and doc.sections[0].text == "page 1 text"
    assert isinstance(failure, DocumentFailure) and failure.reason == "damaged"


def test_zip_bomb_limits_hold_before_and_during_inflation(tmp_path: Path) -> None:
    template = make_docx(tmp_path / "t.docx")
    total = make_zip_bomb(tmp_path / "total.docx", template, inflated=60_000_000)
    with pytest.raises(ParseFailure) as declared:  # the central directory's sizes, checked before inflating
        SafeZip(total, DocumentSettings(max_uncompressed_bytes=10_000_000, max_compression_ratio=1e9), "DOCX")
    assert declared.value.reason == "zip_bomb" and "declare" in declared.value.message
    lying = make_zip_bomb(tmp_path / "lying.docx", template, inflated=60_000_000, lie=True)
    z = SafeZip(lying, LIMITS, "DOCX")  # its header claims 1 KiB: the read stops there, whatever follows
    with pytest.raises(ParseFailure) as inflated:
        z.read("word/bomb.xml")
    assert inflated.value.reason in ("zip_bomb", "corrupt") and z.inflated <= 1025


def test_xml_entities_are_never_expanded(tmp_path: Path) -> None:
    template = make_docx(tmp_path / "t.docx")
    bomb = ('<?xml version="1.0"?><!DOCTYPE d [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;">'
            '<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;">]>'
            '<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body><w:p><w:r>'
            '<w:t>&c;</w:t></w:r></w:p></w:body></w:document>')
    out = tmp_path / "laughs.docx"
    with zipfile.ZipFile(template) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            dst.writestr(info, bomb if info.filename == "word/document.xml" else src.read(info))
    text = "".join(s.text for s in _sections(list(docx_reader.read(out, LIMITS))))
    assert "aaaaaaaaaa" not in text


def test_unsupported_types_name_what_is_read(tmp_path: Path) -> None:
    (tmp_path / "sheet.csv").write_text("a,b\n1,2\n")
    (tmp_path / "old.doc").write_bytes(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\0" * 100)
    skipped = {Path(i.source).name: i.reason for i in iter_documents([tmp_path]) if isinstance(i, Skipped)}
    assert ".pdf" in skipped["sheet.csv"] and ".docx" in skipped["sheet.csv"] and ".epub" in skipped["sheet.csv"]
    assert "legacy Office" in skipped["old.doc"]


def test_count_includes_binary_documents(tmp_path: Path) -> None:
    make_pdf(tmp_path / "a.pdf", ["x"])
    make_docx(tmp_path / "b.docx")
    (tmp_path / "c.md").write_text("# c\n")
    assert count_documents([tmp_path]) == 3


def test_a_deeply_nested_jsonl_row_fails_alone_naming_its_line(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    deep = '{"id": "b", "text": "deep", "metadata": ' + '{"a": ' * 5000 + "1" + "}" * 5000 + "}"
    path.write_text("\n".join([json.dumps({"id": "a", "text": "first"}), deep,
                               json.dumps({"id": "c", "text": "third"})]) + "\n")
    items = list(iter_documents([path]))
    assert [i.doc_id for i in items if isinstance(i, Document)] == ["a", "c"]
    failure = next(i for i in items if isinstance(i, DocumentFailure))
    assert failure.source.endswith("rows.jsonl:2") and failure.reason == "invalid_json"
    assert "nests" in failure.error
