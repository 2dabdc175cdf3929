"""Markdown, reStructuredText and HTML -> a title and ``Section``s: the text a reader sees, by heading path.

The towers read prose, not markup: roles (``:func:`open```), inline literals (````f.readline()````), link targets,
directive lines (``.. note::``), code-block markers, table borders and HTML navigation never reach them. What a
person reads on the rendered page stays, code included (a literal block is text a question may quote).

- Markdown: markdown-it-py (CommonMark + tables, the parser ``rich`` already brings), a YAML front matter dropped.
- reStructuredText (``.rst``, Sphinx's ``.rst.txt``): a line reader of the constructs documentation uses; a full
  docutils parse would stop at every Sphinx role and directive it does not know.
- HTML: lxml; the main content (``<main>``, ``role=main``, a lone ``<article>``, else ``<body>``) without
  navigation, header and footer (outside the main content), asides, forms, scripts, hidden parts and the usual
  boilerplate classes (sidebars, breadcrumbs, cookie banners, Sphinx's ``headerlink``); tables as rows
  ``cell | cell``.

Each function returns ``(title, sections)``: one section per heading (its text without the heading line, its
heading path outermost first) plus the text before the first heading (empty path).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from services.readers.records import Section

_SPACE = re.compile(r"\s+")


def _one_line(text: str) -> str:
    return _SPACE.sub(" ", text).strip()


@dataclass
class _Builder:
    """Sections by heading path: ``text`` adds to the paragraph being read (``end_line`` ends it: ``clean``
    removes its inline markup, whitespace is collapsed), ``line`` adds a finished line, ``block`` verbatim text
    (code), ``heading`` closes the current section and opens one at ``level``."""

    clean: Callable[[str], str] | None = None
    sections: list[Section] = field(default_factory=list)
    stack: list[tuple[int, str]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    inline: list[str] = field(default_factory=list)

    def text(self, piece: str) -> None:
        self.inline.append(piece)

    def end_line(self) -> None:
        raw = "".join(self.inline)
        self.inline.clear()
        line = _one_line(self.clean(raw) if self.clean is not None and raw.strip() else raw)
        if line:
            self.lines.append(line)

    def line(self, text: str) -> None:
        self.end_line()
        line = _one_line(text)
        if line:
            self.lines.append(line)

    def block(self, text: str) -> None:
        self.end_line()
        text = text.strip("\n").rstrip()
        if text.strip():
            self.lines.append(text)

    def heading(self, level: int, title: str) -> None:
        self.flush()
        title = _one_line(title)
        while self.stack and self.stack[-1][0] >= level:
            self.stack.pop()
        if title:
            self.stack.append((level, title))

    def flush(self) -> None:
        self.end_line()
        text = "\n".join(self.lines).strip()
        self.lines.clear()
        if text:
            self.sections.append(Section(text, heading=tuple(t for _, t in self.stack)))


# --- Markdown ----------------------------------------------------------------------------------------------------

_FRONT_MATTER = re.compile(r"\A---[ \t]*\n(?:[^\n]*\n)*?(?:---|\.\.\.)[ \t]*(?:\n|\Z)")


def markdown_sections(text: str) -> tuple[str, list[Section]]:
    """(first ``#`` heading or "", sections) of a Markdown text."""
    from markdown_it import MarkdownIt

    front = _FRONT_MATTER.match(text)
    if front and re.search(r"^\w[\w -]*:", front.group(), re.M):
        text = text[front.end():]
    tokens = MarkdownIt("commonmark").enable("table").enable("strikethrough").parse(text)
    out = _Builder()
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
                title = _one_line(heading)
            out.heading(level, heading)
            i += 3  # open, inline, close
            continue
        if kind == "inline":
            if _in_table(tokens, i):
                row.append(_one_line(_md_inline(tok)))
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


def _in_table(tokens: list[Any], i: int) -> bool:
    return i > 0 and tokens[i - 1].type in ("th_open", "td_open")


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


# --- reStructuredText ----------------------------------------------------------------------------------------------

_ADORNMENT = re.compile(r"^([!-/:-@\[-`{-~])\1{2,}\s*$")  # a line of one punctuation character repeated
_DIRECTIVE = re.compile(r"^(\s*)\.\.\s+(\|[^|]+\|\s+)?([\w:.+-]+)::(?:\s+(.*))?$")
_EXPLICIT = re.compile(r"^(\s*)\.\.(?:\s+(.*))?$")  # comments, targets, footnotes (a directive was tried first)
_OPTION = re.compile(r"^\s+:([\w][\w .-]*):(?:\s+(.*))?$")
_GRID_BORDER = re.compile(r"^\s*\+[-=+:]+\+\s*$")
_SIMPLE_BORDER = re.compile(r"^\s*(=+|-+)(\s+(=+|-+))+\s*$")
_BULLET = re.compile(r"^(\s*)(?:[*+\-\u2022]|#\.|\(?\d+[.)])\s+")

# Directives whose whole block is dropped: they configure the build or hold no text a reader sees.
_DROP = {
    "index", "toctree", "include", "literalinclude", "highlight", "sectionauthor", "moduleauthor", "codeauthor",
    "tabularcolumns", "currentmodule", "testsetup", "testcleanup", "image", "figure", "contents", "raw", "meta",
    "miscnews", "limited-api-list", "program", "default-role", "default-domain", "role", "sectnum", "header",
    "footer", "title", "autosummary", "automodule", "autoclass", "autofunction", "graphviz", "csv-table",
}
# Directives whose block is code: kept verbatim, without inline markup.
_CODE = {"code-block", "sourcecode", "code", "doctest", "testcode", "testoutput", "productionlist", "parsed-literal",
         "literal", "ipython", "jupyter-execute", "console", "prompt", "math"}
_VERSIONS = {
    "versionadded": "New in version {}.",
    "versionchanged": "Changed in version {}:",
    "deprecated": "Deprecated since version {}:",
}
_LABELS = {"impl-detail": "CPython implementation detail:", "availability": "Availability: {}"}


def rst_sections(text: str) -> tuple[str, list[Section]]:
    """(first heading or "", sections) of a reStructuredText text (Sphinx's roles and directives included)."""
    lines = text.expandtabs(8).splitlines()
    out = _Builder(clean=_rst_inline)
    styles: list[tuple[str, bool]] = []  # heading styles in order of first use: their index is the level
    title = ""
    literal: int | None = None  # indent the literal block must exceed
    skip: int | None = None  # indent a dropped block must exceed
    pending_literal: int | None = None  # a paragraph ended with '::': the next, deeper block is literal
    block_indent = 0  # indent of the literal block's first line (removed from each of its lines)
    borders = 0  # simple-table borders seen in the table being read (0: not in a simple table)
    i, n = 0, len(lines)
    while i < n:
        line = lines[i]
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if skip is not None:
            if not stripped or indent > skip:
                i += 1
                continue
            skip = None
        if literal is not None:
            if not stripped or indent > literal:
                out.lines.append(line[min(block_indent, indent):] if stripped else "")
                i += 1
                continue
            literal = None
            _trim_trailing_blank(out.lines)
        if pending_literal is not None and stripped:
            if indent > pending_literal:  # the literal block: kept verbatim, dedented
                out.end_line()
                literal, block_indent, pending_literal = pending_literal, indent, None
                continue
            pending_literal = None

        # a heading: text underlined (and maybe overlined) by one punctuation character
        heading = _rst_heading(lines, i)
        if heading is not None:
            head_text, style, used = heading
            if style not in styles:
                styles.append(style)
            level = styles.index(style) + 1
            head_text = _rst_inline(head_text)
            if not title:
                title = _one_line(head_text)
            out.heading(level, head_text)
            i += used
            continue
        if _ADORNMENT.match(line) and (i == 0 or not lines[i - 1].strip()):
            i += 1  # a transition
            continue

        directive = _DIRECTIVE.match(line)
        if directive is not None:
            i = _rst_directive(directive, lines, i, out)
            name = directive.group(3).lower()
            d_indent = len(directive.group(1))
            if directive.group(2) or name in _DROP:
                skip = d_indent
            elif name in _CODE:
                out.end_line()
                pending_literal = d_indent
            continue
        explicit = _EXPLICIT.match(line)
        if explicit is not None:
            rest = (explicit.group(2) or "").strip()
            note = re.match(r"^\[(?:#?[\w-]*|\*)\]\s+(.*)$", rest)  # a footnote or citation: its text is read
            if note:
                out.line(_rst_inline(note.group(1)))
            else:  # a comment or a hyperlink target: dropped with its indented block
                skip = len(explicit.group(1))
            i += 1
            continue
        if not stripped:
            out.end_line()
            if borders >= 2 and i > 0 and _SIMPLE_BORDER.match(lines[i - 1]):
                borders = 0  # a blank line after a simple table's closing border ends it
            i += 1
            continue
        if _GRID_BORDER.match(line) or _SIMPLE_BORDER.match(line):
            out.end_line()
            borders += 1 if _SIMPLE_BORDER.match(line) else 0
            i += 1
            continue
        if borders:  # a simple table's row: one line, columns (two spaces or more apart) as cells
            out.line(" | ".join(_rst_inline(c) for c in re.split(r"\s{2,}", stripped)))
            i += 1
            continue
        if stripped.startswith(">>>") and not out.inline:  # a doctest block: verbatim up to the blank line
            j = i
            while j < n and lines[j].strip():
                j += 1
            out.block("\n".join(x[indent:] if len(x) - len(x.lstrip()) >= indent else x.lstrip()
                                for x in lines[i:j]))
            i = j
            continue
        if stripped.startswith("|") and stripped.endswith("|") and len(stripped) > 1:  # a grid table row
            cells = [_one_line(_rst_inline(c)) for c in re.split(r"(?:^|\s)\|(?=\s|$)", stripped)]
            out.line(" | ".join(c for c in cells if c))
            i += 1
            continue
        if stripped == "::":
            out.end_line()
            pending_literal = indent
            i += 1
            continue
        body = _BULLET.sub("", line).strip()
        if body.endswith("::"):  # 'Example::' reads 'Example:', 'Example. ::' reads 'Example.'
            before = body[:-2]
            body = before.rstrip() + (":" if before and not before[-1].isspace() and before[-1].isalnum() else "")
            pending_literal = indent
        field_list = re.match(r"^:(\w[^:`]*):(?:\s+(.*))?$", body)
        if field_list:
            body = f"{field_list.group(1)}: {field_list.group(2) or ''}"
        if _BULLET.match(line):
            out.end_line()
        out.text(body + " ")  # inline markup is removed from the whole paragraph (it runs over lines)
        if pending_literal is not None:
            out.end_line()
        i += 1
    out.flush()
    return title, out.sections


def _trim_trailing_blank(lines: list[str]) -> None:
    while lines and not lines[-1].strip():
        lines.pop()


def _rst_heading(lines: list[str], i: int) -> tuple[str, tuple[str, bool], int] | None:
    """(title text, style, lines used) when a heading starts at line ``i``."""
    line = lines[i]
    over = _ADORNMENT.match(line)
    if over and i + 2 < len(lines):
        text, under = lines[i + 1], _ADORNMENT.match(lines[i + 2])
        if text.strip() and under and under.group(1) == over.group(1) and not _ADORNMENT.match(text):
            return text.strip(), (over.group(1), True), 3
    if not line.strip() or line[0].isspace() or over or i + 1 >= len(lines):
        return None
    under = _ADORNMENT.match(lines[i + 1])
    if under is None or len(lines[i + 1].rstrip()) < min(len(line.rstrip()), 4):
        return None
    if i > 0 and lines[i - 1].strip() and not _ADORNMENT.match(lines[i - 1]):
        return None  # the last line of a paragraph, not a title
    return line.strip(), (under.group(1), False), 2


def _rst_directive(match: re.Match[str], lines: list[str], i: int, out: _Builder) -> int:
    """Write what a directive line shows (a signature, 'New in version 3.2.'), skip its options; the next line."""
    indent = len(match.group(1))
    name = match.group(3).lower()
    arg = (match.group(4) or "").strip()
    j = i + 1
    options: dict[str, str] = {}
    while j < len(lines) and (opt := _OPTION.match(lines[j])) and len(lines[j]) - len(lines[j].lstrip()) > indent:
        options[opt.group(1)] = (opt.group(2) or "").strip()
        j += 1
    if match.group(2) or name in _DROP or name in _CODE:
        return j
    out.end_line()
    if name in _VERSIONS:
        version, _, rest = arg.partition(" ")
        out.line(_VERSIONS[name].format(version) + (f" {_rst_inline(rest)}" if rest else ""))
    elif name == "deprecated-removed":
        parts = arg.split(None, 2)
        since, removed = (parts + ["", ""])[:2]
        rest = parts[2] if len(parts) > 2 else ""
        out.line(f"Deprecated since version {since}, will be removed in version {removed}:"
                 + (f" {_rst_inline(rest)}" if rest else ""))
    elif name in _LABELS:
        out.line(_LABELS[name].format(_rst_inline(arg)).strip())
    elif name == "audit-event":
        event, _, args = arg.partition(" ")
        out.line(f"Raises an auditing event {event}" + (f" with arguments {args.split()[0]}." if args else "."))
    elif name == "module":
        out.line(arg + (f": {_rst_inline(options['synopsis'])}" if options.get("synopsis") else ""))
    elif arg:
        out.line(_rst_inline(arg))  # a signature (function, method, class...), a rubric, a topic's title
    return j


_ROLE = re.compile(r":[\w:+.-]+:`((?:[^`\\]|\\.)+)`")
_LITERAL = re.compile(r"``(.+?)``")
_LINK = re.compile(r"`([^`<]+?)\s*(?:<[^>`]*>)?`__?")
_INTERPRETED = re.compile(r"`([^`]+)`")
_EMPHASIS = re.compile(r"(?<![\w*])(\*\*?)(?=\S)(.+?)(?<=\S)\1(?![\w*])")
_REFERENCE = re.compile(r"\b([A-Za-z][\w-]*[A-Za-z0-9])__?(?=[\s.,;:!?)\]'\"]|$)")
_FOOTNOTE_REF = re.compile(r"\s?\[(?:#[\w-]*|\d+|\*)\]_")
_SUBSTITUTION = re.compile(r"\|([\w][\w .-]*)\|_{0,2}")


def _role_text(match: re.Match[str]) -> str:
    body = match.group(1).replace("\\", "")
    titled = re.match(r"^(.*?)\s*<[^<>]*>$", body, re.S)
    if titled and titled.group(1):
        return titled.group(1)
    body = body.lstrip("!")
    if body.startswith("~"):
        return body[1:].rsplit(".", 1)[-1]
    return body


def _rst_inline(text: str) -> str:
    """reST inline markup -> the text it shows: roles, literals (kept as written), links, emphasis, references,
    substitutions, escapes."""
    parts = _LITERAL.split(text)  # odd parts: the insides of ``literals``
    return "".join(part if k % 2 else _rst_plain(part) for k, part in enumerate(parts))


def _rst_plain(text: str) -> str:
    text = _ROLE.sub(_role_text, text)
    text = _LINK.sub(lambda m: m.group(1), text)
    text = _INTERPRETED.sub(lambda m: m.group(1), text)
    text = _EMPHASIS.sub(lambda m: m.group(2), text)
    text = _FOOTNOTE_REF.sub("", text)
    text = _REFERENCE.sub(lambda m: m.group(1), text)
    text = _SUBSTITUTION.sub(lambda m: m.group(1), text)
    return re.sub(r"\\(.)", r"\1", text.replace("\\ ", ""))


# --- HTML -------------------------------------------------------------------------------------------------------

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
    title = _one_line(title_el.text_content()) if title_el is not None else ""
    body = root.find(".//body")
    main = _main_content(root if body is None else body)
    out = _Builder()
    _walk(main, out, inside_main=main is not body)
    out.flush()
    if not title:
        heads = [el for el in main.iter() if isinstance(el.tag, str) and el.tag.lower() in _HEADINGS]
        first = min(heads, key=lambda el: _HEADINGS[el.tag.lower()], default=None)  # the first of the highest
        title = _one_line(_heading_text(first)) if first is not None else ""
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
    return _one_line(_text_of(el)).rstrip("¶#").strip()


def _text_of(el: Any) -> str:
    """An element's text without its dropped parts (a Sphinx ``headerlink`` pilcrow, a hidden span)."""
    parts = [el.text or ""]
    for child in el:
        if isinstance(child.tag, str) and not _dropped(child, True):
            parts.append(_text_of(child))
        parts.append(child.tail or "")
    return "".join(parts)


def _walk(el: Any, out: _Builder, inside_main: bool) -> None:
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


def _table(table: Any, out: _Builder) -> None:
    out.end_line()
    caption = table.find("caption")
    if caption is not None:
        out.line(caption.text_content())
    for row in table.iter("tr"):
        cells = [_one_line(_text_of(c)) for c in row if isinstance(c.tag, str) and c.tag.lower() in ("td", "th")]
        if any(cells):
            out.line(" | ".join(cells))
