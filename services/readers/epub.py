"""EPUB -> sections under their heading path: zip + lxml, no ebooklib (benchmarks/results/ingest-speed/parsers.md).
The chapters are read in spine order (container.xml -> the package document -> its spine); within a chapter,
``h1``..``h3`` start a section under their path (deeper headings stay in the text); tables come out one row per
line, ``cell | cell``; scripts, styles and navigation are dropped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from lxml import etree

from services.core.settings import DocumentSettings
from services.readers.office import SafeZip, local, parse_html, resolve, table_text
from services.readers.protocol import Info, ParseFailure, Part
from services.readers.sections import HeadingSections

OPF = "{http://www.idpf.org/2007/opf}"
DC = "{http://purl.org/dc/elements/1.1/}"
_HEADINGS = {"h1": 1, "h2": 2, "h3": 3}
_BLOCKS = {"p", "li", "pre", "blockquote", "dt", "dd", "h4", "h5", "h6", "caption", "figcaption", "address"}
_DROP = {"script", "style", "nav", "head", "noscript", "template", "svg", "math"}


def read(path: Path, limits: DocumentSettings) -> Iterator[Part]:
    with SafeZip(path, limits, "EPUB book") as z:
        container = z.xml("META-INF/container.xml")
        rootfile = next((el.get("full-path", "") for el in container.iter() if local(el.tag) == "rootfile"), "")
        if not rootfile:
            raise ParseFailure("corrupt", "is not a complete EPUB: META-INF/container.xml names no package "
                               "document; re-export the book")
        opf = z.xml(rootfile)
        manifest = {i.get("id", ""): (resolve(rootfile, i.get("href", "")), i.get("media-type", ""))
                    for i in opf.iter(f"{OPF}item")}
        spine = [manifest[r.get("idref", "")] for r in opf.iter(f"{OPF}itemref") if r.get("idref", "") in manifest]
        title = next((" ".join((t.text or "").split()) for t in opf.iter(f"{DC}title")), "")
        info = Info(title=title)
        for name, media in spine:
            if "html" not in media or name not in z.names:
                continue
            root = parse_html(z.read(name))
            body = root.find(".//body") if root is not None else None
            if body is None:
                continue
            sections = HeadingSections()
            yield from _walk(body, sections)
            yield from sections.flush()
        yield info


def _walk(el: etree._Element, sections: HeadingSections) -> Iterator[Part]:
    for child in el:
        name = local(child.tag).lower()
        if name in _DROP:
            continue
        if name in _HEADINGS:
            yield from sections.heading(_HEADINGS[name], _text(child))
        elif name == "table":
            sections.add(table_text([_text(td) for td in tr if local(td.tag).lower() in ("td", "th")]
                                    for tr in child.iter("tr")))
        elif name in _BLOCKS:
            sections.add(_text(child) if name != "pre" else "".join(child.itertext()))
        elif len(child):
            if child.text and child.text.strip():
                sections.add(child.text)
            yield from _walk(child, sections)
        else:
            sections.add(_text(child))
        if child.tail and child.tail.strip():
            sections.add(child.tail)


def _text(el: etree._Element) -> str:
    return " ".join(etree.tostring(el, method="text", encoding="unicode", with_tail=False).split())
