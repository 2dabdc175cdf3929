"""Small real documents for the reader tests, written by the formats' own libraries (pypdf, python-docx,
python-pptx, odfpy, ebooklib), and hostile ones (encrypted, truncated, text-less, zip bombs); ``THREE_TOPICS``,
three one-passage documents on unrelated topics (cats, the Nile, Python) for the feedback tests;
``KOREAN_ENGLISH``, three Korean and three English text files for the multilingual model; ``write_folder``, a
folder of text files to ingest."""

from __future__ import annotations

import gzip
import json
import zipfile
from pathlib import Path

from services.readers import Document

THREE_TOPICS = [
    Document(doc_id="cats", title="Cats", text="Cats are small carnivores. They purr and hunt mice at night.",
             source="t"),
    Document(doc_id="nile", title="Rivers", text="The Nile is the longest river in Africa and flows north.",
             source="t"),
    Document(doc_id="py", title="Python", text="Python reads a file line by line with a for loop.", source="t"),
]

KOREAN_ENGLISH = {  # a Korean question finds the Korean document, an English one the English
    "seoul.txt": "서울특별시는 대한민국의 수도이자 최대 도시이다. 조선 시대부터 한양이라 불렸으며 "
                 "한강이 도시를 가로지른다.",
    "kimchi.txt": "김치는 배추와 무를 소금에 절이고 고춧가루, 마늘, 젓갈로 양념하여 발효시킨 한국의 전통 음식이다.",
    "sejong.txt": "세종대왕은 조선의 제4대 왕으로, 1443년에 백성을 위하여 훈민정음을 창제하였다.",
    "nile.txt": "The Nile is the longest river in Africa and flows north into the Mediterranean Sea.",
    "python.txt": "Python is a programming language; use a for loop to read a file line by line.",
    "cats.txt": "Cats are small domesticated carnivores that purr when content and hunt mice at night.",
}


def write_folder(folder: Path, files: dict[str, str]) -> Path:
    """``folder`` (made if need be) holding one UTF-8 file per name -> text."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def make_pdf(path: Path, pages: list[str], outline: list[tuple[str, int]] = (), password: str | None = None,
             ) -> Path:  # type: ignore[assignment]
    """A PDF with one page per string (Helvetica text lines; an empty string is a page with no text), an outline
    of (title, 0-based page) bookmarks, optionally encrypted with a user password."""
    from pypdf import PdfWriter
    from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

    writer = PdfWriter()
    font = DictionaryObject({
        NameObject("/Type"): NameObject("/Font"), NameObject("/Subtype"): NameObject("/Type1"),
        NameObject("/BaseFont"): NameObject("/Helvetica"),
    })
    font_ref = writer._add_object(font)
    for text in pages:
        page = writer.add_blank_page(width=612, height=792)
        ops = []
        if text:
            ops.append("BT /F1 12 Tf 14 TL 72 720 Td")
            for line in text.split("\n"):
                escaped = line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
                ops.append(f"({escaped}) Tj T*")
            ops.append("ET")
        else:
            ops.append("0 0 1 rg 72 72 200 200 re f")  # a drawing: a page with ink and no text, like a scan
        stream = DecodedStreamObject()
        stream.set_data("\n".join(ops).encode("latin-1"))
        page[NameObject("/Contents")] = writer._add_object(stream)
        page[NameObject("/Resources")] = DictionaryObject({
            NameObject("/Font"): DictionaryObject({NameObject("/F1"): font_ref})})
    parents: dict[int, object] = {}
    for title, page_index in outline:
        parents[page_index] = writer.add_outline_item(title=title, page_number=page_index)
    if password is not None:
        writer.encrypt(user_password=password, owner_password=password + "-owner", algorithm="AES-128")
    with open(path, "wb") as f:
        writer.write(f)
    return path


def make_docx(path: Path) -> Path:
    import docx

    d = docx.Document()
    d.core_properties.title = "Field Guide"
    d.add_heading("Installing", level=1)
    d.add_paragraph("Run the installer and follow the prompts.")
    d.add_heading("On Windows", level=2)
    d.add_paragraph("Double-click setup.exe to begin.")
    table = d.add_table(rows=2, cols=3)
    for r, row in enumerate((("name", "size", "kind"), ("setup.exe", "12 MB", "installer"))):
        for c, value in enumerate(row):
            table.cell(r, c).text = value
    d.add_heading("Using", level=1)
    d.add_paragraph("Open the app from the start menu.")
    d.save(str(path))
    return path


def make_pptx(path: Path) -> Path:
    from pptx import Presentation
    from pptx.util import Inches

    prs = Presentation()
    for title, body in (("Quarterly results", "Revenue grew in every region."),
                        ("Next steps", "Hire two engineers.")):
        slide = prs.slides.add_slide(prs.slide_layouts[1])
        slide.shapes.title.text = title
        slide.placeholders[1].text = body
    slide = prs.slides.add_slide(prs.slide_layouts[5])
    slide.shapes.title.text = "Numbers"
    shape = slide.shapes.add_table(2, 2, Inches(1), Inches(2), Inches(4), Inches(1))
    for r, row in enumerate((("region", "growth"), ("north", "12%"))):
        for c, value in enumerate(row):
            shape.table.cell(r, c).text = value
    prs.save(str(path))
    return path


def make_odt(path: Path) -> Path:
    from odf.opendocument import OpenDocumentText
    from odf.table import Table, TableCell, TableColumn, TableRow
    from odf.text import H, P

    doc = OpenDocumentText()
    doc.text.addElement(H(outlinelevel=1, text="Installing"))
    doc.text.addElement(P(text="Run the installer and follow the prompts."))
    doc.text.addElement(H(outlinelevel=2, text="On Linux"))
    doc.text.addElement(P(text="Use the package manager."))
    table = Table(name="T")
    table.addElement(TableColumn(numbercolumnsrepeated=2))
    for row in (("distro", "command"), ("debian", "apt install app")):
        tr = TableRow()
        for value in row:
            cell = TableCell()
            cell.addElement(P(text=value))
            tr.addElement(cell)
        table.addElement(tr)
    doc.text.addElement(table)
    doc.save(str(path))
    return path


def make_epub(path: Path) -> Path:
    from ebooklib import epub

    book = epub.EpubBook()
    book.set_identifier("id-1")
    book.set_title("A Small Book")
    book.set_language("en")
    chapters = []
    for i, (title, body) in enumerate((("Beginnings", "<h2>The harbour</h2><p>Ships came in at dawn.</p>"),
                                       ("Endings", "<p>The lighthouse went dark.</p><table><tr><td>a</td>"
                                                   "<td>b</td></tr></table>")), start=1):
        c = epub.EpubHtml(title=title, file_name=f"ch{i}.xhtml", lang="en")
        c.content = f"<html><body><h1>{title}</h1>{body}</body></html>"
        book.add_item(c)
        chapters.append(c)
    book.toc = chapters
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", *chapters]
    epub.write_epub(str(path), book)
    return path


def make_zip_bomb(path: Path, template: Path, inflated: int = 200_000_000, lie: bool = False) -> Path:
    """``template`` (a DOCX/PPTX/ODT/EPUB) with an extra part of ``inflated`` zero bytes (compresses ~1000x).
    ``lie``: the central directory declares the part tiny (the bounded read must still stop it)."""
    with zipfile.ZipFile(template) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info))
        with dst.open("word/bomb.xml" if "word/document.xml" in src.namelist() else "bomb.xml", "w") as f:
            chunk = b"\0" * (1 << 20)
            for _ in range(inflated >> 20):
                f.write(chunk)
    if lie:
        _declare_small(path, "bomb.xml")
    return path


def _declare_small(path: Path, suffix: str) -> None:
    """Rewrite the uncompressed size of the entry ending in ``suffix`` to 1 KiB in both headers."""
    import struct

    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(suffix))
    # local header: uncompressed size at offset 22
    struct.pack_into("<I", data, info.header_offset + 22, 1024)
    cd = data.rfind(b"PK\x01\x02" + bytes(0), 0)
    pos = data.find(b"PK\x01\x02")
    while pos != -1:
        name_len = struct.unpack_from("<H", data, pos + 28)[0]
        name = bytes(data[pos + 46: pos + 46 + name_len]).decode()
        if name.endswith(suffix):
            struct.pack_into("<I", data, pos + 24, 1024)
        pos = data.find(b"PK\x01\x02", pos + 4)
    del cd
    path.write_bytes(bytes(data))


def scifact_jsonl(shared_data: Path, path: Path, docs: int) -> Path:
    """The first ``docs`` SciFact abstracts (``shared_data``/beir-scifact) as a dpr JSONL file at ``path``."""
    with gzip.open(shared_data / "beir-scifact" / "corpus.jsonl.gz", "rt", encoding="utf-8") as f, \
            path.open("w", encoding="utf-8") as out:
        for i, line in enumerate(f):
            if i >= docs:
                break
            d = json.loads(line)
            out.write(json.dumps({"id": d["_id"], "title": d.get("title", ""), "text": d["text"]}) + "\n")
    return path
