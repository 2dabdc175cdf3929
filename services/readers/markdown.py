"""Markdown -> a title and ``Section``s by heading path, without markup: markdown-it-py (CommonMark + tables,
the parser ``rich`` already brings), a YAML front matter dropped, inline HTML blocks read by ``html``, tables as
rows ``cell | cell``, code kept verbatim. Returns ``(title, sections)`` like the other markup readers (``rst``,
``html``; their shared builder is ``sections.SectionBuilder``).
"""

from __future__ import annotations

import re
from typing import Any

from services.readers.html import html_to_text_blocks
from services.readers.records import Section
from services.readers.sections import SectionBuilder, one_line

_FRONT_MATTER = re.compile(r"\A---[ \t]*\n(?:[^\n]*\n)*?(?:---|\.\.\.)[ \t]*(?:\n|\Z)")


def markdown_sections(text: str) -> tuple[str, list[Section]]:
    """(first ``#`` heading or "", sections) of a Markdown text."""
    from markdown_it import MarkdownIt

    front = _FRONT_MATTER.match(text)
    if front and re.search(r"^\w[\w -]*:", front.group(), re.M):
        text = text[front.end():]
    tokens = MarkdownIt("commonmark").enable("table").enable("strikethrough").parse(text)
    out = SectionBuilder()
    title = ""
    row: list[str] = []  # the cells of the table row being read
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        kind = tok.type
        if kind == "heading_open":
            heading = _md_inline(tokens[i + 1]) if i + 1 < len(tokens) else ""
            level = int(tok.tag[1:])
            if level == 1 and not title:
                title = one_line(heading)
            out.heading(level, heading)
            i += 3  # open, inline, close
            continue
        if kind == "inline":
            if i > 0 and tokens[i - 1].type in ("th_open", "td_open"):  # a table cell
                row.append(one_line(_md_inline(tok)))
            else:
                out.line(_md_inline(tok))
        elif kind in ("fence", "code_block"):
            out.block(tok.content)
        elif kind == "html_block":
            _, html_text = html_to_text_blocks(tok.content)
            if html_text:
                out.block(html_text)
        elif kind == "tr_open":
            row = []
        elif kind == "tr_close":
            out.line(" | ".join(c for c in row))
            row = []
        i += 1
    out.flush()
    return title, out.sections


def _md_inline(tok: Any) -> str:
    """The text of an inline token: code spans, link and image texts kept; markup and inline HTML dropped."""
    parts: list[str] = []
    for child in tok.children or ():
        if child.type in ("text", "code_inline"):
            parts.append(child.content)
        elif child.type in ("softbreak", "hardbreak"):
            parts.append("\n")
        elif child.type == "image":
            parts.append(child.content or "")
    return "".join(parts)
