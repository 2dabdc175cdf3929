"""ODT (OpenDocument text) -> sections under their heading path: zip + lxml on content.xml, no odfpy
(benchmarks/results/ingest-speed/parsers.md). Headings are ``text:h`` with their outline level; lists, sections and
frames are read through; tables come out one row per line, ``cell | cell``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from lxml import etree

from services.core.settings import DocumentSettings
from services.readers.office import SafeZip, local, table_text
from services.readers.protocol import Info, Part
from services.readers.sections import HeadingSections

TEXT = "{urn:oasis:names:tc:opendocument:xmlns:text:1.0}"
TABLE = "{urn:oasis:names:tc:opendocument:xmlns:table:1.0}"
OFFICE = "{urn:oasis:names:tc:opendocument:xmlns:office:1.0}"
_SKIP = {"tracked-changes", "sequence-decls", "variable-decls", "user-field-decls", "table-of-content-source",
         "note-citation"}


def read(path: Path, limits: DocumentSettings) -> Iterator[Part]:
    with SafeZip(path, limits, "ODT document") as z:
        root = z.xml("content.xml")
        body = root.find(f"{OFFICE}body/{OFFICE}text")
        sections = HeadingSections()
        title = ""
        if body is not None:
            for kind, level, text in _blocks(body):
                if kind == "h":
                    yield from sections.heading(level, text)
                    title = title or (text.strip() if level == 1 else "")
                else:
                    sections.add(text)
        yield from sections.flush()
        yield Info(title=z.dc_title("meta.xml") or title)


def _blocks(el: etree._Element) -> Iterator[tuple[str, int, str]]:
    """(``h``, level, text) for a heading, (``p``, 0, text) for a paragraph or a table's rows, in order."""
    for child in el:
        name = local(child.tag)
        if name == "h":
            level = child.get(f"{TEXT}outline-level", "1")
            yield "h", int(level) if level.isdigit() else 1, inline_text(child)
        elif name == "p":
            yield "p", 0, inline_text(child)
        elif name == "table" and child.tag == f"{TABLE}table":
            yield "p", 0, table_text([" ".join(inline_text(p) for p in tc.iter(f"{TEXT}p", f"{TEXT}h"))
                                      for tc in tr.iterchildren(f"{TABLE}table-cell")]
                                     for tr in child.iter(f"{TABLE}table-row"))
        elif name not in _SKIP:
            yield from _blocks(child)  # lists, list items, sections, frames


def inline_text(el: etree._Element) -> str:
    out = [el.text or ""]
    for child in el:
        name = local(child.tag)
        if name == "s":
            out.append(" " * int(child.get(f"{TEXT}c", "1") or 1))
        elif name == "tab":
            out.append("\t")
        elif name == "line-break":
            out.append("\n")
        elif name not in ("note", "annotation"):  # footnotes and comments are not the running text
            out.append(inline_text(child))
        out.append(child.tail or "")
    return "".join(out)
