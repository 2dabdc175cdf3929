"""Markdown, reStructuredText and HTML keep their heading path as sections and lose their markup before the towers
see them; plain text is read as it always was."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.readers.files import read_file
from services.readers.html import html_sections
from services.readers.markdown import markdown_sections
from services.readers.records import Document
from services.readers.rst import rst_sections

pytestmark = pytest.mark.unit

RST = """\
.. _tut-io:

****************
Input and Output
****************

Intro text with :func:`print` and ``sys.stdout``.

.. index:: single: file; object

Reading and Writing Files
=========================

:func:`open` returns a :term:`file object`, see :ref:`the tutorial <tut-files>` and
`the JSON site <https://json.org>`_, or :meth:`~io.TextIOBase.readline`.

.. note::

   Call ``f.readline()`` to read a *single* line; **bold** words_ stay.

.. versionadded:: 3.2
   The *newline* argument.

Some examples::

   >>> f.readline()
   'This is the first line of the file.\\n'

.. code-block:: python
   :emphasize-lines: 1

   for line in f:
       print(line, end='')

.. function:: open(file, mode='r')

   Open *file*.

Methods of File Objects
-----------------------

=========  ===========
Character  Meaning
=========  ===========
``'r'``    open for reading
``'w'``    open for writing
=========  ===========

+------+-------+
| a    | b     |
+======+=======+
| one  | two   |
+------+-------+

.. toctree::
   :maxdepth: 2

   hidden/page

*******************
Another Top Section
*******************

Closing words.
"""


def test_rst_keeps_the_heading_path_and_loses_its_markup() -> None:
    title, sections = rst_sections(RST)
    assert title == "Input and Output"
    by_path = {s.heading: s.text for s in sections}
    assert list(by_path) == [
        ("Input and Output",),
        ("Input and Output", "Reading and Writing Files"),
        ("Input and Output", "Reading and Writing Files", "Methods of File Objects"),
        ("Another Top Section",),  # the overlined style is level 1 again
    ]
    files = by_path[("Input and Output", "Reading and Writing Files")]
    assert "open returns a file object, see the tutorial and the JSON site, or readline." in files
    assert "Call f.readline() to read a single line; bold words stay." in files
    assert "New in version 3.2.\nThe newline argument." in files
    assert "Some examples:\n>>> f.readline()\n'This is the first line of the file.\\n'" in files
    assert "for line in f:\n    print(line, end='')" in files  # code kept verbatim, indentation too
    assert "open(file, mode='r')\nOpen file." in files  # a signature is text a question may name
    table = by_path[("Input and Output", "Reading and Writing Files", "Methods of File Objects")]
    assert "'r' | open for reading" in table and "one | two" in table
    everything = "\n".join(s.text for s in sections)
    for markup in (":func:", "``", ".. ", "::", "`_", "tut-io", "index", "maxdepth", "hidden/page", "*single*",
                   "emphasize-lines", "+------", "====="):
        assert markup not in everything, markup


MARKDOWN = """\
---
title: front matter
tags: [a, b]
---
# Guide

Welcome to the **guide**, see [the docs](https://example.com/docs) and `pip install x`.

## Installing

### On Windows

Run the <kbd>installer</kbd>.

```bash
pip install dpr-ingest
```

| Option | Meaning |
|--------|---------|
| `-k`   | hits    |

<div class="note">Inline <b>HTML</b> note</div>

## Usage

![diagram](d.png) Use it.
"""


def test_markdown_sections_by_heading_without_markup() -> None:
    title, sections = markdown_sections(MARKDOWN)
    assert title == "Guide"
    by_path = {s.heading: s.text for s in sections}
    assert by_path[("Guide",)] == "Welcome to the guide, see the docs and pip install x."
    windows = by_path[("Guide", "Installing", "On Windows")]
    assert windows.splitlines() == ["Run the installer.", "pip install dpr-ingest", "Option | Meaning", "-k | hits",
                                    "Inline HTML note"]
    assert by_path[("Guide", "Usage")] == "diagram Use it."
    assert "front matter" not in "\n".join(by_path.values())


HTML = """\
<!DOCTYPE html><html><head><title>Guide — Example docs</title><script>var x = 1;</script>
<style>p { color: red }</style></head>
<body>
<header><a href="/">Home</a> <nav><a href="/a">A</a> <a href="/b">B</a></nav></header>
<div class="sphinxsidebar" role="navigation"><h3>Table of contents</h3><ul><li>Sidebar link</li></ul></div>
<div class="cookie-banner">We use cookies.</div>
<main>
  <h1>Guide<a class="headerlink" href="#guide">¶</a></h1>
  <p>Welcome &amp; hello.</p>
  <h2 id="install">Installing</h2>
  <h3>On Windows</h3>
  <p>Run the
     installer.</p>
  <pre>pip install  dpr-ingest
  --user</pre>
  <table><tr><th>Option</th><th>Meaning</th></tr><tr><td>-k</td><td>hits</td></tr></table>
  <form><input name="q"><button>Search</button></form>
  <aside>Related: nothing.</aside>
  <p hidden>secret</p>
  <h2>Usage</h2>
  <ul><li>first</li><li>second</li></ul>
</main>
<footer>© 2026 Example. <a href="/privacy">Privacy</a></footer>
</body></html>
"""


def test_html_keeps_the_main_text_by_heading_and_drops_the_boilerplate() -> None:
    title, sections = html_sections(HTML)
    assert title == "Guide — Example docs"
    by_path = {s.heading: s.text for s in sections}
    assert by_path == {
        ("Guide",): "Welcome & hello.",
        ("Guide", "Installing", "On Windows"): "Run the installer.\npip install  dpr-ingest\n  --user\n"
                                               "Option | Meaning\n-k | hits",
        ("Guide", "Usage"): "first\nsecond",
    }


def test_html_without_main_reads_the_body_without_navigation() -> None:
    page = ("<html><body><nav>Menu</nav><div id='footer'>foot</div><h2>Only</h2><p>Body text</p>"
            "<footer>bottom</footer></body></html>")
    assert html_sections(page) == ("Only", [html_sections(page)[1][0]])
    assert [(s.heading, s.text) for s in html_sections(page)[1]] == [(("Only",), "Body text")]
    assert html_sections("") == ("", []) and html_sections("<html></html>")[1] == []


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_read_file_gives_sections_and_format_by_name(tmp_path: Path) -> None:
    rst = read_file(_write(tmp_path / "io.rst.txt", RST), "io", 1_000_000)  # Sphinx's sources are reST
    md = read_file(_write(tmp_path / "g.md", MARKDOWN), "g", 1_000_000)
    page = read_file(_write(tmp_path / "p.htm", HTML), "p", 1_000_000)
    saved = read_file(_write(tmp_path / "guide.pdf", HTML), "s", 1_000_000, markup="html")  # a page named .pdf
    assert (rst.format, md.format, page.format, saved.format) == ("rst", "md", "html", "html")
    assert (rst.title, md.title, page.title) == ("Input and Output", "Guide", "Guide — Example docs")
    assert saved.sections == page.sections
    for doc in (rst, md, page):
        assert doc.sections and doc.text == "\n\n".join(s.text for s in doc.sections)
    only_title = read_file(_write(tmp_path / "t.html", "<title>Just a title</title><body> </body>"), "t", 1000)
    assert (only_title.text, only_title.title) == ("Just a title", "Just a title")


def test_plain_text_is_read_as_it_always_was(tmp_path: Path) -> None:
    text = "Notes\n=====\n\nA plain *text* file with ``markup`` left as it is.\n"
    doc = read_file(_write(tmp_path / "notes.txt", text), "notes", 1_000_000)
    assert doc == Document(doc_id="notes", text=text, title="Notes", source=str(tmp_path / "notes.txt"))
    assert doc.doc_hash == Document(doc_id="notes", text=text, title="Notes").doc_hash  # same hash as before
