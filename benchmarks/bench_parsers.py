"""Which parser reads each document format: at least two candidates per format on the same real files.

Per candidate and format: files, pages (slides), seconds, pages/s, MB/s of input, peak RSS of a fresh process
running only that candidate (and its RSS before the first file, so the parsing's own share shows), words out,
and the word overlap with the other candidates (the share of words both read, per file, weighted by words).
Plus the licence, the installed size and whether it ships native code. Every candidate runs in its own child
process (`--worker`), one after the other, at `nice 10` if you start it so.

Files: real PDF manuals from Debian's documentation packages (`scripts/fetch_debian_pdfs.sh DEST`), and DOCX,
ODT, EPUB and PPTX written by pandoc (Debian's) from real text (the Python 3.11 docs' reST sources, the
shared data set) into a temporary folder (nothing is committed but this script and its results).

    nice -n 10 .venv/bin/python benchmarks/bench_parsers.py --pdfs "$(scripts/fetch_debian_pdfs.sh /tmp/corpus)"

Writes benchmarks/results/ingest-speed/parsers.md (or --out) and prints it.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from machine import commit, cpu_flags, cpu_model, script  # benchmarks/ is sys.path[0]

ROOT = script()

DOCS = Path("/work/shared/data/python-3.11-docs/docs.jsonl.gz")
PAGES = ["library/stdtypes", "library/os", "reference/datamodel", "library/functions", "library/re",
         "howto/logging", "tutorial/controlflow", "tutorial/datastructures", "library/subprocess",
         "library/unittest", "library/argparse", "library/asyncio-task"]
_WORD = re.compile(r"\w+")

# --- the candidates: each yields (pages, text) per file ---------------------------------------------------------


def pdf_pypdfium2(path: Path) -> Iterator[str]:
    from services.core.settings import DocumentSettings
    from services.readers import pdf
    from services.readers.records import Section

    for part in pdf.read(path, DocumentSettings(max_pages=100_000)):
        if isinstance(part, Section):
            yield part.text


def pdf_pypdf(path: Path) -> Iterator[str]:
    """The plain pypdf script a user would write (the peer)."""
    import logging

    from pypdf import PdfReader

    logging.getLogger("pypdf").setLevel(logging.ERROR)
    for page in PdfReader(path).pages:
        yield page.extract_text() or ""


def pdf_pdfminer(path: Path) -> Iterator[str]:
    from pdfminer.high_level import extract_pages
    from pdfminer.layout import LTTextContainer

    for page in extract_pages(str(path)):
        yield "".join(e.get_text() for e in page if isinstance(e, LTTextContainer))


def _ours(module: str) -> Callable[[Path], Iterator[str]]:
    def read(path: Path) -> Iterator[str]:
        import importlib

        from services.core.settings import DocumentSettings
        from services.readers.records import Section

        for part in importlib.import_module(f"services.readers.{module}").read(path, DocumentSettings()):
            if isinstance(part, Section):
                yield part.text
    return read


def docx_python_docx(path: Path) -> Iterator[str]:
    import docx

    d = docx.Document(str(path))
    parts = [p.text for p in d.paragraphs]
    for table in d.tables:
        parts.extend(" | ".join(c.text for c in row.cells) for row in table.rows)
    yield "\n".join(parts)


def pptx_python_pptx(path: Path) -> Iterator[str]:
    from pptx import Presentation

    for slide in Presentation(str(path)).slides:
        lines = []
        for shape in slide.shapes:
            if shape.has_text_frame:
                lines.extend(p.text for p in shape.text_frame.paragraphs)
            if getattr(shape, "has_table", False) and shape.has_table:
                lines.extend(" | ".join(c.text for c in row.cells) for row in shape.table.rows)
        yield "\n".join(lines)


def odt_odfpy(path: Path) -> Iterator[str]:
    from odf import teletype, text
    from odf.opendocument import load

    doc = load(str(path))
    yield "\n".join(teletype.extractText(p) for p in doc.getElementsByType(text.P) + doc.getElementsByType(text.H))


def epub_ebooklib(path: Path) -> Iterator[str]:
    import warnings

    import ebooklib
    from ebooklib import epub
    from lxml import html

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        book = epub.read_epub(str(path), options={"ignore_ncx": True})
    for item in book.get_items_of_type(ebooklib.ITEM_DOCUMENT):
        yield html.fromstring(item.get_content()).text_content()


def pdf_through_sandbox(path: Path) -> Iterator[str]:
    """The product's path: sniff, parse in the sandbox's child, assemble the Document in this process."""
    from services.core.settings import DocumentSettings
    from services.readers import Document, iter_documents

    for item in iter_documents([path], limits=DocumentSettings(max_pages=100_000)):
        if isinstance(item, Document):
            yield from (s.text for s in item.sections)


CANDIDATES: dict[str, dict[str, Callable[[Path], Iterator[str]]]] = {
    "pdf": {"pypdfium2 (kept)": pdf_pypdfium2, "pypdf (peer: a plain pypdf script)": pdf_pypdf,
            "pdfminer.six": pdf_pdfminer, "pypdfium2 via the sandbox (dpr's path)": pdf_through_sandbox},
    "docx": {"zip+lxml (kept)": _ours("docx"), "python-docx": docx_python_docx},
    "pptx": {"zip+lxml (kept)": _ours("pptx"), "python-pptx": pptx_python_pptx},
    "odt": {"zip+lxml (kept)": _ours("odt"), "odfpy": odt_odfpy},
    "epub": {"zip+lxml (kept)": _ours("epub"), "ebooklib": epub_ebooklib},
}
DISTS = {"pypdfium2 (kept)": "pypdfium2",
         "pypdfium2 via the sandbox (dpr's path)": "pypdfium2", "pypdf (peer: a plain pypdf script)": "pypdf",
         "pdfminer.six": "pdfminer.six", "zip+lxml (kept)": "lxml", "python-docx": "python-docx",
         "python-pptx": "python-pptx", "odfpy": "odfpy", "ebooklib": "EbookLib"}
WARM = {"pypdfium2": ("pypdfium2",), "pypdf": ("pypdf",), "pdfminer.six": ("pdfminer.high_level",),
        "lxml": ("lxml.etree", "lxml.html"), "python-docx": ("docx",), "python-pptx": ("pptx",),
        "odfpy": ("odf.opendocument", "odf.teletype"), "EbookLib": ("ebooklib.epub",)}


# --- the child: one candidate over a list of files ----------------------------------------------------------------


def worker(fmt: str, name: str, files: list[str], sample: str, out: str) -> None:
    read = CANDIDATES[fmt][name]
    for module in WARM.get(DISTS[name], ()) + ("services.core.settings", f"services.readers.{fmt}"):
        __import__(module)  # imports are not parsing: done before the clock starts, for every candidate
    rss_before = _status_mb("VmRSS")
    pages = words = 0
    counts: dict[str, dict[str, int]] = {}
    sample_text = ""
    failed: list[str] = []
    started = time.perf_counter()
    for f in files:
        c: collections.Counter[str] = collections.Counter()
        try:
            for i, text in enumerate(read(Path(f))):
                pages += 1
                ws = _WORD.findall(text.lower())
                words += len(ws)
                c.update(ws)
                if f == sample and i == 41:
                    sample_text = text
        except Exception as e:  # noqa: BLE001 - a candidate that fails a file: counted, shown
            failed.append(f"{Path(f).name}: {type(e).__name__}")
        counts[f] = dict(c)
    seconds = time.perf_counter() - started
    peak = _status_mb("VmHWM")
    child = 0.0
    if "sandbox" in name:  # the parsing ran in the sandbox's child: its own peak
        from services.readers import sandbox

        proc = sandbox._SHARED._proc if sandbox._SHARED is not None else None
        child = _status_mb("VmHWM", proc.pid) if proc is not None else 0.0
    Path(out).write_text(json.dumps({"seconds": seconds, "pages": pages, "words": words, "rss_before_mb":
                                     rss_before, "peak_mb": peak, "child_peak_mb": child, "counts": counts,
                                     "sample": sample_text, "failed": failed}))


def _status_mb(field: str, pid: int | str = "self") -> float:
    """VmHWM (peak) or VmRSS of a process, in MB (ru_maxrss would carry the parent's peak across exec)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


# --- the parent -----------------------------------------------------------------------------------------------


def make_office(folder: Path) -> dict[str, list[Path]]:
    """DOCX, ODT, EPUB, PPTX written by pandoc from the Python docs' reST pages in PAGES."""
    rst = folder / "rst"
    rst.mkdir(parents=True, exist_ok=True)
    with gzip.open(DOCS, "rt", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if row["_id"] in PAGES:
                (rst / (row["_id"].replace("/", "_") + ".rst")).write_text(row["text"], encoding="utf-8")
    out: dict[str, list[Path]] = {k: [] for k in ("docx", "odt", "epub", "pptx")}
    for src in sorted(rst.glob("*.rst")):
        for kind in out:
            target = folder / f"{src.stem}.{kind}"
            extra = ["--metadata", f"title={src.stem}"] if kind == "epub" else []
            r = subprocess.run(["pandoc", "-f", "rst", str(src), "-o", str(target), *extra],
                               capture_output=True, check=False)
            if r.returncode == 0 and target.exists():
                out[kind].append(target)
    return out


def _concat(src: Path, times: int, out: Path) -> None:
    import pypdfium2 as pdfium

    dst, pdf = pdfium.PdfDocument.new(), pdfium.PdfDocument(str(src))
    for _ in range(times):
        dst.import_pages(pdf)
    dst.save(str(out))


def overlap(a: dict[str, int], b: dict[str, int]) -> tuple[int, int]:
    both = sum(min(n, b.get(w, 0)) for w, n in a.items())
    return both, max(sum(a.values()), sum(b.values()))


def package_facts(dist: str) -> tuple[str, str, str]:
    try:
        meta = importlib.metadata.metadata(dist)
        files = importlib.metadata.files(dist) or []
    except importlib.metadata.PackageNotFoundError:
        return "?", "?", "?"
    lic = meta.get("License-Expression") or meta.get("License") or ""
    if not lic or len(lic) > 40:
        lic = next((c.split("::")[-1].strip() for c in meta.get_all("Classifier") or [] if c.startswith("License")),
                   lic[:40])
    size = sum((p.size or 0) for p in files)
    native = any(str(p).endswith((".so", ".pyd", ".dylib")) or ".so." in str(p) for p in files)
    return lic, f"{size / 1e6:.1f} MB", "yes" if native else "no"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pdfs", type=Path, help="folder of PDFs (scripts/fetch_debian_pdfs.sh DEST)")
    ap.add_argument("--pdfminer-files", default="gnuplot.pdf",
                    help="comma-separated PDF names pdfminer.six reads (it runs at ~10 pages/s)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/ingest-speed/parsers.md")
    ap.add_argument("--worker", nargs=5, metavar=("FMT", "NAME", "FILES", "SAMPLE", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        fmt, name, files, sample, out = args.worker
        worker(fmt, name, json.loads(Path(files).read_text()), sample, out)
        return
    tmp = Path(tempfile.mkdtemp(prefix="bench-parsers-"))
    try:
        sets: list[tuple[str, str, list[Path], list[str]]] = []  # (format, label, files, candidates)
        if args.pdfs:
            pdfs = sorted(args.pdfs.rglob("*.pdf"))
            wanted = set(args.pdfminer_files.split(","))
            sets.append(("pdf", f"all {len(pdfs)} PDFs", pdfs, [n for n in CANDIDATES["pdf"] if "pdfminer" not in n]))
            octave = next((p for p in pdfs if p.name == "octave.pdf"), None)
            if octave is not None:  # memory follows the page: one small manual against a 2,316-page one
                big = tmp / "octave-twice.pdf"
                _concat(octave, 2, big)
                for f in (next(p for p in pdfs if p.name == "gnuplot.pdf"), big):
                    sets.append(("pdf", f"memory: {f.name}", [f], ["pypdfium2 (kept)",
                                                                   "pypdfium2 via the sandbox (dpr's path)"]))
            small = [p for p in pdfs if p.name in wanted]
            if small:
                sets.append(("pdf", ", ".join(p.name for p in small), small, list(CANDIDATES["pdf"])))
        office = make_office(tmp / "office")
        for kind, files in office.items():
            sets.append((kind, f"{len(files)} pandoc {kind.upper()} files", files, list(CANDIDATES[kind])))
        lines = report(sets, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def report(sets: list[tuple[str, str, list[Path], list[str]]], tmp: Path) -> list[str]:
    lines = [
        "# Parsers per format, measured (benchmarks/bench_parsers.py)", "",
        f"- CPU: {cpu_model()}, {os.cpu_count()} cores visible, flags: {cpu_flags() or 'none of avx2/avx512'}; "
        f"Python {platform.python_version()}; commit {commit()}; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "- Command: `nice -n 10 .venv/bin/python benchmarks/bench_parsers.py --pdfs \"$(scripts/fetch_debian_pdfs.sh "
        "/tmp/corpus)\"` (PDFs: octave-doc, gnuplot-doc, maxima-doc, erlang-doc; DOCX/ODT/EPUB/PPTX: pandoc "
        "2.17 from 12 Python 3.11 doc pages)",
        "- Each candidate in its own fresh process, one after the other; peak RSS is that process's whole peak, "
        "'before' its RSS once imported (VmHWM / VmRSS); for the sandbox row, '+ child' is the parser process's "
        "own peak. Overlap: words both candidates read / words of the larger, over all files "
        "(against the first row of the set). Pages: PDF pages with text or PPTX slides; for DOCX/ODT/EPUB a "
        "'page' is what the candidate yields (a section, a document or a chapter).", "",
    ]
    samples: list[str] = []
    for fmt, label, files, names in sets:
        mb = sum(f.stat().st_size for f in files) / 1e6
        lines += [f"## {fmt.upper()}: {label} ({mb:.1f} MB)", "",
                  "| candidate | pages | seconds | pages/s | MB/s | peak RSS (before) | words | overlap | failed "
                  "| licence | installed | native |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|"]
        listing = tmp / "files.json"
        listing.write_text(json.dumps([str(f) for f in files]))
        sample = next((str(f) for f in files if f.name == "gnuplot.pdf"), "")
        results = {}
        for name in names:
            out = tmp / "out.json"
            subprocess.run([sys.executable, __file__, "--worker", fmt, name, str(listing), sample, str(out)],
                           check=True, cwd=ROOT)
            results[name] = json.loads(out.read_text())
            out.unlink()
        first = results[names[0]]["counts"]
        for name in names:
            r = results[name]
            both = total = 0
            for f, c in r["counts"].items():
                b, t = overlap(c, first.get(f, {}))
                both, total = both + b, total + t
            lic, size, native = package_facts(DISTS[name])
            lines.append(
                f"| {name} | {r['pages']:,} | {r['seconds']:.2f} | {r['pages'] / max(r['seconds'], 1e-9):,.0f} | "
                f"{mb / max(r['seconds'], 1e-9):.2f} | {r['peak_mb']:.0f} MB ({r['rss_before_mb']:.0f})"
                f"{' + child ' + format(r['child_peak_mb'], '.0f') + ' MB' if r['child_peak_mb'] else ''} | "
                f"{r['words']:,} | {both / max(total, 1):.3f} | {len(r['failed'])} | {lic} | {size} | {native} |")
            if r["sample"] and not any(name in x.split("\n", 1)[0] for x in samples):  # once per candidate
                samples.append(f"### gnuplot.pdf page 42, {name}\n\n```\n{r['sample'][:700]}\n```\n")
        base = results[names[0]]["seconds"]
        ratios = ", ".join(f"{n.split(' ')[0]} {results[n]['seconds'] / max(base, 1e-9):.1f}x" for n in names[1:])
        lines += ["", f"Time against {names[0].split(' ')[0]}: {ratios}.", ""]
    return lines + ["## Samples to check by eye", "", *samples]


if __name__ == "__main__":
    main()
