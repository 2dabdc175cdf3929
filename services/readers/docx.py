"""DOCX (Word, OOXML) -> sections under their heading path: zip + lxml, no python-docx (measured in
benchmarks/results/ingest-speed/parsers.md: same text, faster, and every inflated byte is bounded by ``SafeZip``).

Headings are paragraphs whose style is a heading (``Heading 1``..``9``, ``Title``) or carries an outline level;
tables come out one row per line, ``cell | cell | cell``; tabs and breaks are kept as whitespace."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from lxml import etree

from services.core.settings import DocumentSettings
from services.readers.office import SafeZip, local, table_text
from services.readers.protocol import Info, Part
from services.readers.sections import HeadingSections

W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
_HEADING = re.compile(r"^(?:heading|überschrift|titre|titolo|encabezado)\s*(\d)$", re.IGNORECASE)


def read(path: Path, limits: DocumentSettings) -> Iterator[Part]:
    with SafeZip(path, limits, "DOCX document") as z:
        levels = _heading_levels(z)
        body = z.xml("word/document.xml").find(f"{W}body")
        title = z.dc_title("docProps/core.xml")
        sections = HeadingSections()
        for block in body if body is not None else ():
            name = local(block.tag)
            if name == "p":
                text = paragraph_text(block)
                level = levels.get(_style(block), 0) or _outline(block)
                if level and text.strip():
                    yield from sections.heading(level, text)
                    title = title or (text.strip() if level == 1 else "")
                else:
                    sections.add(text)
            elif name == "tbl":
                sections.add(table_text([" ".join(paragraph_text(p) for p in tc.iter(f"{W}p"))
                                         for tc in tr.iterchildren(f"{W}tc")] for tr in block.iter(f"{W}tr")))
            elif name == "sdt":  # a content control (a table of contents, a cover page): its paragraphs
                for p in block.iter(f"{W}p"):
                    sections.add(paragraph_text(p))
        yield from sections.flush()
        yield Info(title=title)


def paragraph_text(p: etree._Element) -> str:
    out: list[str] = []
    for el in p.iter(f"{W}t", f"{W}tab", f"{W}br", f"{W}cr"):
        name = local(el.tag)
        out.append(el.text or "" if name == "t" else "\t" if name == "tab" else "\n")
    return "".join(out)


def _style(p: etree._Element) -> str:
    style = p.find(f"{W}pPr/{W}pStyle")
    return style.get(f"{W}val", "") if style is not None else ""


def _outline(p: etree._Element) -> int:
    lvl = p.find(f"{W}pPr/{W}outlineLvl")
    value = lvl.get(f"{W}val", "") if lvl is not None else ""
    return int(value) + 1 if value.isdigit() and int(value) < 9 else 0


def _heading_levels(z: SafeZip) -> dict[str, int]:
    """Style id -> heading level, from the style names (``heading 2``) and outline levels in styles.xml."""
    levels: dict[str, int] = {}
    if "word/styles.xml" in z.names:
        for style in z.xml("word/styles.xml").iter(f"{W}style"):
            sid = style.get(f"{W}styleId", "")
            name_el = style.find(f"{W}name")
            name = name_el.get(f"{W}val", "") if name_el is not None else ""
            m = _HEADING.match(name) or _HEADING.match(sid)
            if m:
                levels[sid] = int(m.group(1))
            elif name.lower() == "title" or sid == "Title":
                levels[sid] = 1
            elif (lvl := style.find(f"{W}pPr/{W}outlineLvl")) is not None and lvl.get(f"{W}val", "").isdigit():
                levels[sid] = int(lvl.get(f"{W}val", "0")) + 1
    for n in range(1, 10):  # documents without styles.xml still name the built-in ids
        levels.setdefault(f"Heading{n}", n)
    return levels
