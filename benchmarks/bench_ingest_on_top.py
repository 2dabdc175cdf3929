"""Ingest on top of a large collection (issue 42): does ingest slow down as the collection grows?

Real text from the shared collections (SciFact abstracts, the whole Python 3.11 documentation, Cranfield, CISI,
SQuAD dev paragraphs; ``--pdf-dir`` adds Debian PDF manuals fetched by ``scripts/fetch_debian_pdfs.sh``) is
shuffled once (seeded) and cut into ``--slices`` equal slices of documents, so every slice has the same mix. Each
slice is one ``dpr ingest`` process, as a user runs it, into ``--data-dir``: a data dir that already holds the
synthetic bulk (``bench_scale.py --keep DIR``: ``DIR/<lever>/dpr``), or an empty one. Per slice: passages,
passages/s (the ingest's own ``seconds``), the encode share, the process's peak RSS (``/usr/bin/time``), and the
collection's points after it. The verdict line compares the last slice's passages/s with the
first's (floor: >= 0.9x) and the peak RSS of the last slice with the first's.

``--one-process``: the same documents through one in-process ingest, as a long-lived process (a worker, one
big ``dpr ingest``) runs it: this process opens the collection and loads the towers first, then submits every
document to the executor ``dpr ingest`` uses (``entrypoints.compose.executor_for``) and records the time and the
passages of each batch as it finishes. The slices are then tenths of the passages: passages/s of each tenth, the
encode share, the process's RSS when it ends, the start-up and the HNSW build at the end timed apart.

When the real documents hold fewer passages than ``--passages``, the documents are ingested again under new ids
(``copyN/<id>``): the text is real, repeated; the output says how many were repeats. Needs GNU ``/usr/bin/time``
(Debian's ``time`` package) for each process's peak RSS.

Usage::

    nice -n 10 .venv/bin/python benchmarks/bench_ingest_on_top.py --data-dir /data/scale1m/int8-m32/dpr \\
        --passages 100000 --slices 10 --out benchmarks/results/ingest-speed/on-top.md
    # a small trial on an empty data dir: --data-dir /tmp/ontop --passages 2000 --slices 4
    .venv/bin/python benchmarks/bench_ingest_on_top.py --data-dir DIR --one-process --id-prefix run2/ ...
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from machine import commit, machine_line, script  # benchmarks/ is sys.path[0]

REPO = script()

SHARED = REPO.parent / "shared" / "data"
DPR = [sys.executable, "-m", "entrypoints.cli.main"]
PASSAGES_PER_WORD = 1 / 100  # passages per whitespace word of this mix (a trial: 944 passages from ~94k words)


def jsonl_gz(path: Path) -> Iterator[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def squad_paragraphs(path: Path) -> Iterator[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        data = json.load(f)["data"]
    for article in data:
        for i, paragraph in enumerate(article["paragraphs"]):
            yield {"_id": f"{article['title']}/{i}", "title": article["title"].replace("_", " "),
                   "text": paragraph["context"]}


def real_documents(pdf_dir: Path | None) -> tuple[list[dict[str, Any]], list[Path], dict[str, int]]:
    """(JSONL records, PDF files, documents per source). Sources that are not here are left out, and said."""
    records: list[dict[str, Any]] = []
    counts: dict[str, int] = {}
    sources = {
        "scifact": lambda: jsonl_gz(SHARED / "beir-scifact" / "corpus.jsonl.gz"),
        "python-docs": lambda: jsonl_gz(SHARED / "python-3.11-docs" / "docs.jsonl.gz"),
        "cranfield": lambda: jsonl_gz(SHARED / "cranfield" / "corpus.jsonl.gz"),
        "cisi": lambda: jsonl_gz(SHARED / "cisi" / "corpus.jsonl.gz"),
        "squad-dev": lambda: squad_paragraphs(SHARED / "squad-v1.1-dev" / "dev-v1.1.json.gz"),
    }
    for name, read in sources.items():
        try:
            rows = [{"id": f"{name}/{r['_id']}", "title": r.get("title") or "", "text": r["text"]} for r in read()]
        except FileNotFoundError:
            print(f"{name}: not here (../shared/data), left out")
            continue
        counts[name] = len(rows)
        records.extend(rows)
    pdfs = sorted(pdf_dir.rglob("*.pdf")) if pdf_dir else []
    if pdfs:
        counts["debian-pdfs"] = len(pdfs)
    return records, pdfs, counts


def run_slice(paths: list[Path], env: dict[str, str], rss_file: Path) -> dict[str, Any]:
    """One ``dpr ingest`` process under ``/usr/bin/time``: its JSON report and its own peak RSS."""
    started = time.perf_counter()
    out = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", str(rss_file), *DPR, "ingest", *map(str, paths),
                          "--json"], cwd=REPO, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"dpr ingest exited {out.returncode}:\n{out.stderr[-2000:]}")
    report = dict(json.loads(out.stdout))
    report["wall_s"] = time.perf_counter() - started
    report["maxrss_mb"] = int(rss_file.read_text().split()[-1]) / 1024
    return report


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def report_head(title: str, machine: str, counts: dict[str, int], rows: list[dict[str, Any]], copies: int,
                how: str, columns: list[str]) -> list[str]:
    """The report's first lines: title, machine before / after, commit and command, the documents, the header."""
    return [f"# {title}", "", f"Machine before: {machine}", f"Machine after: {machine_line()}",
            f"Commit {commit()}; command: `{' '.join(sys.argv)}`", "",
            f"Real documents: {counts}; {len(rows):,} records ({copies} pass(es) over the text; later passes under "
            f"`copyN/` ids), shuffled once; {how}", "",
            "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def rss_mb() -> tuple[float, float]:
    """(current, peak) resident set of this process, MB."""
    import resource

    with open("/proc/self/statm") as f:
        current = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    return current, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _points(store: Any) -> int:
    active = store.info().active
    return int(active.count) if active is not None else 0


def one_process(path: Path, slices: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every document through one in-process ingest (the executor `dpr ingest` uses); per tenth of the passages:
    passages, seconds, encode seconds and RSS; and the start-up and end (HNSW build) apart."""
    from entrypoints.compose import executor_for
    from services.core.settings import Settings
    from services.readers import iter_documents
    from services.runtime import Runtime

    t_open = time.perf_counter()
    settings = Settings()
    marks: list[tuple[float, float, float, float]] = []  # (time, passages, encode seconds, RSS MB) after a batch
    with Runtime(settings) as runtime:
        before = _points(runtime.store)  # opens the collection (the shard) before the clock starts
        runtime.towers.encode_documents(["warm up"])  # and loads the passage tower
        opened = time.perf_counter() - t_open
        done = {"chunks": 0, "encode": 0.0}

        def on_batch(part: Any) -> None:
            done["chunks"] += part.chunks
            done["encode"] += part.encode_seconds
            marks.append((time.perf_counter(), done["chunks"], done["encode"], rss_mb()[0]))

        items = iter_documents([path], fmt="jsonl", max_bytes=settings.max_document_bytes,
                               limits=settings.documents, defer_binary=True)
        t0 = time.perf_counter()
        submitted = executor_for(runtime, on_batch=on_batch).submit(items, collection=settings.collection)
        ended = time.perf_counter()
        status = runtime.jobs.status(submitted.job)
        after = _points(runtime.store)
    total = marks[-1][1]
    rows: list[dict[str, Any]] = []
    start: tuple[float, float, float] = (t0, 0.0, 0.0)
    for i in range(1, slices + 1):
        end = next(m for m in marks if m[1] >= total * i / slices)
        passages, seconds = int(end[1] - start[1]), end[0] - start[0]
        rows.append({"chunks": passages, "seconds": seconds, "encode_seconds": end[2] - start[2],
                     "pps": passages / max(seconds, 1e-9), "rss_mb": end[3], "points_after": before + int(end[1])})
        start = (end[0], end[1], end[2])
    last = next(m for m in marks if m[1] >= total)  # a report of documents refused while reading comes after the end
    extra = {"open_s": opened, "batches_s": last[0] - t0, "after_last_batch_s": ended - last[0],
             "points_before": before, "points_after": after, "peak_rss_mb": rss_mb()[1],
             "failed": status.get("failed_total")}
    return rows, extra


def points(data_dir: Path, env: dict[str, str]) -> int:
    out = subprocess.run([*DPR, "status", "--json"], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    status = json.loads(out.stdout)
    return int(status.get("points") or status.get("collection", {}).get("points") or 0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", type=Path, required=True, help="the data dir to ingest into (the bulk's, or new)")
    ap.add_argument("--passages", type=int, default=100_000, help="real passages to ingest in all (about)")
    ap.add_argument("--slices", type=int, default=10)
    ap.add_argument("--pdf-dir", type=Path, help="Debian PDFs (scripts/fetch_debian_pdfs.sh DEST: DEST/debian-pdfs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--one-process", action="store_true", help="one in-process ingest; slices are tenths of it")
    ap.add_argument("--id-prefix", default="", help="prefix every document id (a second run over the same dir)")
    ap.add_argument("--out", type=Path, help="write the markdown here")
    args = ap.parse_args()

    machine = machine_line()
    print(machine)
    records, pdfs, counts = real_documents(args.pdf_dir)
    random.Random(args.seed).shuffle(records)
    words = sum(len(r["text"].split()) for r in records)
    estimate = max(1, int(words * PASSAGES_PER_WORD))
    copies = max(1, -(-args.passages // estimate))  # ceil: the text is repeated under new ids when it runs out
    rows = [dict(r, id=args.id_prefix + (f"copy{c}/{r['id']}" if c else r["id"])) for c in range(copies)
            for r in records]
    rows = rows[: max(args.slices, int(len(rows) * min(1.0, args.passages / (estimate * copies))))]
    print(f"real documents: {counts}; {len(rows):,} records to ingest ({copies} pass(es) over the text), "
          f"{len(pdfs)} PDFs")

    env = dict(os.environ, DPR_DATA_DIR=str(args.data_dir), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if args.one_process:
        return main_one_process(args, env, rows, counts, copies, machine)
    before = points(args.data_dir, env) if (args.data_dir / "store").exists() else 0
    print(f"collection before: {before:,} points")
    results: list[dict[str, Any]] = []
    size = -(-len(rows) // args.slices)
    pdf_size = -(-len(pdfs) // args.slices) if pdfs else 0
    with tempfile.TemporaryDirectory(prefix="dpr-ontop-") as tmp:
        for i in range(args.slices):
            part = Path(tmp) / f"slice{i:02d}.jsonl"
            write_jsonl(part, rows[i * size:(i + 1) * size])
            paths = [part, *pdfs[i * pdf_size:(i + 1) * pdf_size]]
            report = run_slice(paths, env, Path(tmp) / "rss")
            report["points_after"] = points(args.data_dir, env)
            report["pps"] = report["chunks"] / max(report["seconds"], 1e-9)
            results.append(report)
            print(f"slice {i + 1}/{args.slices}: {report['chunks']:,} passages in {report['seconds']:.0f} s "
                  f"(process {report['wall_s']:.0f} s: start-up, shard open, the HNSW build it triggers) "
                  f"({report['pps']:.1f}/s; encode {report['encode_seconds'] / max(report['seconds'], 1e-9):.0%}), "
                  f"peak RSS {report['maxrss_mb']:.0f} MB, collection {report['points_after']:,} points; "
                  f"failed {report['failed_total']}", flush=True)
    first, last = results[0], results[-1]
    total = sum(r["chunks"] for r in results)
    verdict = (f"last slice / first slice passages/s = {last['pps'] / first['pps']:.2f} (floor 0.9); peak RSS "
               f"first {first['maxrss_mb']:.0f} MB, last {last['maxrss_mb']:.0f} MB; {total:,} passages on top of "
               f"{before:,} points")
    print(verdict)
    print(machine_line())
    if args.out:
        lines = report_head("Ingest on top of a large collection (issue 42)", machine, counts, rows, copies,
                            "cut into equal slices of documents; one `dpr ingest` process per slice.",
                            ["slice", "passages", "passages/s", "encode share", "process wall s", "peak RSS MB",
                             "points after"])
        lines += [f"| {i + 1} | {r['chunks']:,} | {r['pps']:.1f} | "
                  f"{r['encode_seconds'] / max(r['seconds'], 1e-9):.0%} | {r['wall_s']:.0f} | {r['maxrss_mb']:.0f} | "
                  f"{r['points_after']:,} |"
                  for i, r in enumerate(results)]
        lines += ["", verdict, "",
                  "Peak RSS: each `dpr ingest` process's maximum resident set (`/usr/bin/time`: the largest of the "
                  "process and the children it waited for, e.g. the ONNX export's in the first slice of a fresh "
                  "data dir)."]
        args.out.write_text("\n".join(lines) + "\n")
    return 0


def main_one_process(args: argparse.Namespace, env: dict[str, str], rows: list[dict[str, Any]],
                     counts: dict[str, int], copies: int, machine: str) -> int:
    os.environ.update(env)
    with tempfile.TemporaryDirectory(prefix="dpr-ontop-") as tmp:
        path = Path(tmp) / "all.jsonl"
        write_jsonl(path, rows)
        results, extra = one_process(path, args.slices)
    for i, r in enumerate(results):
        print(f"slice {i + 1}/{args.slices}: {r['chunks']:,} passages in {r['seconds']:.0f} s ({r['pps']:.1f}/s; "
              f"encode {r['encode_seconds'] / max(r['seconds'], 1e-9):.0%}), RSS {r['rss_mb']:.0f} MB, "
              f"collection {r['points_after']:,} points", flush=True)
    first, last = results[0], results[-1]
    verdict = (f"last slice / first slice passages/s = {last['pps'] / first['pps']:.2f} (floor 0.9); RSS after the "
               f"first slice {first['rss_mb']:.0f} MB, after the last {last['rss_mb']:.0f} MB, peak "
               f"{extra['peak_rss_mb']:.0f} MB; {sum(r['chunks'] for r in results):,} passages on top of "
               f"{extra['points_before']:,} points; opening the collection and the towers {extra['open_s']:.0f} s "
               f"before the clock; after the last batch (the HNSW build its job triggers) "
               f"{extra['after_last_batch_s']:.0f} s; failed documents {extra['failed']}")
    print(verdict)
    print(machine_line())
    if args.out:
        lines = report_head("Ingest on top of a large collection, one process (issue 42)", machine, counts, rows,
                            copies, "one in-process ingest; each row 1/N of its passages, in order.",
                            ["slice (1/N of the passages)", "passages", "passages/s", "encode share",
                             "RSS MB after it", "points after"])
        lines += [f"| {i + 1} | {r['chunks']:,} | {r['pps']:.1f} | "
                  f"{r['encode_seconds'] / max(r['seconds'], 1e-9):.0%} | {r['rss_mb']:.0f} | {r['points_after']:,} |"
                  for i, r in enumerate(results)]
        lines += ["", verdict]
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
