"""Peak memory of `dpr ingest` over hostile input, against the same command over a small input (issue 12).

Each input is ingested by ``dpr ingest PATH --json`` in a child process (in-process executor, embedded store in a
fresh temporary ``DPR_DATA_DIR``, default model); the child's peak RSS comes from ``os.wait4``. The model load
dominates RSS, so what counts is the difference against the small run (floor: at most 256 MB more). A second
child per input only iterates the readers (``services.readers.iter_documents``), to show the readers' own share.

Inputs (built in a temporary folder):
- small: 20 short text files;
- bomb: a ~1 MB ``.jsonl.gz`` holding one 1 GiB line (then one good row);
- malformed: a tiny ``.jsonl.gz`` of 500,000 rows that are not JSON;
- hostile folder: links out of the folder (file and folder), a link loop, a dangling link, a FIFO, hidden files,
  a name that is not UTF-8, UTF-16 text, a NUL after 8 KB, a corrupt ``.jsonl.gz``, lone surrogates, duplicate ids,
  a title-only row, archives.

Usage: ``.venv/bin/python benchmarks/bench_hostile.py``; writes ``benchmarks/results/reliability/hostile.md``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

from machine import commit, cpu_model

REPO = Path(__file__).resolve().parents[1]
FLOOR_MB = 256
ROWS = 500_000
BOMB_BYTES = 1 << 30


def build_small(work: Path) -> Path:
    root = work / "small"
    root.mkdir()
    for i in range(20):
        (root / f"doc{i}.txt").write_text(f"Document {i}. " + "Some ordinary sentence about retrieval. " * 20)
    return root


def build_bomb(work: Path) -> Path:
    """A 1 GiB line compressed as it is made (never held whole here either)."""
    path = work / "bomb.jsonl.gz"
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b"a" * (1 << 20)
    with open(path, "wb") as f:
        f.write(z.compress(b'{"id": "bomb", "text": "'))
        for _ in range(BOMB_BYTES // len(block)):
            f.write(z.compress(block))
        f.write(z.compress(b'"}\n{"id": "after", "text": "a good row after the bomb"}\n'))
        f.write(z.flush())
    return path


def build_malformed(work: Path) -> Path:
    path = work / "malformed.jsonl.gz"
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    with open(path, "wb") as f:
        for _ in range(ROWS // 1000):
            f.write(z.compress(b"{not json\n" * 1000))
        f.write(z.flush())
    return path


def build_hostile_folder(work: Path) -> Path:
    root = work / "hostile"
    root.mkdir()
    outside = work / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("outside the folder")
    (root / "good.md").write_text("# Good\n\nA good document among hostile ones.")
    (root / "link_file.txt").symlink_to(outside / "secret.txt")
    (root / "link_dir").symlink_to(outside, target_is_directory=True)
    (root / "loop").symlink_to(root / "loop")
    (root / "dangling.txt").symlink_to(work / "nowhere")
    os.mkfifo(root / "pipe.txt")
    (root / ".hidden.txt").write_text("hidden")
    with open(os.path.join(os.fsencode(root), b"caf\xe9.txt"), "wb") as f:
        f.write(b"non-UTF-8 name")
    (root / "utf16.txt").write_bytes("UTF-16 text, decoded".encode("utf-16"))
    (root / "late_nul.txt").write_bytes(b"a" * 10_000 + b"\x00")
    good = "".join(json.dumps({"id": f"g{i}", "text": f"row {i}"}) + "\n" for i in range(100)).encode()
    gz = gzip.compress(good)
    (root / "corrupt.jsonl.gz").write_bytes(gz[: len(gz) // 2])
    rows = ['{"id": "s1", "text": "lone \\ud800 surrogate"}', '{"id": 7, "text": "seven"}',
            '{"id": "7", "text": "dup"}', '{"id": "t", "title": "Title only", "text": ""}']
    (root / "rows.jsonl").write_text("\n".join(rows) + "\n")
    for name in ("a.zip", "b.tar.gz", "c.7z"):
        (root / name).write_bytes(b"PK\x03\x04")
    return root


def child_read(path: str) -> None:
    """Iterate the readers only; print the counts."""
    sys.path.insert(0, str(REPO))
    from services.readers import Document, DocumentFailure, iter_documents

    counts = {"documents": 0, "failed": 0, "skipped": 0}
    for item in iter_documents([path]):
        failed = "failed" if isinstance(item, DocumentFailure) else "skipped"
        counts["documents" if isinstance(item, Document) else failed] += 1
    print(json.dumps(counts))


def run_child(args: list[str], env: dict[str, str], out: Path) -> tuple[int, float, int]:
    """(peak RSS KiB, seconds, exit code) of one child process, its stdout to ``out``."""
    t0 = time.perf_counter()
    with open(out, "wb") as stdout:
        process = subprocess.Popen(args, env=env, stdout=stdout, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(process.pid, 0)
    return int(usage.ru_maxrss), time.perf_counter() - t0, os.waitstatus_to_exitcode(status)


def summary(out: Path) -> str:
    try:
        data = json.loads(out.read_bytes())
    except (ValueError, OSError):
        return "(no JSON)"
    # the job keeps the first records in full and counts them all (``*_total``)
    n_failed = int(data.get("failed_total", len(data.get("failed", []))))
    n_skipped = int(data.get("skipped_total", len(data.get("skipped", []))))
    return (f"{data.get('documents', 0)} written, {n_failed:,} failed, {n_skipped} skipped "
            f"(--json output {out.stat().st_size / 1e6:.1f} MB)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child-read", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_read:
        child_read(args.child_read)
        return
    with tempfile.TemporaryDirectory(prefix="bench-hostile-") as tmp:
        work = Path(tmp)
        inputs = [("small (20 text files)", build_small(work)), ("bomb: 1 GiB line in .jsonl.gz", build_bomb(work)),
                  (f"{ROWS:,} malformed rows in .jsonl.gz", build_malformed(work)),
                  ("hostile folder", build_hostile_folder(work))]
        rows = []
        for i, (label, path) in enumerate(inputs):
            env = {**os.environ, "PYTHONPATH": str(REPO), "DPR_DATA_DIR": str(work / f"data{i}"),
                   "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
            env.pop("DPR_BROKER_URL", None)
            cli = "from entrypoints.cli.main import main; main()"
            ingest = [sys.executable, "-c", cli, "ingest", str(path), "--json"]
            rss, secs, code = run_child(ingest, env, work / f"out{i}.json")
            read_rss, _, _ = run_child([sys.executable, __file__, "--child-read", str(path)], env, work / f"read{i}")
            size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink()) \
                if path.is_dir() else path.stat().st_size
            rows.append((label, size, rss, read_rss, secs, code, str(work / f"out{i}.json")))
            print(f"{label}: {rss / 1024:.0f} MiB ({secs:.1f} s, exit {code})", file=sys.stderr)
        # Only now read the outputs: a child's peak RSS starts at this process's peak (vfork + exec), so this
        # process stays small while children run.
        rows = [(*row[:6], summary(Path(row[6]))) for row in rows]
    write_report(rows)


def write_report(rows: list[tuple[str, int, int, int, float, int, str]]) -> None:
    base, read_base = rows[0][2], rows[0][3]
    lines = [
        "# Hostile input: peak RSS of `dpr ingest` (issue 12)",
        "",
        f"Commit {commit()}, {cpu_model()}, {os.cpu_count()} cores (shared), {time.strftime('%Y-%m-%d %H:%M')}. "
        f"Floor: at most {FLOOR_MB} MB more than the small run. `dpr ingest PATH --json`, in-process, embedded "
        "store, default model; readers only: a child that iterates `iter_documents` and nothing else.",
        "",
        "| input | on disk | `dpr ingest` peak RSS | vs small | floor | readers-only peak RSS | vs small | wall "
        "| exit | outcome |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    for label, size, rss, read_rss, secs, code, outcome in rows:
        delta, read_delta = (rss - base) / 1024, (read_rss - read_base) / 1024
        ok = "ok" if delta <= FLOOR_MB else "OVER"
        lines.append(f"| {label} | {size / 1e6:.2f} MB | {rss / 1024:.0f} MiB | {delta:+.0f} MiB | {ok} "
                     f"| {read_rss / 1024:.0f} MiB | {read_delta:+.0f} MiB | {secs:.1f} s | {code} | {outcome} |")
    text = "\n".join(lines) + "\n"
    out = REPO / "benchmarks" / "results" / "reliability" / "hostile.md"
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
