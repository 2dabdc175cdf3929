"""Issue 13's hot paths in one run, ratios side by side (needs ../shared/data/beir-scifact; skips without it).

Subsets, so the run ends in about 40 minutes on a 2-core machine: the first ``--docs`` SciFact abstracts (default
800 -> 1,518 passages, the input issue 13 was measured on) chunked by the passage tower's tokenizer with the
default chunk settings; query latency over ``--points`` (10,000) and ``--big-points`` (100,000) passages: those
real ones plus synthetic copies as in ``bench_ingest.py``. Every process of the run reads one ONNX export of the
model (``DPR_ONNX_CACHE`` in the work dir), made before anything is timed. Floors are reported (PASS / FAIL in the
notes), never asserted.

1. Raw passage tower per backend (torch; onnx and onnx-int8 when ``DPR_ENCODER__BACKEND`` accepts them, else a
   note): passages/s, tokens/s (real tokens, special tokens included, padding excluded), and the fraction of the
   machine's fp32 FLOP ceiling. Ceiling = usable cores x FLOP/cycle/core x GHz, FLOP/cycle = 2 FMA units x lanes
   x 2 (AVX-512: 2x16x2 = 64; AVX2+FMA: 2x8x2 = 32; else 16). FLOPs of a passage of T tokens =
   2 x (per-token matmul parameters: layers x (4 d^2 + 2 d ffn)) x T + layers x 4 T^2 d (attention scores and
   mix), d, ffn and layers from the model's config.json. The raw tower reads the passages sorted by length.
2. In-process ingest (a recorded in-process job, as ``dpr ingest`` without a broker) / raw tower, per backend
   (floor 0.9); and / the peer (``benchmarks/peer_plain.py``: sentence-transformers + faiss-cpu, numpy without
   faiss). The same ratio on the demo corpus (``make demo``'s pages of the Python docs, read from
   ../shared/data/python-3.11-docs; ``--no-demo`` skips it), every backend.
3. The default backends: what ``Settings().encoder`` gives (passage ``backend``, ``question_backend``; the code's
   defaults unless ``DPR_ENCODER__*`` is set), named in a row, and their in-process ingest / the peer (floor 1.5).
4. Redis scale-out: the same documents through a Redis-compatible server (valkey) and ``dpr worker`` processes
   (the default passage backend, ~10 ingest tasks so two workers get the same share; a warm-up job first loads
   the model in every worker): (a) 1 worker, concurrency 1, 1 thread; (b) 2 workers, 1 thread each; (c) one
   worker with 2 pool processes sharing the cores on the default thread policy (``DPR_ENCODER__THREADS`` unset:
   usable cores // concurrency each); (i) in-process ingest of the same documents (default thread policy). Ratios
   b / a (floor 1.7: the scale-out a second machine gives) and c / i (floor 0.9). One run of a set varies by ~5-8%
   from the next (c alone: 93 and 101 passages/s on one machine), so the four run in turn ``--scale-pairs`` times
   (3) and each ratio is the median of its rounds' ratios (b beside a, c beside i). Beside it, what the machine
   itself gives: two raw passage-tower processes at 1 thread each over the pipeline's ingest batches / one alone (no
   queue, no store), the same number of pairs: the ceiling of b / a on this machine.
5. Length bucketing (torch): the pipeline's ingest batches encoded in document order (what a backend that does
   not sort gets), as one ``encode_documents`` call per ingest batch (the code before this change:
   sentence-transformers sorts by characters inside the call), and with ``services.ingest.encoding.encode_by_length``.
6. ``dpr query`` process wall and peak RSS (median of 5) over the embedded ``--points`` collection, per backend;
   the same command as a client of ``dpr serve`` over the same data dir (``DPR_API_URL``; the server on the default
   backends, 1 encoder thread, no API key, answered one untimed search first); the peer's query process over the
   same vectors.
7. Query p50 / p95 in-process (encode + search, k=10), dense and hybrid, with the default question tower
   (``Runtime(settings).question_towers``), at ``--points`` and ``--big-points`` passages; each store is optimized
   after it is built (HNSW on segments of at least ``index_threshold`` points, as an ingest job that leaves that
   many points builds it). Floors: hybrid p50 <= 1.3 x dense p50; dense p50 <= 15 ms at 100,000 passages.

Usage: ``.venv/bin/python benchmarks/bench_hotpaths.py [--docs 800] [--points 10000] [--big-points 100000]
[--queries 50]`` (``--big-points 0`` skips the second size); writes ``benchmarks/results/ingest-speed/hotpaths.md``.
``--ingest-only`` runs sections 1-3 (a few minutes) into ``benchmarks/results/ingest-speed/hotpaths-ingest.md``;
``--query-only`` sections 6-7 into ``benchmarks/results/ingest-speed/hotpaths-query.md``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import bench_ingest as bi  # noqa: E402
import numpy as np  # noqa: E402
from machine import commit, machine, script  # benchmarks/ is sys.path[0]

REPO = script()

from services.core.settings import EncoderSettings, Settings  # noqa: E402
from services.core.threads import available_cores, threads_per_process  # noqa: E402
from services.ingest.encoding import encode_by_length  # noqa: E402
from services.ingest.pipeline import chunk_document  # noqa: E402
from services.readers import Document  # noqa: E402
from services.runtime import Runtime  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "ingest-speed" / "hotpaths.md"
DPR = str(Path(sys.executable).with_name("dpr"))
PEER = REPO / "benchmarks" / "peer_plain.py"
BACKENDS = ("torch", "onnx", "onnx-int8")
BATCH = 32
WORKER_TASKS = 10  # ingest tasks of a scale-out run: two workers get five each
Row = tuple[str, str, str]  # measure, result, notes

# Floors (reported in the notes, never asserted)
PEER_FLOOR = 1.5  # default-backend in-process ingest / the peer
SCALE_OUT_FLOOR = 1.7  # 2 workers / 1 worker, 1 thread each: the scale-out a second machine gives
SHARED_CORES_FLOOR = 0.9  # 2 workers on the default thread policy / in-process ingest, same backend
DENSE_P50_MS = 15.0  # dense query p50 at 100,000 passages
INGEST_OVER_RAW = 0.9  # in-process ingest / raw tower, same backend
HYBRID_OVER_DENSE = 1.3  # hybrid query p50 / dense query p50


def scifact_dir() -> Path | None:
    for base in REPO.parents:
        candidate = base / "shared" / "data" / "beir-scifact"
        if (candidate / "corpus.jsonl.gz").is_file():
            return candidate
    return None


def machine_ceiling() -> dict[str, Any]:
    """:func:`machine.machine` plus the clock and the fp32 ceiling of the usable cores (cgroup quota included)."""
    m = machine()
    mhz = 0.0
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "cpu MHz":
            mhz = float(value)
            break
    flags = set(m["flags"].split())
    per_cycle = 64 if "avx512f" in flags else 32 if {"avx2", "fma"} <= flags else 16
    cores = available_cores()
    return {**m, "cores": cores, "ghz": mhz / 1000, "flop_per_cycle": per_cycle,
            "ceiling": cores * per_cycle * mhz * 1e6}


def passage_flops(tokens: list[int]) -> float:
    from encoders.towers import base_model_path

    cfg = json.loads((base_model_path() / "config.json").read_text())
    d, ffn, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    per_token = layers * (4 * d * d + 2 * d * ffn)
    return float(sum(2 * per_token * t + layers * 4 * t * t * d for t in tokens))


def available_backends() -> tuple[list[str], list[str]]:
    """The backends this code accepts (``DPR_ENCODER__BACKEND``); notes for the others."""
    if "backend" not in EncoderSettings.model_fields:
        return ["torch"], ["onnx, onnx-int8: skipped (this code has no DPR_ENCODER__BACKEND setting)"]
    ok, notes = [], []
    for b in BACKENDS:
        try:
            EncoderSettings.model_validate({"backend": b})
            ok.append(b)
        except ValueError as e:
            notes.append(f"{b}: skipped ({str(e).splitlines()[0]})")
    return ok, notes


def default_backends() -> tuple[str, str]:
    """(passage backend, question backend) of ``Settings().encoder``: the code's defaults unless DPR_ENCODER__*
    says otherwise (``EncoderSettings.questions`` decides an unset question backend)."""
    encoder = Settings().encoder
    return str(encoder.passages), str(encoder.questions)


def runtime_for(backend: str, data_dir: Path, onnx_cache: Path, threads: int | None = None) -> Any:
    encoder: dict[str, Any] = {"model": "base", "batch_size": BATCH, "backend": backend, "threads": threads}
    return Runtime(Settings(data_dir=data_dir, onnx_cache=onnx_cache, collection="bench",
                            encoder=EncoderSettings(**encoder)))


def make_export(onnx_cache: Path) -> str | None:
    """The base model's ONNX export in ``onnx_cache``, made now (once, ~20 s; every process of the run reads it)
    so no timed step pays for it. A note when the model cannot be exported."""
    from encoders.registry import export_model
    from encoders.towers import base_model_path

    settings = Settings(data_dir=onnx_cache.parent, onnx_cache=onnx_cache)
    if export_model(base_model_path(), settings.models_dir, onnx_cache) is None:
        return "no ONNX export of the base model (see the log): the onnx backends fall back or fail"
    return None


def timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_backend(backend: str, docs: list[Document], texts: list[str], work: Path,
                  tag: str = "") -> dict[str, float]:
    """Raw tower (length-sorted input) and in-process ingest of the same documents, one backend."""
    with runtime_for(backend, work / f"ingest{tag}-{backend}", work / "onnx") as runtime:
        towers = runtime.towers
        towers.encode_documents(texts[:8], batch_size=BATCH)  # warm up
        raw = timed(lambda: towers.encode_documents(texts, batch_size=BATCH))
        return {"raw": len(texts) / raw, "ingest": ingest_rate(runtime, docs)}


def ingest_rate(runtime: Any, docs: list[Document]) -> float:
    """passages/s of one in-process ingest job of ``docs`` (as ``dpr ingest`` without a broker) into ``runtime``'s
    collection; its towers are loaded (and warm) before the clock starts."""
    from entrypoints.compose import executor_for

    runtime.towers.encode_documents(["warm-up"], batch_size=1)
    t0 = time.perf_counter()
    job = executor_for(runtime).submit(docs, collection="bench").job
    seconds = time.perf_counter() - t0
    return int(runtime.jobs.status(job)["chunks"]) / seconds


def bench_bucketing(towers: Any, groups: list[list[tuple[str, int]]]) -> dict[str, float]:
    """passages/s of the three ways to batch the pipeline's ingest batches (see the module docstring)."""
    n = sum(len(g) for g in groups)

    def doc_order() -> None:
        for g in groups:
            for a in range(0, len(g), BATCH):
                towers.encode_documents([t for t, _ in g[a : a + BATCH]], batch_size=BATCH)

    def one_call() -> None:
        for g in groups:
            towers.encode_documents([t for t, _ in g], batch_size=BATCH)

    def by_tokens() -> None:
        for g in groups:
            encode_by_length(towers, [t for t, _ in g], [k for _, k in g], BATCH)

    return {name: n / timed(fn) for name, fn in (("document order", doc_order), ("one call (before)", one_call),
                                                  ("token buckets (after)", by_tokens))}


# Run from a small launcher: Linux carries the parent's RSS high-water mark across fork + exec, so a child forked
# straight from this (large) process would report at least this process's RSS as its peak.
_LAUNCHER = (
    "import os, subprocess, sys, time; t0 = time.perf_counter(); "
    "p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL); _, st, ru = os.wait4(p.pid, 0); "
    "print(time.perf_counter() - t0, ru.ru_maxrss, os.waitstatus_to_exitcode(st))"
)


def peak_run(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall s, peak RSS MiB) of one child process."""
    done = subprocess.run([sys.executable, "-c", _LAUNCHER, *cmd], env=env, capture_output=True, text=True)
    wall, kib, code = done.stdout.split()
    if done.returncode != 0 or code != "0":
        raise RuntimeError(f"{' '.join(cmd[:3])} failed: {done.stderr[-800:]}")
    return float(wall), int(kib) / 1024


def median_runs(cmd: list[str], env: dict[str, str], runs: int = 5) -> str:
    results = [peak_run(cmd, env) for _ in range(runs)]
    return (f"wall {statistics.median(r[0] for r in results):.2f} s, "
            f"peak RSS {statistics.median(r[1] for r in results):.0f} MiB")


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def bench_scale_out(docs: list[Document], work: Path, backend: str,
                    pairs: int) -> dict[str, list[tuple[float, str]] | str]:
    """Section 4: passages/s and a note per run of each set (a, b, c: workers; i: in-process ingest of the same
    documents, default thread policy, as ``dpr ingest`` without a broker), or why it failed; the export is made
    already. The sets run in turn ``pairs`` times (one run varies by ~5-8% from the next, more than the queue
    costs: each ratio is read within a round, b beside a and c beside i)."""
    env = {"DPR_ENCODER__MODEL": "base", "DPR_ENCODER__BACKEND": backend, "DPR_ONNX_CACHE": str(work / "onnx")}
    per_task = -(-len(docs) // WORKER_TASKS)
    runs: dict[str, list[tuple[float, str]]] = {}
    failed: dict[str, str] = {}
    sets = {"a": (1, 1, 1), "b": (2, 1, 1), "c": (1, 2, None)}
    for n, key in enumerate(["a", "b", "c", "i"] * pairs):
        if key in failed:
            continue  # failed once: not again
        try:
            if key == "i":
                with runtime_for(backend, work / f"run{n}", work / "onnx") as runtime:
                    rate = ingest_rate(runtime, docs)
                run = (rate, f"{threads_per_process(None)} encoder threads (the default policy)")
            else:
                run = worker_run(docs, work / f"run{n}", *sets[key], per_task, env)
        except Exception as e:  # noqa: BLE001 - a set that fails is a row, not a crash
            failed[key] = f"failed ({type(e).__name__}: {str(e)[:200]})"
            print(f"scale-out {key}: {failed[key]}", flush=True)
            continue
        runs.setdefault(key, []).append(run)
        print(f"scale-out {key}: {run}", flush=True)
    return {**runs, **failed}


def worker_run(docs: list[Document], work: Path, workers: int, concurrency: int, threads: int | None, per_task: int,
               env: dict[str, str]) -> tuple[float, str]:
    """(passages/s, note) of one job through ``workers`` x ``concurrency`` pool processes."""
    seconds, status, profile = bi.bench_workers(docs, work, workers, threads, per_task, env, concurrency)
    if status["state"] != "done":
        raise RuntimeError(f"job ended {status['state']}: {json.dumps(status)[:300]}")
    busy = profile["busy_seconds"] / (workers * concurrency * seconds)
    return (int(status["chunks"]) / seconds, f"{seconds:.1f} s, {status['batches_total']} tasks of <= {per_task} "
            f"documents; pool processes busy {busy:.0%} of {workers * concurrency} x wall")


def raw_scaling(work: Path, groups: list[list[tuple[str, int]]], backend: str,
                pairs: int) -> tuple[float, str] | None:
    """What the machine itself gives: the raw passage tower at 1 thread over the pipeline's ingest batches, one
    process alone and two at once (no queue, no store), alternating ``pairs`` times; the median ratio and each
    one, or None (printed) when a child fails."""
    path = work / "groups.json"
    path.write_text(json.dumps(groups))
    cmd = [sys.executable, __file__, "--raw-child", str(path), "--backend", backend, "--onnx-cache", str(work / "onnx")]

    def rates(n: int) -> list[float]:
        children = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(n)]
        outputs = [c.communicate()[0] for c in children]
        if any(c.returncode for c in children):
            raise RuntimeError(f"a raw tower child exited {[c.returncode for c in children]}")
        return [float(out.strip().splitlines()[-1]) for out in outputs]

    ratios = []
    try:
        for _ in range(pairs):
            one, two = rates(1)[0], sum(rates(2))
            ratios.append(two / one)
    except (RuntimeError, ValueError, IndexError) as e:  # a failed reference is a missing row, not a crash
        print(f"the machine alone: not measured ({e})", flush=True)
        return None
    return float(np.median(ratios)), ", ".join(f"{r:.2f}" for r in ratios)


def raw_child(groups_path: Path, backend: str, onnx_cache: Path) -> None:
    """``--raw-child``: the raw tower at 1 thread over the ingest batches (encode_by_length, as a worker batch is
    encoded); prints passages/s."""
    groups = json.loads(groups_path.read_text())
    with tempfile.TemporaryDirectory(prefix="dpr-raw-") as tmp, runtime_for(backend, Path(tmp), onnx_cache,
                                                                          threads=1) as runtime:
        towers = runtime.towers
        towers.encode_documents([groups[0][0][0]], batch_size=BATCH)  # warm up
        t0 = time.perf_counter()
        for g in groups:
            encode_by_length(towers, [t for t, _ in g], [n for _, n in g], BATCH)
        print(sum(len(g) for g in groups) / (time.perf_counter() - t0))


def scale_out_rows(scale: dict[str, list[tuple[float, str]] | str], backend: str, in_process: float | None,
                   hardware: tuple[float, str] | None) -> list[Row]:
    cores = available_cores()
    policy = threads_per_process(None, processes=2, cores=cores)  # a worker at concurrency 2 (workers/app.py)
    sets = {
        "a": ("ingest via Redis + 1 worker, 1 thread", "concurrency 1; DPR_ENCODER__THREADS=1"),
        "b": ("ingest via Redis + 2 workers, 1 thread each", "concurrency 1 each; DPR_ENCODER__THREADS=1"),
        "c": ("ingest via Redis + 2 pool processes sharing the cores (`dpr worker --concurrency 2`)",
              f"DPR_ENCODER__THREADS unset: services/core/threads.py gives each pool process usable cores // "
              f"concurrency "
              f"= {policy} thread(s): {2 * policy} on {cores} cores"),
        "i": ("in-process ingest, run beside c", "`dpr ingest` without DPR_BROKER_URL, the same documents"),
    }
    rows: list[Row] = []
    runs: dict[str, list[float]] = {}
    for key, (label, threads) in sets.items():
        result = scale[key]
        name = f"{label} ({key}), {backend}"
        if isinstance(result, str):
            rows.append((name, result, threads))
            continue
        runs[key] = [r for r, _ in result]
        each = f" (runs: {', '.join(f'{r:.2f}' for r in runs[key])})" if len(result) > 1 else ""
        rows.append((name, f"{np.median(runs[key]):.2f} passages/s{' median' if each else ''}",
                     f"{threads}; {result[-1][1]}{each}"))
    if "a" in runs and "b" in runs:
        ratios = [b / a for a, b in zip(runs["a"], runs["b"], strict=False)]
        ratio = float(np.median(ratios))
        each = f"; pairs run alternately: {', '.join(f'{r:.2f}' for r in ratios)}" if len(ratios) > 1 else ""
        rows.append(("Redis scale-out b / a (2 workers / 1, 1 thread each)", f"{ratio:.2f}",
                     f"floor {SCALE_OUT_FLOOR} (the scale-out a second machine gives): "
                     f"{verdict(ratio >= SCALE_OUT_FLOOR)}{each}"))
    if hardware is not None:
        rows.append(("the machine alone: 2 raw passage-tower processes / 1, 1 thread each, " + backend,
                     f"{hardware[0]:.2f}", f"no queue, no store, the pipeline's ingest batches; pairs: {hardware[1]}: "
                     "what two cores of this machine give one process each, the ceiling of b / a here"))
    if "c" in runs and "i" in runs:
        ratios = [c / i for c, i in zip(runs["c"], runs["i"], strict=False)]
        ratio = float(np.median(ratios))
        earlier = f"; / section 2's in-process run: {np.median(runs['c']) / in_process:.2f}" if in_process else ""
        rows.append((f"Redis, 2 pool processes sharing the cores (c) / in-process ingest (i), {backend}",
                     f"{ratio:.2f}", f"floor {SHARED_CORES_FLOOR}: {verdict(ratio >= SHARED_CORES_FLOOR)}; pairs run "
                     f"in turn: {', '.join(f'{r:.2f}' for r in ratios)}{earlier}"))
    return rows


def build_collection(towers: Any, vectors: np.ndarray, texts: list[str], points: int,
                     data_dir: Path) -> dict[str, Any]:
    """``points`` passages (real + synthetic) in the embedded store ``bench`` under ``data_dir``, then
    ``optimize()``: HNSW on the segments of at least ``index_threshold`` points, as an ingest job that leaves that
    many points builds it. Returns the store's ``index_info()``."""
    store = bi.build_query_store(towers, vectors, texts, points, data_dir / "store")
    try:
        store.optimize()
        return dict(store.index_info())
    finally:
        store.close()


def index_note(info: dict[str, Any]) -> str:
    """What ``optimize()`` left: HNSW on how many segments, or an exact scan."""
    if not info.get("hnsw_segments"):
        return (f"optimized, exact scan: no segment reached index_threshold {info.get('index_threshold')} "
                f"(segments: {info.get('segments')})")
    return f"HNSW built (on {info['hnsw_segments']} of {info['segments']} segments)"


def query_latency(data_dir: Path, questions: list[str], onnx_cache: Path) -> tuple[str, dict[str, tuple[float, str]]]:
    """(question backend, mode -> (p50 ms, result)) of in-process queries with the default question tower."""
    from services.store import open_store

    encoder = Settings().encoder.model_copy(update={"model": "base", "batch_size": BATCH})  # default backends
    settings = Settings(data_dir=data_dir, onnx_cache=onnx_cache, collection="bench", encoder=encoder)
    with Runtime(settings) as runtime:
        towers = runtime.question_towers
        store = open_store(settings)
        try:
            out = {}
            for mode in ("dense", "hybrid"):
                p50, p95, enc, search = bi.bench_queries(towers, store, questions, mode)
                out[mode] = (p50, f"p50 {p50:.1f} ms, p95 {p95:.1f} ms (p50 encode {enc:.1f} + search {search:.1f})")
        finally:
            store.close()
        return str(runtime.question_backend), out


def latency_rows(points: int, info: dict[str, Any], backend: str, latency: dict[str, tuple[float, str]],
                 queries: int, largest: bool) -> list[Row]:
    rows: list[Row] = [(f"query in-process, {mode}, {points:,} passages", value,
                        f"{queries} SciFact test claims, k=10, {index_note(info)}, {backend} question tower (default)")
                       for mode, (_, value) in latency.items()]
    dense, hybrid = latency["dense"][0], latency["hybrid"][0]
    notes = f"floor {HYBRID_OVER_DENSE}x: {verdict(hybrid <= HYBRID_OVER_DENSE * dense)}"
    if largest:
        at = "" if points == 100_000 else f"; measured at {points:,}"
        notes += (f"; dense p50 {dense:.1f} ms, floor {DENSE_P50_MS:.0f} ms at 100,000{at}: "
                  f"{verdict(dense <= DENSE_P50_MS)}")
    rows.append((f"query hybrid / dense p50, {points:,} passages", f"{hybrid / dense:.2f}x", notes))
    return rows


DEMO_PREFIXES = ("tutorial/", "howto/", "faq/", "reference/", "glossary")  # the Makefile's DOCS


def demo_inputs(scifact: Path) -> tuple[list[Document], list[str]] | None:
    """The demo corpus (``make demo``'s part of the Python 3.11 docs, from ../shared/data/python-3.11-docs: the
    same reST sources, read from its JSONL) and its passages sorted by length; None without it."""
    from encoders.towers import SentenceTransformerTowers, base_model_path

    path = scifact.parent / "python-3.11-docs" / "docs.jsonl.gz"
    if not path.is_file():
        return None
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    docs = [Document(doc_id=r["_id"], text=r["text"], title=r.get("title") or "", source=f"{r['_id']}.rst.txt")
            for r in rows if r["_id"].startswith(DEMO_PREFIXES)]
    towers = SentenceTransformerTowers(base_model_path(), name="base")
    chunks = [c for d in docs for c in chunk_document(d, towers, Settings().chunk)[0]]
    return docs, [c.encoder_text for c in sorted(chunks, key=lambda c: -c.tokens)]


def load_inputs(scifact: Path, n_docs: int, n_queries: int) -> tuple[list[Document], list[list[tuple[str, int]]],
                                                                         list[str]]:
    """Documents, their passages grouped by the pipeline's ingest batches as (text, tokens), and questions."""
    from encoders.towers import SentenceTransformerTowers, base_model_path
    from services.ingest.batches import batched_items

    bi.SCIFACT = scifact
    docs = bi.scifact_documents(n_docs)
    towers = SentenceTransformerTowers(base_model_path(), name="base")
    chunking, celery = Settings().chunk, Settings().celery
    groups = []
    for batch in batched_items(docs, celery.batch_documents, celery.batch_bytes):
        chunks = [c for d in batch if isinstance(d, Document) for c in chunk_document(d, towers, chunking)[0]]
        groups.append([(c.encoder_text, c.tokens + 2) for c in chunks])  # + [CLS] and [SEP]
    lines = (scifact / "queries.jsonl").read_text().splitlines()
    questions = [json.loads(line)["text"] for line in lines[-n_queries:]]  # the test claims come last
    return docs, groups, questions


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=800)
    parser.add_argument("--points", type=int, default=10_000)
    parser.add_argument("--big-points", type=int, default=100_000, help="Second query-latency size; 0 skips it.")
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--no-demo", dest="demo", action="store_false", help="Skip the demo-corpus rows.")
    parser.add_argument("--ingest-only", action="store_true",
                        help="Sections 1-3 only (raw tower, in-process ingest, the peer; the demo corpus unless "
                        "--no-demo); writes results/ingest-speed/hotpaths-ingest.md unless --out is given.")
    parser.add_argument("--query-only", action="store_true",
                        help="Sections 6-7 only (the `dpr query` processes and the query latency over the HNSW "
                        "stores); writes results/ingest-speed/hotpaths-query.md unless --out is given.")
    parser.add_argument("--scale-pairs", type=int, default=3,
                        help="Section 4: runs of (a, b), alternating; the b / a ratio is the median over the pairs.")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--raw-child", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="onnx-int8", help=argparse.SUPPRESS)
    parser.add_argument("--onnx-cache", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.raw_child is not None:
        raw_child(args.raw_child, args.backend, args.onnx_cache)
        return 0
    if args.ingest_only and args.query_only:
        parser.error("--ingest-only and --query-only exclude each other; give neither for the whole run")
    args.out = args.out or (RESULTS.with_name("hotpaths-ingest.md") if args.ingest_only
                            else RESULTS.with_name("hotpaths-query.md") if args.query_only else RESULTS)
    scifact = scifact_dir()
    if scifact is None:
        print("SciFact not found (../shared/data/beir-scifact beside the repo); skipped")
        return 0
    m = machine_ceiling()
    docs, groups, questions = load_inputs(scifact, args.docs, args.queries)
    demo = demo_inputs(scifact) if args.demo and not args.query_only else None
    passages = sorted((p for g in groups for p in g), key=lambda p: -p[1])
    texts, tokens = [t for t, _ in passages], [k for _, k in passages]
    flops = passage_flops(tokens) / len(texts)
    load0 = os.getloadavg()[0]
    rows: list[Row] = []
    say = print
    say(f"{m['cpu']}; flags {m['flags']}; {m['cores']} usable cores x {m['flop_per_cycle']} FLOP/cycle x "
        f"{m['ghz']:.2f} GHz = {m['ceiling'] / 1e9:.0f} GFLOP/s fp32; {len(docs)} abstracts -> {len(texts)} "
        f"passages, mean {np.mean(tokens):.0f} tokens, {flops / 1e9:.2f} GFLOP each", flush=True)
    with tempfile.TemporaryDirectory(prefix="dpr-hotpaths-") as tmp:
        work = Path(tmp)
        backends, notes = available_backends()
        passage_default, question_default = default_backends()
        if {*backends, passage_default, question_default} - {"torch"}:
            t0 = time.perf_counter()
            if (note := make_export(work / "onnx")) is not None:
                notes.append(note)
            say(f"ONNX export: {time.perf_counter() - t0:.1f} s", flush=True)
        if not args.query_only:  # sections 1-4
            per: dict[str, dict[str, float]] = {}
            for b in backends:
                try:
                    per[b] = bench_backend(b, docs, texts, work)
                except Exception as e:  # noqa: BLE001 - a backend that does not load is a note, not a crash
                    notes.append(f"{b}: failed to run ({type(e).__name__}: {str(e)[:200]})")
                say(f"{b}: {per.get(b)}", flush=True)
            demo_per: dict[str, dict[str, float]] = {}
            if demo is not None:
                for b in backends:
                    demo_per[b] = bench_backend(b, demo[0], demo[1], work, tag="-demo")
                    say(f"demo corpus, {b}: {demo_per[b]}", flush=True)
            else:
                notes.append("demo corpus: ../shared/data/python-3.11-docs not found; its rows are missing")
            peer_cmd = [sys.executable, str(PEER), "ingest", str(_dump(work, texts)), str(work / "peer")]
            peer_out = subprocess.run(peer_cmd, capture_output=True, text=True, check=True).stdout
            peer = json.loads(peer_out.strip().splitlines()[-1])
            peer_rate = peer["passages"] / peer["seconds"]
            default_ingest = per.get(passage_default, {}).get("ingest")
            rows += backend_rows(per, m, flops, float(np.mean(tokens)), peer_rate)
            rows += default_rows(passage_default, question_default, default_ingest, peer_rate)
            pages, demo_passages = (len(demo[0]), len(demo[1])) if demo else (0, 0)
            rows += [(f"demo corpus ({pages} Python docs pages -> {demo_passages} passages), {b}",
                      f"raw {r['raw']:.2f}, in-process ingest {r['ingest']:.2f} passages/s",
                      f"ingest / raw {r['ingest'] / r['raw']:.2f} (floor {INGEST_OVER_RAW}: "
                      f"{verdict(r['ingest'] / r['raw'] >= INGEST_OVER_RAW)})") for b, r in demo_per.items()]
            if args.ingest_only:
                rows.append(("load average (1 min) at start / end", f"{load0:.1f} / {os.getloadavg()[0]:.1f}",
                             f"{m['cores']} cores; sections 1-3 only (--ingest-only)"))
                write(args.out, m, rows, notes, len(docs), len(texts))
                return 0
            scale = bench_scale_out(docs, work, passage_default, args.scale_pairs)
            hardware = raw_scaling(work, groups, passage_default, args.scale_pairs)
            say(f"the machine alone, 2 raw processes / 1: {hardware}", flush=True)
            rows += scale_out_rows(scale, passage_default, default_ingest, hardware)
        with runtime_for("torch", work / "query", work / "onnx") as runtime:
            torch_towers = runtime.towers
        vectors = torch_towers.encode_documents(texts, batch_size=BATCH)  # (n, dim)
        (work / "peer").mkdir(parents=True, exist_ok=True)
        np.save(work / "peer" / "vectors.npy",
                np.stack([v for _, _, v in bi.synthetic_points(vectors, args.points)]).astype(np.float32))
        sizes = {args.points: work / "query", **({args.big_points: work / "query-big"} if args.big_points else {})}
        index: dict[int, dict[str, Any]] = {}
        for n, data_dir in sizes.items():
            t0 = time.perf_counter()
            index[n] = build_collection(torch_towers, vectors, texts, n, data_dir)
            say(f"store of {n:,} passages built and optimized in {time.perf_counter() - t0:.0f} s: {index[n]}",
                flush=True)
        if not args.query_only:  # section 5
            bucket = bench_bucketing(torch_towers, groups)
            say(f"bucketing: {bucket}", flush=True)
            rows += [(f"length bucketing (torch raw tower over the ingest batches): {k}", f"{v:.2f} passages/s",
                      f"{v / bucket['one call (before)']:.2f}x before") for k, v in bucket.items()]
        rows += process_rows(work, backends, questions[0], args.points)
        for n, data_dir in sizes.items():
            question_backend, latency = query_latency(data_dir, questions, work / "onnx")
            rows += latency_rows(n, index[n], question_backend, latency, len(questions), n == max(sizes))
            say(*rows[-3:], sep="\n", flush=True)
    rows.append(("load average (1 min) at start / end", f"{load0:.1f} / {os.getloadavg()[0]:.1f}",
                 f"{m['cores']} cores, shared with other work" + ("; sections 6-7 only (--query-only)"
                                                                   if args.query_only else "")))
    write(args.out, m, rows, notes, len(docs), len(texts))
    return 0


def _dump(work: Path, texts: list[str]) -> Path:
    path = work / "passages.json"
    path.write_text(json.dumps(texts))
    return path


def backend_rows(per: dict[str, dict[str, float]], m: dict[str, Any], flops: float, mean_tokens: float,
                 peer_rate: float) -> list[Row]:
    rows = []
    base = per.get("torch", {}).get("raw")
    for b, r in per.items():
        share = r["raw"] * flops / m["ceiling"]
        vs = f", {r['raw'] / base:.2f}x torch" if base and b != "torch" else ""
        rows.append((f"raw passage tower, {b}", f"{r['raw']:.2f} passages/s, {r['raw'] * mean_tokens:.0f} tokens/s",
                     f"{share:.0%} of the fp32 ceiling{vs}"))
        rows.append((f"in-process ingest, {b}", f"{r['ingest']:.2f} passages/s",
                     f"ingest / raw {r['ingest'] / r['raw']:.2f} (floor {INGEST_OVER_RAW}: "
                     f"{verdict(r['ingest'] / r['raw'] >= INGEST_OVER_RAW)}); ingest / peer "
                     f"{r['ingest'] / peer_rate:.2f}"))
    rows.append(("peer ingest (sentence-transformers + " + _peer_index() + ")", f"{peer_rate:.2f} passages/s",
                 "one model.encode call, batch 32, same passages"))
    return rows


def default_rows(passage: str, question: str, ingest: float | None, peer_rate: float) -> list[Row]:
    """Section 3: the backends ``Settings()`` gives, and their in-process ingest / the peer."""
    shown = f"{ingest:.2f} passages/s in-process ingest" if ingest else "in-process ingest not measured"
    rows = [(f"default backends (passage {passage}, question {question})", shown,
             "Settings().encoder: what `dpr ingest`, `dpr worker` and `dpr query` run on unless DPR_ENCODER__* is set")]
    if ingest:
        ratio = ingest / peer_rate
        rows.append((f"default-backend in-process ingest ({passage}) / peer", f"{ratio:.2f}",
                     f"floor {PEER_FLOOR}: {verdict(ratio >= PEER_FLOOR)}"))
    return rows


def _peer_index() -> str:
    try:
        import faiss  # noqa: F401
    except ImportError:
        return "numpy; faiss-cpu not installed"
    return "faiss-cpu"


def process_rows(work: Path, backends: list[str], question: str, points: int) -> list[Row]:
    """Section 6: embedded `dpr query` per backend, then `dpr query` over `dpr serve` (the server holds the shard, so
    it comes after), then the peer's query process."""
    env = {k: v for k, v in os.environ.items() if k != "DPR_API_URL" and not k.startswith("DPR_API__")}  # no key
    env.update({"DPR_DATA_DIR": str(work / "query"), "DPR_COLLECTION": "bench", "DPR_ENCODER__MODEL": "base",
                "DPR_ONNX_CACHE": str(work / "onnx")})
    cmd = [DPR, "query", question, "--json"]
    rows: list[Row] = []
    for b in backends:
        benv = {**env, "DPR_ENCODER__BACKEND": b, "DPR_ENCODER__QUESTION_BACKEND": b}  # both sides on b
        try:
            value = median_runs(cmd, benv)
        except RuntimeError as e:
            value = f"failed: {str(e)[:200]}"
        rows.append((f"`dpr query` process, embedded, {b}", value, f"median of 5, {points:,} passages"))
    name = f"`dpr query` process, client of `dpr serve` (question {default_backends()[1]})"
    server = None
    try:
        port = bi.free_port()
        server = start_server(env, port, work / "serve.log")
        served = {**env, "DPR_API_URL": f"http://127.0.0.1:{port}"}
        peak_run(cmd, served)  # untimed: the server's first search
        value = median_runs(cmd, served)
        rows.append((name, value, f"median of 5, {points:,} passages; the server (default backends, 1 encoder "
                     f"thread, no API key) peaked at {peak_rss_mib(server.pid):.0f} MiB RSS"))
    except RuntimeError as e:
        rows.append((name, f"failed: {str(e)[:200]}", f"{points:,} passages"))
    finally:
        if server is not None:
            bi.stop_process_group(server)
    peer = median_runs([sys.executable, str(PEER), "query", str(work / "peer"), question], dict(os.environ))
    rows.append((f"peer query process ({_peer_index()})", peer, f"median of 5, same {points:,} vectors"))
    return rows


def start_server(env: dict[str, str], port: int, log_path: Path) -> subprocess.Popen[bytes]:
    """`dpr serve` on 127.0.0.1:``port`` in its own process group, returned once GET /v1/status answers 200."""
    import httpx

    with open(log_path, "wb") as out:
        process = subprocess.Popen([DPR, "serve", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
                                   env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/status", timeout=5).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            bi.stop_process_group(process)
            raise RuntimeError(f"dpr serve did not answer GET /v1/status: {log_path.read_text()[-600:]}")
        time.sleep(0.2)


def peak_rss_mib(pid: int) -> float:
    """VmHWM of a running process (exec starts a fresh one, so it is that process's own peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def write(out: Path, m: dict[str, Any], rows: list[Row], notes: list[str], docs: int,
          passages: int) -> None:
    head = (f"Run {time.strftime('%Y-%m-%d %H:%M')} at commit {commit()} "
            f"on {m['cpu']} ({m['flags'].replace(' ', ', ')}), "
            f"{m['cores']} usable cores at {m['ghz']:.2f} GHz: fp32 ceiling {m['cores']} x {m['flop_per_cycle']} x "
            f"{m['ghz']:.2f} = {m['ceiling'] / 1e9:.0f} GFLOP/s. Subset: {docs} SciFact abstracts -> {passages} "
            "passages, model all-MiniLM-L6-v2 (base), batch 32, threads by services/core/threads.py.")
    table = ["| measure | result | notes |", "|---|---|---|", *[f"| {a} | {b} | {c} |" for a, b, c in rows]]
    text = "\n".join([head, "", *table, "", *(f"- {n}" for n in notes)])
    print(text)
    out.write_text("# Hot paths (issue 13)\n\n" + text + "\n\n" + (__doc__ or "") + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
