"""PPTX (PowerPoint, OOXML) -> one section per slide: ``page`` is the slide number, the heading its title. zip + lxml,
no python-pptx (benchmarks/results/ingest-speed/parsers.md). Slides come in presentation order (the slide list in
presentation.xml, not the part names); tables come out one row per line, ``cell | cell``; a slide's notes are kept after
its text."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from lxml import etree

from services.core.settings import DocumentSettings
from services.readers.office import SafeZip, local, resolve, table_text
from services.readers.protocol import Info, ParseFailure, Part
from services.readers.records import Section

P = "{http://schemas.openxmlformats.org/presentationml/2006/main}"
A = "{http://schemas.openxmlformats.org/drawingml/2006/main}"
R = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}"
REL = "{http://schemas.openxmlformats.org/package/2006/relationships}"
_TITLES = {"title", "ctrTitle"}


def read(path: Path, limits: DocumentSettings) -> Iterator[Part]:
    with SafeZip(path, limits, "PPTX presentation") as z:
        slides = _slide_parts(z)
        info = Info(pages_total=len(slides), pages_skipped=max(0, len(slides) - limits.max_pages))
        for number, part in enumerate(slides[: limits.max_pages], start=1):
            try:
                title, text = _slide(z, part)
            except ParseFailure as e:
                if e.reason == "zip_bomb":
                    raise
                info.pages_failed.append(number)
                continue
            if not text.strip():
                info.pages_empty += 1
            yield Section(text, heading=(title,) if title else (), page=number)
            if number == 1:
                info.title = title
        yield info


def _rels(z: SafeZip, part: str) -> dict[str, str]:
    rels_name = resolve(part, f"_rels/{part.rsplit('/', 1)[-1]}.rels")
    if rels_name not in z.names:
        return {}
    return {r.get("Id", ""): resolve(part, r.get("Target", "")) for r in z.xml(rels_name).iter(f"{REL}Relationship")
            if r.get("TargetMode") != "External"}


def _slide_parts(z: SafeZip) -> list[str]:
    pres = z.xml("ppt/presentation.xml")
    rels = _rels(z, "ppt/presentation.xml")
    return [rels[s.get(f"{R}id", "")] for s in pres.iter(f"{P}sldId") if s.get(f"{R}id", "") in rels]


def _paragraphs(el: etree._Element) -> list[str]:
    out = []
    for p in el.iter(f"{A}p"):
        text = "".join(t.text or "" if local(t.tag) == "t" else "\n" for t in p.iter(f"{A}t", f"{A}br"))
        if text.strip():
            out.append(text.strip())
    return out


def _slide(z: SafeZip, part: str) -> tuple[str, str]:
    root = z.xml(part)
    title, lines = "", []
    for el in root.iter(f"{P}sp", f"{P}graphicFrame"):
        if local(el.tag) == "graphicFrame":
            for tbl in el.iter(f"{A}tbl"):
                if table := table_text([" ".join(_paragraphs(tc)) for tc in tr.iterchildren(f"{A}tc")]
                                       for tr in tbl.iter(f"{A}tr")):
                    lines.append(table)
            continue
        ph = el.find(f"{P}nvSpPr/{P}nvPr/{P}ph")
        paras = _paragraphs(el)
        if ph is not None and ph.get("type") in _TITLES and not title:
            title = " ".join(" ".join(paras).split())
        lines.extend(paras)
    notes = [t for t in _rels(z, part).values() if "notesSlide" in t and t in z.names]
    for note in notes[:1]:
        body = [p for sp in z.xml(note).iter(f"{P}sp") if _is_body(sp) for p in _paragraphs(sp)]
        lines.extend(body)
    return title, "\n".join(lines)


def _is_body(sp: etree._Element) -> bool:
    ph = sp.find(f"{P}nvSpPr/{P}nvPr/{P}ph")
    return ph is not None and ph.get("type") == "body"
