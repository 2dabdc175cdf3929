"""reStructuredText (``.rst``, Sphinx's ``.rst.txt``) -> a title and ``Section``s by heading path, without markup.

The markup readers (this one, ``markdown`` and ``html``; their shared builder is ``sections.SectionBuilder``)
give the towers prose, not markup: roles (``:func:`open```), inline literals (````f.readline()````), link targets,
directive lines (``.. note::``), code-block markers, table borders and HTML navigation never reach them. What a
person reads on the rendered page stays, code included (a literal block is text a question may quote).

reST is read by a line reader of the constructs documentation uses; a full docutils parse would stop at every
Sphinx role and directive it does not know. Each reader returns ``(title, sections)``: one section per heading
(its text without the heading line, its heading path outermost first) plus the text before the first heading
(empty path).
"""

from __future__ import annotations

import re

from services.readers.records import Section
from services.readers.sections import SectionBuilder, one_line

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
    out = SectionBuilder(clean=_rst_inline)
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
            while out.lines and not out.lines[-1].strip():  # the block's trailing blank lines
                out.lines.pop()
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
                title = one_line(head_text)
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
            cells = [one_line(_rst_inline(c)) for c in re.split(r"(?:^|\s)\|(?=\s|$)", stripped)]
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


def _rst_directive(match: re.Match[str], lines: list[str], i: int, out: SectionBuilder) -> int:
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
