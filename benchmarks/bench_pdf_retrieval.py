"""Retrieval on real PDF manuals: 30 written questions with the document and page that answer each
(benchmarks/data/pdf-questions.jsonl), answer@5 by document and by page for BM25 / dense / hybrid, through the
real store after a real ingest (the `dpr ingest` path: the walk hands over unparsed files, the batch parses them
in the parser sandbox). Also: the ingest with and without parsing the next batch while one encodes (prefetch),
and a re-ingest of the unchanged files (nothing parsed).

    nice -n 10 python benchmarks/bench_pdf_retrieval.py [--corpus DIR]
        [--out benchmarks/results/quality/pdf-retrieval.md]

The PDFs come from Debian's documentation packages (scripts/fetch_debian_pdfs.sh; erlang-doc, gnuplot-doc,
octave-doc), never committed: the 12 files the questions cite, 476 pages. Prints the CPU model and flags, the commit
and the figures; writes the Markdown table to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import commit, cpu_flags, cpu_model

from services.core.settings import Settings
from services.ingest.executor import LocalExecutor
from services.query import QueryOptions
from services.readers import iter_documents
from services.runtime import Runtime

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = ROOT / "benchmarks" / "data" / "pdf-questions.jsonl"
PACKAGES = {"erlang-doc": None, "gnuplot-doc": None, "octave-doc": None}
# label -> the query's options (no mode: the collection's serving mode, the label-free default here)
MODES: dict[str, dict[str, Any]] = {
    "BM25": {"mode": "sparse"}, "dense": {"mode": "dense"}, "hybrid rrf k=60": {"mode": "hybrid", "fusion": "rrf"},
    "hybrid linear w=0.5": {"mode": "hybrid", "fusion": "linear", "linear_weight": 0.5}, "default (no mode)": {},
}


def fetch(dest: Path) -> Path:
    """Debian's PDFs under dest/debian-pdfs (fetched once by the script)."""
    out = subprocess.run([str(ROOT / "scripts" / "fetch_debian_pdfs.sh"), str(dest), *PACKAGES], check=True,
                         capture_output=True, text=True).stdout.strip()
    return Path(out)


def gather(corpus: Path, names: set[str], folder: Path) -> int:
    """Copy the PDFs the questions cite into ``folder``; returns their page count."""
    import pypdfium2

    folder.mkdir(parents=True)
    pages = 0
    for path in sorted(corpus.rglob("*.pdf")):
        if path.name in names:
            shutil.copy(path, folder / path.name)
            pages += len(pypdfium2.PdfDocument(str(path)))
    missing = names - {p.name for p in folder.iterdir()}
    if missing:
        raise SystemExit(f"not in {corpus}: {sorted(missing)}")
    return pages


def ingest(settings: Settings, folder: Path, prefetch: bool) -> dict[str, Any]:
    with Runtime(settings) as runtime:
        executor = LocalExecutor(runtime.jobs, lambda _: runtime.pipeline, prefetch=prefetch)
        _ = runtime.pipeline  # the model loads before the clock starts
        t0 = time.perf_counter()
        items = iter_documents([folder], limits=settings.documents, max_bytes=settings.max_document_bytes,
                               defer_binary=True)
        job = executor.submit(items, collection=settings.collection).job
        wall = time.perf_counter() - t0
        status = runtime.jobs.status(job)
    return {**status, "wall": wall}


def hit_page(hit: Any, pages: list[int]) -> bool:
    p = hit.passage
    if p.page is None:
        return False
    return any(p.page <= q <= (p.page_end or p.page) for q in pages)


def evaluate(settings: Settings, questions: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    with Runtime(settings) as runtime:
        for label, options in MODES.items():
            doc_hits = page_hits = 0
            for q in questions:
                hits = runtime.search(q["question"], QueryOptions(k=5, rerank=0, **options))
                mine = [h for h in hits if h.passage.doc_id.endswith("/" + q["document"])]
                doc_hits += bool(mine)
                page_hits += any(hit_page(h, q["pages"]) for h in mine)
            out[label] = {"doc": doc_hits / len(questions), "page": page_hits / len(questions)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, default=None, help="a folder holding the PDFs (default: fetch them)")
    ap.add_argument("--fetch-dest", type=Path, default=ROOT / ".dpr" / "corpus")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "quality" / "pdf-retrieval.md")
    ap.add_argument("--no-prefetch-run", action="store_true", help="skip the ingest without prefetch")
    args = ap.parse_args()

    questions = [json.loads(line) for line in QUESTIONS.read_text().splitlines() if line.strip()]
    corpus = args.corpus or fetch(args.fetch_dest)
    work = Path(tempfile.mkdtemp(prefix="bench-pdf-"))
    folder = work / "pdfs"
    pages = gather(corpus, {q["document"] for q in questions}, folder)
    # as the run starts (others may commit meanwhile)
    at = commit()
    cpu = f"{cpu_model()} ({cpu_flags()}), {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}"
    print(f"CPU: {cpu}\ncommit: {at}\n{len(questions)} questions, {len(list(folder.iterdir()))} PDFs, "
          f"{pages} pages, {sum(p.stat().st_size for p in folder.iterdir()) / 1e6:.1f} MB")

    runs: dict[str, dict[str, Any]] = {}
    order = [("prefetch", True)] + ([] if args.no_prefetch_run else [("sequential", False)])
    for name, prefetch in order:
        settings = Settings(data_dir=work / f"data-{name}", collection="pdfs")
        runs[name] = ingest(settings, folder, prefetch)
        r = runs[name]
        print(f"ingest ({name}): {r['wall']:.1f} s, {r['documents']} documents, {r['chunks']} passages "
              f"({r['chunks'] / r['wall']:.1f}/s), parsed {r['parsed']} files in {r['parse_seconds']:.1f} s, "
              f"encode {r['encode_seconds']:.1f} s, failed {r['failed_total']}")
    settings = Settings(data_dir=work / "data-prefetch", collection="pdfs")
    again = ingest(settings, folder, True)
    print(f"re-ingest unchanged: {again['wall']:.1f} s, unchanged {again['unchanged']}, parsed {again['parsed']}")
    scores = evaluate(settings, questions)
    for label, s in scores.items():
        print(f"{label:7s} answer@5 document {s['doc']:.2f}  page {s['page']:.2f}")

    first = runs["prefetch"]
    lines = [
        "# Retrieval on real PDF manuals",
        "",
        f"`nice -n 10 python benchmarks/bench_pdf_retrieval.py --corpus /tmp/corpus/debian-pdfs` at commit "
        f"{at}; CPU: {cpu} at the start (a shared machine: other engineers' jobs ran at the same time).",
        "",
        f"{len(questions)} questions written from the pages of {len(list(folder.iterdir()))} PDFs of Debian's "
        f"erlang-doc, gnuplot-doc and octave-doc packages ({pages} pages; questions and the page(s) answering each "
        "in `benchmarks/data/pdf-questions.jsonl`). Ingested through the real store with the base towers and the "
        "default chunking, the way `dpr ingest` does (files parsed inside the batch, in the parser sandbox). "
        "answer@5: a hit among the first 5 is from the right document / covers a right page (a passage's "
        "page..page_end range). No reranker.",
        "",
        "| mode | answer@5 by document | answer@5 by page |",
        "|---|---|---|",
        *[f"| {label} | {s['doc']:.2f} | {s['page']:.2f} |" for label, s in scores.items()],
        "",
        "## Ingest",
        "",
        "| run | wall s | passages | passages/s | parse s (sum) | encode s (sum) |",
        "|---|---|---|---|---|---|",
        *[f"| {name} | {r['wall']:.1f} | {r['chunks']} | {r['chunks'] / r['wall']:.1f} | {r['parse_seconds']:.1f} | "
          f"{r['encode_seconds']:.1f} |" for name, r in runs.items()],
        f"| re-ingest, unchanged | {again['wall']:.1f} | 0 ({again['unchanged']} unchanged, {again['parsed']} "
        "parsed) | - | 0 | 0 |",
        "",
        "prefetch: the next batch's files parse (in the sandbox's child process) while the current batch encodes; "
        "sequential: parse, then encode, batch after batch. Parse time is the share of ingest time spent "
        f"parsing: {first['parse_seconds'] / max(first['wall'], 1e-9):.0%} of the wall time here (overlapped with "
        "encoding in the prefetch run).",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
