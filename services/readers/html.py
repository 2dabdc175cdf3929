"""HTML -> a title and ``Section``s by heading path (h1-h6), without markup: lxml; the main content (``<main>``,
``role=main``, a lone ``<article>``, else ``<body>``) without navigation, header and footer (outside the main
content), asides, forms, scripts, hidden parts and the usual boilerplate classes (sidebars, breadcrumbs, cookie
banners, Sphinx's ``headerlink``); tables as rows ``cell | cell``. Returns ``(title, sections)`` like the other
markup readers (``markdown``, ``rst``; their shared builder is ``sections.SectionBuilder``).
"""

from __future__ import annotations

import re
from typing import Any

from services.readers.records import Section
from services.readers.sections import SectionBuilder, one_line

_DROP_TAGS = {
    "script", "style", "noscript", "template", "svg", "nav", "aside", "form", "button", "select", "input",
    "textarea", "iframe", "object", "embed", "canvas", "dialog", "menu", "head", "title", "link", "meta", "option",
}
_DROP_ROLES = {"navigation", "banner", "contentinfo", "complementary", "search", "menu", "menubar", "dialog",
               "alertdialog", "toolbar"}
_BOILERPLATE = re.compile(
    r"(?:^|[\s_-])(?:nav|navbar|navigation|menu|sidebar|sphinxsidebar|breadcrumbs?|footer|related|cookies?|"
    r"consent|banner|skip-link|skiplink|headerlink|share|social|advert|ads|popup|modal|newsletter|toc-drawer)"
    r"(?:$|[\s_-])",
    re.I,
)
_BLOCK_TAGS = {
    "p", "div", "section", "article", "main", "li", "dt", "dd", "ul", "ol", "dl", "blockquote", "figure",
    "figcaption", "address", "details", "summary", "hr", "br", "center", "caption", "header", "footer", "body",
}
_HEADINGS = {"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6}


def html_sections(markup: str) -> tuple[str, list[Section]]:
    """(``<title>``, else the first heading of the highest level; sections by h1-h6) of an HTML page's main
    content."""
    root = _parse_html(markup)
    if root is None:
        return "", []
    title_el = root.find(".//title")
    title = one_line(title_el.text_content()) if title_el is not None else ""
    body = root.find(".//body")
    main = _main_content(root if body is None else body)
    out = SectionBuilder()
    _walk(main, out, inside_main=main is not body)
    out.flush()
    if not title:
        heads = [el for el in main.iter() if isinstance(el.tag, str) and el.tag.lower() in _HEADINGS]
        first = min(heads, key=lambda el: _HEADINGS[el.tag.lower()], default=None)  # the first of the highest
        title = one_line(_heading_text(first)) if first is not None else ""
    return title, out.sections


def html_to_text_blocks(markup: str) -> tuple[str, str]:
    """(title, text) of an HTML fragment or page, sections joined (Markdown's inline HTML blocks)."""
    title, sections = html_sections(markup)
    return title, "\n".join(s.text for s in sections)


def _parse_html(markup: str) -> Any:
    from lxml import etree
    from lxml import html as lhtml

    if not markup.strip():
        return None
    parser = lhtml.HTMLParser(encoding="utf-8", remove_comments=True, remove_pis=True)
    try:
        return lhtml.document_fromstring(markup.encode("utf-8"), parser=parser)
    except (etree.ParserError, ValueError):
        return None


def _main_content(body: Any) -> Any:
    found = body.find(".//main")
    if found is None:
        found = next(iter(body.xpath(".//*[@role='main']")), None)
    if found is not None:
        return found
    articles = body.findall(".//article")
    return articles[0] if len(articles) == 1 else body


def _dropped(el: Any, inside_main: bool) -> bool:
    tag = el.tag.lower()
    if tag in _DROP_TAGS:
        return True
    if tag in ("header", "footer") and not inside_main:
        return True
    if el.get("hidden") is not None or el.get("aria-hidden") == "true":
        return True
    style = (el.get("style") or "").replace(" ", "").lower()
    if "display:none" in style or "visibility:hidden" in style:
        return True
    if (el.get("role") or "").lower() in _DROP_ROLES:
        return True
    marks = f"{el.get('class') or ''} {el.get('id') or ''}"
    return bool(marks.strip()) and _BOILERPLATE.search(marks) is not None


def _heading_text(el: Any) -> str:
    return one_line(_text_of(el)).rstrip("¶#").strip()


def _text_of(el: Any) -> str:
    """An element's text without its dropped parts (a Sphinx ``headerlink`` pilcrow, a hidden span)."""
    parts = [el.text or ""]
    for child in el:
        if isinstance(child.tag, str) and not _dropped(child, True):
            parts.append(_text_of(child))
        parts.append(child.tail or "")
    return "".join(parts)


def _walk(el: Any, out: SectionBuilder, inside_main: bool) -> None:
    for child in el:
        if not isinstance(child.tag, str):  # a comment or processing instruction: only its tail is text
            if child.tail:
                out.text(child.tail)
            continue
        tag = child.tag.lower()
        if _dropped(child, inside_main):
            pass
        elif tag in _HEADINGS:
            out.heading(_HEADINGS[tag], _heading_text(child))
        elif tag == "pre":
            out.block(child.text_content())
        elif tag == "table":
            _table(child, out)
        elif tag in _BLOCK_TAGS or tag in ("td", "th", "tr"):
            out.end_line()
            if child.text:
                out.text(child.text)
            _walk(child, out, inside_main or tag in ("main", "article"))
            out.end_line()
        else:
            if child.text:
                out.text(child.text)
            _walk(child, out, inside_main)
        if child.tail:
            out.text(child.tail)


def _table(table: Any, out: SectionBuilder) -> None:
    out.end_line()
    caption = table.find("caption")
    if caption is not None:
        out.line(caption.text_content())
    for row in table.iter("tr"):
        cells = [one_line(_text_of(c)) for c in row if isinstance(c.tag, str) and c.tag.lower() in ("td", "th")]
        if any(cells):
            out.line(" | ".join(cells))
