"""The text readers before and after sections (docs/passages.md): parse speed and the markup left in the text
the towers read, on the Python 3.11 documentation (Debian's python3.11-doc: its reST sources and its HTML pages).

Before: reST and Markdown were read as raw text, HTML by the standard library's parser without boilerplate removal
(``services.readers.files.html_to_text``, still there). After: ``services.readers.rst`` / ``html`` (by heading).

    nice -n 10 .venv/bin/python benchmarks/bench_markup.py [DOCS_HTML_DIR] [--out results/ingest-speed/markup.md]
        [--passages]   # also: passages and passage-tower tokens of the demo's folders, before / after (loads base)

DOCS_HTML_DIR defaults to the demo's unpacked package (``scripts/fetch_python_docs.sh`` prints its ``_sources``).
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from machine import commit, cpu_flags, cpu_model

from services.readers.files import html_to_text
from services.readers.html import html_sections
from services.readers.rst import rst_sections

LEFTOVERS = {
    "reST role": re.compile(r":[a-z:]+:`"),
    "inline literal ``": re.compile(r"``"),
    "directive line": re.compile(r"^\s*\.\. [\w:-]+::", re.M),
    "link target `_": re.compile(r"`_"),
    "headerlink ¶": re.compile(r"¶"),
    "nav words (Navigation / previous / next)": re.compile(r"\b(Navigation|previous|next) \|"),
}


def run(name: str, texts: list[str], read: Callable[[str], str], repeat: int = 2) -> dict[str, float | int | str]:
    best, out = float("inf"), []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = [read(t) for t in texts]
        best = min(best, time.perf_counter() - t0)
    mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    joined = "\n".join(out)
    row: dict[str, float | int | str] = {"reader": name, "files": len(texts), "MB": round(mb, 1),
                                         "seconds": round(best, 2), "MB/s": round(mb / best, 1)}
    for label, pattern in LEFTOVERS.items():
        row[label] = len(pattern.findall(joined))
    row["chars out"] = len(joined)
    return row


def passages(root: Path) -> str:
    """Passages and tower tokens of ``make demo``'s folders: raw reST through ``chunk_text`` (before) against
    ``read_file`` + ``chunk_document`` (after), with the base towers' tokenizer and the default chunk settings."""
    from encoders.towers import SentenceTransformerTowers, base_model_path
    from services.core.settings import ChunkSettings
    from services.ingest.chunking import chunk_text
    from services.ingest.pipeline import chunk_document
    from services.readers.files import guess_title, read_file

    towers = SentenceTransformerTowers(base_model_path(), name="base")
    files = [f for d in ("tutorial", "howto", "faq", "reference")
             for f in sorted(glob.glob(str(root / "_sources" / d / "**/*.rst.txt"), recursive=True))]
    files.append(str(root / "_sources" / "glossary.rst.txt"))
    cs = ChunkSettings()
    before = after = before_tokens = after_tokens = 0
    for f in files:
        path = Path(f)
        raw = path.read_text("utf-8")
        old = chunk_text(raw, guess_title(path, raw), offsets_of=towers.passage_token_offsets,
                         max_passage_tokens=towers.max_passage_tokens, overlap=cs.overlap,
                         max_title_tokens=cs.max_title_tokens).chunks
        new, _ = chunk_document(read_file(path, f, 10**9), towers, cs)
        before, after = before + len(old), after + len(new)
        before_tokens += sum(c.tokens for c in old)
        after_tokens += sum(c.tokens for c in new)
    return (f"make demo's folders ({len(files)} documents), base towers' tokenizer, default chunking: passages "
            f"{before:,} -> {after:,}; passage-tower tokens {before_tokens:,} -> {after_tokens:,} "
            f"({after_tokens / before_tokens:.2f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("html_dir", nargs="?", default=".dpr/corpus/python3.11-doc/usr/share/doc/python3.11/html")
    ap.add_argument("--out", default="benchmarks/results/ingest-speed/markup.md")
    ap.add_argument("--passages", action="store_true", help="also count the demo's passages before / after")
    args = ap.parse_args()
    root = Path(args.html_dir)
    rst = [Path(f).read_text("utf-8") for f in sorted(glob.glob(str(root / "_sources/**/*.rst.txt"), recursive=True))]
    pages = [Path(f).read_text("utf-8") for f in sorted(glob.glob(str(root / "**/*.html"), recursive=True))]
    if not rst or not pages:
        raise SystemExit(f"no .rst.txt / .html under {root}: run scripts/fetch_python_docs.sh first")

    def sections_text(read: Callable[[str], tuple[str, list]]) -> Callable[[str], str]:  # type: ignore[type-arg]
        return lambda t: "\n\n".join(s.text for s in read(t)[1])

    rows = [
        run("reST before: raw text", rst, lambda t: t),
        run("reST after: rst_sections", rst, sections_text(rst_sections)),
        run("HTML before: html_to_text (stdlib)", pages, lambda t: html_to_text(t)[1]),
        run("HTML after: html_sections (lxml)", pages, sections_text(html_sections)),
    ]
    head = [f"CPU: {cpu_model()} ({os.cpu_count()} cores; flags {cpu_flags() or '-'}); commit {commit()}; load average "
            f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}", ""]
    keys = list(rows[0])
    table = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    table += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    ratios = [f"speed after / before: reST {float(rows[1]['MB/s']) / float(rows[0]['MB/s']):.3f} (raw text costs "
              f"nothing), HTML {float(rows[3]['MB/s']) / float(rows[2]['MB/s']):.2f}"]
    if args.passages:
        ratios += ["", passages(root)]
    text = "\n".join(head + table + ["", *ratios]) + "\n"
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(f"# Text readers before / after sections (`benchmarks/bench_markup.py`)\n\n{text}")


if __name__ == "__main__":
    main()
