"""Issue 13's hot paths in one run, ratios side by side (needs ../shared/data/beir-scifact; skips without it).

Subsets, so the run ends in under ~20 minutes on a 2-core machine: the first ``--docs`` SciFact abstracts
(default 160, ~300 passages) chunked by the passage tower's tokenizer with the default chunk settings; query
latency over ``--points`` (10,000) passages: those real ones plus synthetic copies as in ``bench_ingest.py``.

1. Raw passage tower per backend (torch; onnx and onnx-int8 when ``DPR_ENCODER__BACKEND`` accepts them, else a
   note): passages/s, tokens/s (real tokens, special tokens included, padding excluded), and the fraction of the
   machine's fp32 FLOP ceiling. Ceiling = usable cores x FLOP/cycle/core x GHz, FLOP/cycle = 2 FMA units x lanes
   x 2 (AVX-512: 2x16x2 = 64; AVX2+FMA: 2x8x2 = 32; else 16). FLOPs of a passage of T tokens =
   2 x (per-token matmul parameters: layers x (4 d^2 + 2 d ffn)) x T + layers x 4 T^2 d (attention scores and
   mix), d, ffn and layers from the model's config.json. The raw tower reads the passages sorted by length.
2. Length bucketing (torch): the pipeline's ingest batches encoded in document order (what a backend that does
   not sort gets), as one ``encode_documents`` call per ingest batch (the code before this change:
   sentence-transformers sorts by characters inside the call), and with ``services.ingest.encode_by_length``.
3. In-process ingest (a recorded in-process job, as ``dpr ingest`` without a broker) / raw tower, per backend; and
   / the peer (``benchmarks/peer_plain.py``: sentence-transformers + faiss-cpu, numpy without faiss).
4. ``dpr query`` process wall and peak RSS (median of 5) over the embedded ``--points`` collection, per backend,
   beside the peer's query process over the same vectors.
5. Query p50 / p95 in-process (encode + search, k=10), dense and hybrid, at ``--points`` passages.

Usage: ``.venv/bin/python benchmarks/bench_hotpaths.py [--docs 160] [--points 10000] [--queries 50]``; writes
``benchmarks/results/hotpaths.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import bench_ingest as bi  # noqa: E402
import numpy as np  # noqa: E402
from bench_hostile import commit, cpu_model  # noqa: E402

from services.ingest import chunk_document, encode_by_length  # noqa: E402
from services.readers import Document  # noqa: E402
from services.settings import EncoderSettings, Settings  # noqa: E402
from services.threads import available_cores  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "hotpaths.md"
DPR = str(Path(sys.executable).with_name("dpr"))
PEER = REPO / "benchmarks" / "peer_plain.py"
BACKENDS = ("torch", "onnx", "onnx-int8")
BATCH = 32


def scifact_dir() -> Path | None:
    for base in REPO.parents:
        candidate = base / "shared" / "data" / "beir-scifact"
        if (candidate / "corpus.jsonl.gz").is_file():
            return candidate
    return None


def machine() -> dict[str, Any]:
    flags: set[str] = set()
    mhz = 0.0
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            flags = set(value.split())
        elif key.strip() == "cpu MHz" and not mhz:
            mhz = float(value)
    per_cycle = 64 if "avx512f" in flags else 32 if {"avx2", "fma"} <= flags else 16
    cores = available_cores()
    shown = [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8", "avx_vnni") if f in flags]
    return {"cpu": cpu_model(), "flags": shown, "cores": cores, "ghz": mhz / 1000, "flop_per_cycle": per_cycle,
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


def runtime_for(backend: str, data_dir: Path) -> Any:
    from services.runtime import Runtime

    encoder: dict[str, Any] = {"model": "base", "batch_size": BATCH}
    if backend != "torch":
        encoder["backend"] = backend
    return Runtime(Settings(data_dir=data_dir, collection="bench", encoder=EncoderSettings(**encoder)))


def timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_backend(backend: str, docs: list[Document], texts: list[str], work: Path) -> dict[str, float]:
    """Raw tower (length-sorted input) and in-process ingest of the same documents, one backend."""
    from entrypoints.compose import executor_for

    with runtime_for(backend, work / f"ingest-{backend}") as runtime:
        towers = runtime.towers
        towers.encode_documents(texts[:8], batch_size=BATCH)  # warm up (and export, for onnx)
        raw = timed(lambda: towers.encode_documents(texts, batch_size=BATCH))
        t0 = time.perf_counter()
        job = executor_for(runtime).submit(docs, collection="bench").job
        ingest = time.perf_counter() - t0
        chunks = int(runtime.jobs.status(job)["chunks"])
    return {"raw": len(texts) / raw, "ingest": chunks / ingest}


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


def build_collection(data_dir: Path, texts: list[str], points: int, peer_dir: Path) -> Any:
    """``points`` passages (real + synthetic) in the embedded store ``bench`` and the same vectors for the peer."""
    with runtime_for("torch", data_dir) as runtime:
        towers = runtime.towers
        vectors = towers.encode_documents(texts, batch_size=BATCH)  # (n, dim)
        all_vectors = np.stack([v for _, _, v in bi.synthetic_points(vectors, points)]).astype(np.float32)
        store = bi.build_query_store(towers, vectors, texts, points, data_dir / "store")
        store.close()
    peer_dir.mkdir(parents=True, exist_ok=True)
    np.save(peer_dir / "vectors.npy", all_vectors)
    return towers


def query_latency(data_dir: Path, questions: list[str]) -> dict[str, str]:
    from services.store import open_store

    settings = Settings(data_dir=data_dir, collection="bench", encoder=EncoderSettings(model="base"))
    with runtime_for("torch", data_dir) as runtime:
        store = open_store(settings)
        try:
            out = {}
            for mode in ("dense", "hybrid"):
                p50, p95, enc, search = bi.bench_queries(runtime.towers, store, questions, mode)
                out[mode] = f"p50 {p50:.1f} ms, p95 {p95:.1f} ms (p50 encode {enc:.1f} + search {search:.1f})"
        finally:
            store.close()
    return out


def load_inputs(scifact: Path, n_docs: int, n_queries: int) -> tuple[list[Document], list[list[tuple[str, int]]],
                                                                         list[str]]:
    """Documents, their passages grouped by the pipeline's ingest batches as (text, tokens), and questions."""
    from encoders.towers import SentenceTransformerTowers, base_model_path
    from services.ingest import batched_items

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
    parser.add_argument("--docs", type=int, default=160)
    parser.add_argument("--points", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    scifact = scifact_dir()
    if scifact is None:
        print("SciFact not found (../shared/data/beir-scifact beside the repo); skipped")
        return 0
    m = machine()
    docs, groups, questions = load_inputs(scifact, args.docs, args.queries)
    passages = sorted((p for g in groups for p in g), key=lambda p: -p[1])
    texts, tokens = [t for t, _ in passages], [k for _, k in passages]
    flops = passage_flops(tokens) / len(texts)
    load0 = os.getloadavg()[0]
    rows: list[tuple[str, str, str]] = []
    say = print
    say(f"{m['cpu']}; flags {' '.join(m['flags'])}; {m['cores']} usable cores x {m['flop_per_cycle']} FLOP/cycle x "
        f"{m['ghz']:.2f} GHz = {m['ceiling'] / 1e9:.0f} GFLOP/s fp32; {len(docs)} abstracts -> {len(texts)} "
        f"passages, mean {np.mean(tokens):.0f} tokens, {flops / 1e9:.2f} GFLOP each", flush=True)
    with tempfile.TemporaryDirectory(prefix="dpr-hotpaths-") as tmp:
        work = Path(tmp)
        backends, notes = available_backends()
        per: dict[str, dict[str, float]] = {}
        for b in backends:
            try:
                per[b] = bench_backend(b, docs, texts, work)
            except Exception as e:  # noqa: BLE001 - a backend that does not load is a note, not a crash
                notes.append(f"{b}: failed to run ({type(e).__name__}: {str(e)[:200]})")
            say(f"{b}: {per.get(b)}", flush=True)
        peer_out = subprocess.run([sys.executable, str(PEER), "ingest", str(_dump(work, texts)), str(work / "peer")],
                                  capture_output=True, text=True, check=True).stdout
        peer = json.loads(peer_out.strip().splitlines()[-1])
        peer_rate = peer["passages"] / peer["seconds"]
        torch_towers = build_collection(work / "query", texts, args.points, work / "peer")
        bucket = bench_bucketing(torch_towers, groups)
        say(f"bucketing: {bucket}", flush=True)
        rows += backend_rows(per, m, flops, float(np.mean(tokens)), peer_rate)
        rows += [(f"length bucketing (torch raw tower over the ingest batches): {k}", f"{v:.2f} passages/s",
                  f"{v / bucket['one call (before)']:.2f}x before") for k, v in bucket.items()]
        rows += process_rows(work, backends, questions[0], args.points)
        latency = query_latency(work / "query", questions)
        rows += [(f"query in-process, {mode}, {args.points:,} passages", v, f"{len(questions)} SciFact test claims, "
                  "k=10, exact scan, torch question tower") for mode, v in latency.items()]
    rows.append(("load average (1 min) at start / end", f"{load0:.1f} / {os.getloadavg()[0]:.1f}",
                 f"{m['cores']} cores, shared with other work"))
    write(args.out, m, rows, notes, len(docs), len(texts))
    return 0


def _dump(work: Path, texts: list[str]) -> Path:
    path = work / "passages.json"
    path.write_text(json.dumps(texts))
    return path


def backend_rows(per: dict[str, dict[str, float]], m: dict[str, Any], flops: float, mean_tokens: float,
                 peer_rate: float) -> list[tuple[str, str, str]]:
    rows = []
    base = per.get("torch", {}).get("raw")
    for b, r in per.items():
        share = r["raw"] * flops / m["ceiling"]
        vs = f", {r['raw'] / base:.2f}x torch" if base and b != "torch" else ""
        rows.append((f"raw passage tower, {b}", f"{r['raw']:.2f} passages/s, {r['raw'] * mean_tokens:.0f} tokens/s",
                     f"{share:.0%} of the fp32 ceiling{vs}"))
        rows.append((f"in-process ingest, {b}", f"{r['ingest']:.2f} passages/s",
                     f"ingest / raw {r['ingest'] / r['raw']:.2f}; ingest / peer {r['ingest'] / peer_rate:.2f}"))
    rows.append(("peer ingest (sentence-transformers + " + _peer_index() + ")", f"{peer_rate:.2f} passages/s",
                 "one model.encode call, batch 32, same passages"))
    return rows


def _peer_index() -> str:
    try:
        import faiss  # noqa: F401
    except ImportError:
        return "numpy; faiss-cpu not installed"
    return "faiss-cpu"


def process_rows(work: Path, backends: list[str], question: str, points: int) -> list[tuple[str, str, str]]:
    env = {**os.environ, "DPR_DATA_DIR": str(work / "query"), "DPR_COLLECTION": "bench", "DPR_ENCODER__MODEL": "base"}
    rows = []
    for b in backends:
        benv = {**env, "DPR_ENCODER__BACKEND": b, "DPR_ENCODER__QUESTION_BACKEND": b}  # both sides on b
        try:
            value = median_runs([DPR, "query", question, "--json"], benv)
        except RuntimeError as e:
            value = f"failed: {str(e)[:200]}"
        rows.append((f"`dpr query` process, embedded, {b}", value, f"median of 5, {points:,} passages"))
    peer = median_runs([sys.executable, str(PEER), "query", str(work / "peer"), question], dict(os.environ))
    rows.append((f"peer query process ({_peer_index()})", peer, f"median of 5, same {points:,} vectors"))
    return rows


def write(out: Path, m: dict[str, Any], rows: list[tuple[str, str, str]], notes: list[str], docs: int,
          passages: int) -> None:
    head = (f"Run {time.strftime('%Y-%m-%d %H:%M')} at commit {commit()} on {m['cpu']} ({', '.join(m['flags'])}), "
            f"{m['cores']} usable cores at {m['ghz']:.2f} GHz: fp32 ceiling {m['cores']} x {m['flop_per_cycle']} x "
            f"{m['ghz']:.2f} = {m['ceiling'] / 1e9:.0f} GFLOP/s. Subset: {docs} SciFact abstracts -> {passages} "
            "passages, model all-MiniLM-L6-v2 (base), batch 32, threads by services/threads.py.")
    table = ["| measure | result | notes |", "|---|---|---|", *[f"| {a} | {b} | {c} |" for a, b, c in rows]]
    text = "\n".join([head, "", *table, "", *(f"- {n}" for n in notes)])
    print(text)
    out.write_text("# Hot paths (issue 13)\n\n" + text + "\n\n" + (__doc__ or "") + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
