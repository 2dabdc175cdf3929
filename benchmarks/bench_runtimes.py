"""Issue 68: the runtime and precision chosen from the CPU, measured against the alternatives and the peers.

Sections (``--sections``, default all), each printing its figures and ratios measured side by side in one run:

- ``towers``: the raw passage tower per backend (sentence-transformers fp32, ONNX Runtime fp32 and int8, OpenVINO
  bf16) on the same SciFact passages, chunked as ``dpr ingest`` chunks them: passages/s, ratio to the product's
  old default (onnx-int8), mean cosine to torch fp32, the share of each query's top 10 (over the passages) kept,
  and the share of the machine's matrix-unit peak reached, from the clock measured here (a timed chain of
  dependent adds in a small C program: a VM's /proc/cpuinfo shows its nominal TSC) and the FLOPs of each passage
  (projections + attention, from its real token count).
- ``ingest``: the whole ``dpr ingest`` of ``--docs`` SciFact abstracts (a JSONL file) as one process into a fresh
  data dir, against the plain sentence-transformers script a user writes (``peer_plain.py``: load the model,
  encode the same passages, save them) as one process, alternated ``--rounds`` times; once "warm" (the machine's
  tower cache filled, as after any earlier `dpr` run), once "first ever" (an empty ``XDG_CACHE_HOME``: the
  export is paid in the run), emulating a CPU without AMX or AVX-512 (``ONEDNN_MAX_CPU_ISA=AVX2`` for both
  processes, which caps oneDNN in torch and OpenVINO and makes the product choose as on such a CPU, plus
  ``ATEN_CPU_CAPABILITY=avx2`` for torch), and one with AVX-512 and VNNI but no AMX nor bf16 (``avx512``: Cascade /
  Ice Lake; ``AVX512_CORE_VNNI``, ``avx512``). The product picks OpenVINO fp32 passages on both, which oneDNN caps:
  the emulation is faithful (ONNX Runtime's own kernels cannot be capped; the product runs none of them in an
  ingest there). The product's job report gives the share of its wall time spent in the tower.
- ``query``: ``Runtime.search`` p50 in-process (what `dpr query` runs), dense, over the ingested collection, by this
  commit's code on its defaults and by ``--baseline``'s (837c87e, the issue's "today": ONNX fp32 questions), each
  in its own process from a git worktree of that commit, alternated.

Usage: ``.venv/bin/python benchmarks/bench_runtimes.py [--docs 800] [--rounds 2] [--sections towers ingest query]``
(needs ../shared/data/beir-scifact; skips without it); writes ``benchmarks/results/ingest-speed/runtimes.md``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import machine_line, script  # benchmarks/ is sys.path[0]

REPO = script()

import numpy as np  # noqa: E402

BACKENDS = ("torch", "onnx", "onnx-int8", "openvino-bf16", "openvino-fp32")
PEAK_FLOP_PER_CYCLE = {  # per core, the unit each path's matrix multiplies run on with AMX
    "torch": ("AVX-512 fp32", 64), "onnx": ("AVX-512 fp32", 64), "onnx-int8": ("AMX int8", 2048),
    "openvino-bf16": ("AMX bf16", 1024), "openvino-fp32": ("AVX-512 fp32", 64),
}
PEAK_WITHOUT_AMX = {  # with AVX-512 and no AMX: two 512-bit FMA pipes (Xeons with two FMA units, Zen 5; nominal):
    # 2 x 16 fp32 FMAs, 2 x 32 bf16 pairs (VDPBF16PS), 2 x 64 int8 pairs (VPDPBUSD) a cycle
    "onnx-int8": ("AVX-512 VNNI int8", 256), "openvino-bf16": ("AVX-512 bf16", 128),
}


def peak_unit(backend: str) -> tuple[str, int]:
    """The unit ``backend``'s matrix multiplies run on here and its peak FLOP a cycle per core."""
    from encoders.runtimes import cpu_flags

    if "amx_bf16" not in cpu_flags():
        return PEAK_WITHOUT_AMX.get(backend, PEAK_FLOP_PER_CYCLE[backend])
    return PEAK_FLOP_PER_CYCLE[backend]


CLOCK_C = r"""
#include <stdio.h>
#include <time.h>
int main(void) {
    long n = 100000000L, x = 3; struct timespec a, b;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    /* 4 dependent integer multiplies an iteration, 3 cycles each: 12 cycles (an immediate add can be folded at
       rename on newer cores, a multiply cannot); timed in this thread's CPU time, so other work does not count */
    __asm__ volatile("1: imul %1, %1\n imul %1, %1\n imul %1, %1\n imul %1, %1\n dec %0\n jnz 1b"
                     : "+r"(n), "+r"(x));
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
    printf("%f\n", 1.2 / ((b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9));
    return 0;
}
"""


DATA = REPO.parent / "shared" / "data"
CORPORA = {"scifact": DATA / "beir-scifact" / "corpus.jsonl.gz", "cranfield": DATA / "cranfield" / "corpus.jsonl.gz",
           "cisi": DATA / "cisi" / "corpus.jsonl.gz", "python-docs": DATA / "python-3.11-docs" / "docs.jsonl.gz"}


def scifact() -> Path | None:
    path = CORPORA["scifact"]
    return path if path.is_file() else None


def measured_ghz(work: Path) -> float | None:
    """The core clock while running, from a chain of dependent multiplies timed in CPU time (the best of 3)."""
    src, exe = work / "clock.c", work / "clock"
    src.write_text(CLOCK_C)
    if subprocess.run(["cc", "-O1", "-o", str(exe), str(src)], capture_output=True).returncode:
        return None
    return max(float(subprocess.run([str(exe)], capture_output=True, text=True).stdout) for _ in range(3))


def passage_flops(tokens: int, layers: int = 6, hidden: int = 384, ffn: int = 1536) -> float:
    """Multiply-adds x 2 of one passage through MiniLM-L6: the projections, the FFN and attention's two products."""
    per_token = layers * 2 * (4 * hidden * hidden + 2 * hidden * ffn)
    return tokens * per_token + layers * 2 * 2 * tokens * tokens * hidden


def load_passages(n_docs: int, corpora: tuple[str, ...] = ("scifact",)
                  ) -> tuple[list[dict[str, str]], list[str], list[int]]:
    """The first ``n_docs`` documents of ``corpora`` in order (0: all of them), and their passages as
    ``dpr ingest`` chunks them (texts, token counts)."""
    from encoders.registry import load_towers
    from services.core.errors import DocumentError
    from services.core.settings import Settings
    from services.ingest.pipeline import chunk_document
    from services.readers import Document

    docs: list[dict[str, str]] = []
    for name in corpora:
        with gzip.open(CORPORA[name], "rt") as f:
            for line in f:
                d = json.loads(line)
                docs.append({"id": f"{name}/{d['_id']}", "title": d.get("title") or "", "text": d["text"]})
                if n_docs and len(docs) >= n_docs:
                    break
        if n_docs and len(docs) >= n_docs:
            break
    settings = Settings()
    towers = load_towers("base", settings.models_dir, backend="onnx", cache_dir=settings.onnx_cache_dir)
    texts, tokens = [], []
    kept: list[dict[str, str]] = []
    PER_DOC.clear()
    for d in docs:
        doc = Document(doc_id=d["id"], text=d["text"], title=d["title"], source=f"{d['id']}.json")
        try:
            chunks = chunk_document(doc, towers, settings.chunk)[0]
        except DocumentError:  # e.g. a Cranfield record with no text: `dpr ingest` reports it failed; left out
            continue
        kept.append(d)
        PER_DOC.append([c.tokens + 2 for c in chunks])  # + [CLS] and [SEP]
        for c in chunks:
            texts.append(c.encoder_text)
            tokens.append(c.tokens + 2)
    return kept, texts, tokens


PER_DOC: list[list[int]] = []  # each document's passages' token counts (load_passages)


def padding() -> float:
    """Padded tokens over real ones, minus 1, as ``dpr ingest`` batches them: ingest batches of
    ``celery.batch_documents`` documents, each cut by ``encoders.batching.length_slices``."""
    from encoders.batching import length_slices
    from services.core.settings import Settings

    per_batch, real, padded = Settings().celery.batch_documents, 0, 0
    for start in range(0, len(PER_DOC), per_batch):
        lengths = [n for doc in PER_DOC[start:start + per_batch] for n in doc]
        for chosen in length_slices(lengths, Settings().encoder.batch_size):
            padded += len(chosen) * max(lengths[i] for i in chosen)
            real += sum(lengths[i] for i in chosen)
    return padded / real - 1


def towers_section(texts: list[str], tokens: list[int], work: Path, rounds: int) -> list[str]:
    from encoders.registry import load_towers
    from services.core.settings import Settings

    settings = Settings()
    ghz = measured_ghz(work)
    towers = {b: load_towers("base", settings.models_dir, backend=b, cache_dir=settings.onnx_cache_dir)  # type: ignore[arg-type]
              for b in BACKENDS}
    warm = texts[:32]
    for t in towers.values():
        t.encode_documents(warm)
    rates: dict[str, list[float]] = {b: [] for b in BACKENDS}
    vectors: dict[str, np.ndarray] = {}
    for _ in range(rounds):
        for b, t in towers.items():  # alternated
            from services.ingest.encoding import encode_by_length

            start = time.perf_counter()
            vectors[b] = encode_by_length(t, texts, [n - 2 for n in tokens], 32)
            rates[b].append(len(texts) / (time.perf_counter() - start))
    ref = vectors["torch"]
    questions = ref[: min(200, len(ref))]  # the passages as queries: top 10 over all of them
    exact = np.argsort(-(questions @ ref.T), axis=1)[:, :10]
    flops = sum(passage_flops(n) for n in tokens) / len(tokens)
    cores = len(os.sched_getaffinity(0))
    base = statistics.median(rates["onnx-int8"])
    rows = [f"Passages: {len(texts)} (mean {sum(tokens) / len(tokens):.0f} tokens, {flops / 1e9:.2f} GFLOP each); "
            f"measured clock {ghz or float('nan'):.2f} GHz x {cores} cores; {rounds} rounds alternated; padding as "
            f"`dpr ingest` batches them {100 * padding():.1f}%.", "",
            "| backend | passages/s (each round) | vs onnx-int8 | mean cosine to fp32 | top-10 kept | "
            "matrix unit | share of its peak |", "|---|---|---|---|---|---|---|"]
    for b in BACKENDS:
        v = vectors[b]
        cos = float((v * ref).sum(axis=1).mean())
        got = np.argsort(-(questions @ v.T), axis=1)[:, :10]
        kept = float(np.mean([len(set(a) & set(g)) / 10 for a, g in zip(exact, got, strict=True)]))
        unit, per_cycle = peak_unit(b)
        rate = statistics.median(rates[b])
        share = rate * flops / (per_cycle * (ghz or float("nan")) * 1e9 * cores)
        rows.append(f"| {b} | {' / '.join(f'{r:.1f}' for r in rates[b])} | {rate / base:.2f} | {cos:.5f} | "
                    f"{kept:.3f} | {unit} | {100 * share:.1f}% |")
    return rows


def run(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr[-2000:]}")
    return seconds, done.stdout


# the steps an ingest job times (IngestReport): label, report key less "_seconds"
STEPS = (("the tower", "encode"), ("store writes", "upsert"), ("chunking", "chunk"), ("BM25 vectors", "sparse"),
         ("parsing (beside the tower)", "parse"))


def ingest_section(docs: list[dict[str, str]], texts: list[str], work: Path, rounds: int,
                   cases: tuple[str, ...] = ("warm", "first", "avx2", "avx512")) -> list[str]:
    jsonl = work / "docs.jsonl"
    jsonl.write_text("".join(json.dumps(d) + "\n" for d in docs))
    passages = work / "passages.json"
    passages.write_text(json.dumps(texts))
    dpr, python = str(REPO / ".venv" / "bin" / "dpr"), sys.executable
    peer = [python, str(REPO / "benchmarks" / "peer_plain.py"), "ingest", str(passages), str(work / "peer")]
    # as a user's shell: no DPR_* settings, and Python's bytecode cached (pip compiles it at install; a shell with
    # PYTHONDONTWRITEBYTECODE compiles torch's imports again in every process, seconds for either side)
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("DPR_") and k != "PYTHONDONTWRITEBYTECODE"}
    avx2 = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    avx512 = {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI", "ATEN_CPU_CAPABILITY": "avx512"}
    rows = [f"{len(docs)} documents, {len(texts)} passages.", "",
            "| case | `dpr ingest` s (each round) | plain script s (each round) | ratio (median) | product's "
            "tower | tower share of `dpr ingest` wall |", "|---|---|---|---|---|---|"]
    every = {"warm": ("warm: the machine ran `dpr` before", {}, False),
             "first": ("first ever: empty cache, export paid", {}, True),
             "avx2": ("AVX2 emulated (ONEDNN_MAX_CPU_ISA=AVX2), warm", avx2, False),
             "avx512": ("AVX-512 VNNI, no AMX (ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI), warm", avx512, False)}
    notes: list[str] = []
    for case, extra, fresh_cache in (every[c] for c in cases):
        ours, theirs, shares = [], [], []
        steps: list[dict[str, float]] = []
        backend = ""
        for _ in range(rounds):
            data = work / "dd"
            shutil.rmtree(data, ignore_errors=True)
            cache = work / "xdg-fresh" if fresh_cache else work / "xdg"
            if fresh_cache:
                shutil.rmtree(cache, ignore_errors=True)
            env = {**base_env, **extra, "DPR_DATA_DIR": str(data), "XDG_CACHE_HOME": str(cache)}
            if not fresh_cache and not (cache / "dpr-ingest").exists():  # fill the warm cache once, untimed
                run([dpr, "ingest", str(jsonl), "--json"], {**env, "DPR_DATA_DIR": str(work / "warmup")})
                shutil.rmtree(work / "warmup", ignore_errors=True)
            seconds, out = run([dpr, "ingest", str(jsonl), "--json"], env)
            report = json.loads(out)
            ours.append(seconds)
            shares.append(report["encode_seconds"] / seconds)
            steps.append({name: float(report.get(f"{key}_seconds", 0.0)) for name, key in STEPS})
            status = json.loads(run([dpr, "status", "--json"], env)[1])
            backend = status["towers"]["passages"]["backend"]
            theirs.append(run(peer, {**base_env, **extra})[0])
        ratio = statistics.median(theirs) / statistics.median(ours)
        rows.append(f"| {case} | {' / '.join(f'{s:.1f}' for s in ours)} | {' / '.join(f'{s:.1f}' for s in theirs)} "
                    f"| **{ratio:.2f}x** | {backend} | {100 * statistics.median(shares):.0f}% |")
        wall = statistics.median(ours)
        spent = {name: statistics.median(s[name] for s in steps) for name, _ in STEPS}
        rest = wall - sum(v for k, v in spent.items() if k != "parsing (beside the tower)")
        notes.append(f"- {case}: of {wall:.1f} s, " + ", ".join(f"{k} {v:.1f} s ({100 * v / wall:.0f}%)"
                                                             for k, v in spent.items())
                     + f"; the rest, start-up (imports, the towers' load) and the end-of-job index build, "
                     f"{rest:.1f} s ({100 * rest / wall:.0f}%)")
    return [*rows, "", "Where `dpr ingest`'s wall time went (medians of the rounds, from its `--json` report):", "",
            *notes]


QUERY_CHILD = """
import json, statistics, sys, time
from pathlib import Path
# the commit's code first: the venv's editable install of this checkout would answer every import otherwise
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path.insert(0, sys.argv[3])
import services
from services.core.settings import Settings
from services.query import QueryOptions
from services.runtime import Runtime
questions = json.loads(Path(sys.argv[2]).read_text())
settings = Settings(data_dir=Path(sys.argv[1]), serving={"cache_size": 0})
options = QueryOptions(k=10, mode="dense")
with Runtime(settings) as runtime:
    runtime.search(questions[0], options)  # load, warm
    times, hits = [], []
    cpu = time.process_time()  # every thread's: the runtimes encode on their own threads
    for q in questions:
        start = time.perf_counter()
        got = runtime.search(q, options)
        times.append(time.perf_counter() - start)
        hits.append([h.id for h in got])
    cpu_ms = 1000 * (time.process_time() - cpu) / len(questions)
    print(json.dumps({"p50_ms": 1000 * statistics.median(times), "cpu_ms": cpu_ms, "hits": hits,
                      "code": services.__file__, "questions": str(settings.encoder.questions)}))
"""


def query_section(docs: list[dict[str, str]], work: Path, rounds: int, baseline: str) -> list[str]:
    """Dense question p50 of ``Runtime.search`` in-process (what `dpr query` runs), over the collection the ingest
    section left (``work/dd``; made here when that section did not run), by this commit's code and by
    ``baseline``'s (a git worktree of that commit, on its own defaults), alternated, each in its own process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPR_") and k != "PYTHONDONTWRITEBYTECODE"}
    if not (work / "dd").exists():
        jsonl = work / "docs.jsonl"
        jsonl.write_text("".join(json.dumps(d) + "\n" for d in docs))
        run([str(REPO / ".venv" / "bin" / "dpr"), "ingest", str(jsonl)], {**env, "DPR_DATA_DIR": str(work / "dd")})
    old = work / "baseline"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(old), baseline], check=True,
                   capture_output=True)
    questions = work / "questions.json"
    questions.write_text(json.dumps([json.loads(line)["text"] for line in (
        REPO.parent / "shared" / "data" / "beir-scifact" / "queries.jsonl").read_text().splitlines()[:100]]))
    results: dict[str, list[float]] = {}
    cpus: dict[str, list[float]] = {}
    answers: dict[str, list[list[str]]] = {}
    towers: dict[str, str] = {}
    try:
        for _ in range(rounds):
            for label, code in (("this commit", REPO), (f"{baseline} (before)", old)):
                out = json.loads(run([sys.executable, "-c", QUERY_CHILD, str(work / "dd"), str(questions), str(code)],
                                     env)[1].splitlines()[-1])
                assert Path(out["code"]).is_relative_to(code), out["code"]  # that commit's code answered
                results.setdefault(label, []).append(out["p50_ms"])
                cpus.setdefault(label, []).append(out["cpu_ms"])
                answers[label], towers[label] = out["hits"], out["questions"]
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old)], capture_output=True)
    now, before = list(results)
    same = np.mean([set(a) == set(b) for a, b in zip(answers[now], answers[before], strict=True)])
    rows = ["| code | question tower | dense search p50 ms (each round) | vs before | CPU ms a question, every "
            "thread (each round) | vs before |", "|---|---|---|---|---|---|"]
    for label, p50s in results.items():
        rows.append(f"| {label} | {towers[label]} | {' / '.join(f'{p:.2f}' for p in p50s)} | "
                    f"**{statistics.median(p50s) / statistics.median(results[before]):.2f}** | "
                    f"{' / '.join(f'{c:.2f}' for c in cpus[label])} | "
                    f"**{statistics.median(cpus[label]) / statistics.median(cpus[before]):.2f}** |")
    rows += ["", f"Same top-10 passages for {100 * same:.0f}% of {len(answers[now])} questions (the passages are "
             "this commit's vectors; the two question towers differ)."]
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=800)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sections", nargs="+", default=["towers", "ingest", "query"])
    parser.add_argument("--baseline", default="837c87e", help="the commit the query section compares with")
    parser.add_argument("--corpora", nargs="+", default=["scifact"], choices=sorted(CORPORA),
                        help="documents read in this order up to --docs (0: all): scifact cranfield cisi python-docs "
                        "with --docs 0 make about 20k passages")
    parser.add_argument("--cases", nargs="+", default=["warm", "first", "avx2", "avx512"],
                        choices=["warm", "first", "avx2", "avx512"])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "ingest-speed" / "runtimes.md")
    args = parser.parse_args()
    if scifact() is None:
        print("skipped: needs ../shared/data/beir-scifact beside the repository")
        return 0
    lines = [f"# Runtimes chosen from the CPU (issue 68): `bench_runtimes.py --docs {args.docs} --rounds "
             f"{args.rounds} --sections {' '.join(args.sections)} --corpora {' '.join(args.corpora)} --cases "
             f"{' '.join(args.cases)}`", "", machine_line(), ""]
    with tempfile.TemporaryDirectory(prefix="bench-runtimes-") as tmp:
        work = Path(tmp)
        docs, texts, tokens = load_passages(args.docs, tuple(args.corpora))
        for section in args.sections:
            start = time.perf_counter()
            rows = {"towers": lambda: towers_section(texts, tokens, work, args.rounds),
                    "ingest": lambda: ingest_section(docs, texts, work, args.rounds, tuple(args.cases)),
                    "query": lambda: query_section(docs, work, args.rounds, args.baseline)}[section]()
            lines += [f"## {section} ({time.perf_counter() - start:.0f} s; load after: "
                      f"{' / '.join(f'{x:.1f}' for x in os.getloadavg())})", "", *rows, ""]
            print("\n".join(lines[-len(rows) - 3:]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
