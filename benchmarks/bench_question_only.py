"""Activation to first answer of a question-only model against the full (re-)embed of the same collection.

A question-only model (`dpr train --question-only`) keeps its partner's passage tower, so `dpr models activate`
serves the stored points at once; any other model change costs a re-embed of every passage. Steps, each a real
`dpr` process against one data dir (the embedded store, default backends):

1. build a collection of ``--docs`` English documents (BEIR SciFact's 5,183 abstracts by default, about 10k
   passages; more come from CISI, Cranfield, then SQuAD dev paragraphs) with the partner (the base model):
   `dpr ingest` timed end to end; its passages/s is the encoder's throughput on this collection
   (bench_reembed.py measured re-embed / ingest throughput 0.97, so the full re-embed time is estimated as
   passages / (0.97 x ingest passages/s): said so in the output, not measured);
2. ``--model`` (a question-only model of the base) is copied into the data dir; `dpr models activate` then
   `dpr query` are run back to back, timed from the start of the first to the answer of the second (the query
   process starts cold: imports, the ONNX question tower's session); then the same query again (warm files), and
   `dpr models activate base` + a query (rollback to first answer); the collection's generation before and after
   (no new generation means nothing was re-embedded);
3. with the whole SciFact corpus stored: SciFact test nDCG@10 of the base and of ``--model`` over the SAME stored
   vectors, asked as `dpr query` asks (``Runtime``: the configured model's question tower, the collection check).

Usage: ``nice -n 10 .venv/bin/python benchmarks/bench_question_only.py --model .dpr/models/qo-... [--docs 5183]
[--work /tmp/bench-qo]``; prints a JSON record (CPU model and flags, commit, figures); a work dir that already holds
the collection skips step 1 (its ingest figures are read back from ``ingest.json`` there).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from machine import commit, cpu_flags, cpu_model

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
DPR = [sys.executable, "-m", "entrypoints.cli.main"] if not (REPO / ".venv" / "bin" / "dpr").exists() else [
    str(REPO / ".venv" / "bin" / "dpr")]
QUESTION = "Which genes are associated with an increased risk of breast cancer?"
REEMBED_OVER_INGEST = 0.97  # benchmarks/results/ingest-speed/reembed.md
SCIFACT_DOCS = 5183


def corpus(path: Path, docs: int) -> int:
    """Up to ``docs`` documents as one BEIR-style corpus JSONL; returns how many."""
    written = 0
    with open(path, "w") as out:
        for name in ("beir-scifact", "cisi", "cranfield"):
            with gzip.open(DATA / name / "corpus.jsonl.gz", "rt") as f:
                for line in f:
                    if written >= docs:
                        return written
                    row = json.loads(line)
                    if name != "beir-scifact":  # SciFact keeps its ids: its test questions are scored (step 3)
                        row["_id"] = f"{name}/{row['_id']}"
                    out.write(json.dumps({"_id": row["_id"], "title": row.get("title") or "",
                                          "text": row.get("text") or ""}) + "\n")
                    written += 1
        with gzip.open(DATA / "squad-v1.1-dev" / "dev-v1.1.json.gz", "rt") as f:
            for article in json.load(f)["data"]:
                for i, paragraph in enumerate(article["paragraphs"]):
                    if written >= docs:
                        return written
                    out.write(json.dumps({"_id": f"squad/{article['title']}/{i}", "title": article["title"],
                                          "text": paragraph["context"]}) + "\n")
                    written += 1
    return written


def dpr(env: dict[str, str], *args: str) -> tuple[float, dict | list]:  # type: ignore[type-arg]
    t0 = time.perf_counter()
    done = subprocess.run([*DPR, *args, "--json"], env=env, capture_output=True, text=True, cwd=REPO)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"dpr {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return seconds, json.loads(done.stdout)


def wait_for_model(pattern: str, minutes: float) -> Path:
    """The newest directory matching ``pattern`` that holds a model card and its ONNX export, waiting up to
    ``minutes`` for one."""
    import glob

    deadline = time.monotonic() + 60 * minutes
    while True:
        found = sorted(p for p in glob.glob(pattern) if (Path(p) / "model_card.json").is_file()
                       and (Path(p) / "onnx" / "manifest.json").is_file())  # `dpr train` exports after saving
        if found:
            return Path(found[-1])
        if time.monotonic() >= deadline:
            raise SystemExit(f"no model at {pattern}")
        time.sleep(10)


def quality(work: Path, model: str) -> dict[str, object]:
    """SciFact test (300 claims, read once per model) through the stored collection, as `dpr query` answers: the
    base and the question-only model over the SAME stored vectors (one ingest, two question towers); nDCG@10 of
    documents (max score per document over its chunks, as `dpr eval` aggregates them)."""
    sys.path.insert(0, str(REPO))
    from services.core.settings import Settings
    from services.lab.evaluation.retrieval import score_retrieval
    from services.lab.evaluation.store_retriever import CHUNK_OVERFETCH, hits_to_retrieval
    from services.query import QueryOptions, search_many
    from services.readers import load_dataset
    from services.runtime import Runtime

    test = load_dataset(DATA / "beir-scifact", "test", "auto")
    qids = sorted(test.queries)
    out: dict[str, object] = {"queries": len(qids)}
    for spec in ("base", model):
        runtime = Runtime(Settings(data_dir=work / "data", encoder={"model": spec}))
        try:
            towers = runtime.question_towers
            stored = runtime.store.active().spec.model  # type: ignore[union-attr]
            t0 = time.perf_counter()
            hits = search_many([test.queries[q] for q in qids], store=runtime.store, towers=towers,
                               options=QueryOptions(k=100 * CHUNK_OVERFETCH, mode="dense"),
                               towers_for=runtime.question_towers_for)
            seconds = time.perf_counter() - t0
            metrics, _ = score_retrieval(test, hits_to_retrieval(qids, hits, 100))
            out[spec] = {"ndcg@10": round(metrics["ndcg@10"], 4), "recall@100": round(metrics["recall@100"], 4),
                         "question_tower": towers.name, "its_passage_fingerprint": towers.fingerprint,
                         "stored_points_fingerprint": stored, "served_without_fallback": towers.fingerprint == stored,
                         "seconds": round(seconds, 1)}
        finally:
            runtime.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True,
                    help="a question-only model directory (partner: base), or a glob pattern of one")
    ap.add_argument("--wait", type=float, default=0.0,
                    help="minutes to wait for --model to appear (a training still running) after step 1")
    ap.add_argument("--docs", type=int, default=SCIFACT_DOCS, help="documents (SciFact's 5,183 make ~10k passages)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench-question-only"))
    ap.add_argument("--data-dir", type=Path,
                    help="step 2 only, over a data dir that already holds a collection the base embedded (e.g. "
                         "bench_scale.py --keep DIR: DIR/<lever>/dpr, a million points); the full re-embed time is "
                         "then estimated from --reembed-pps")
    ap.add_argument("--reembed-pps", type=float,
                    help="with --data-dir: re-embed passages/s measured elsewhere (benchmarks/results/ingest-speed/)")
    args = ap.parse_args()
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    data_dir = args.data_dir or work / "data"
    env = {**os.environ, "DPR_DATA_DIR": str(data_dir), "PYTHONPATH": str(REPO)}
    cpu = {"model": cpu_model(), "cores": os.cpu_count(), "flags": cpu_flags().split()}
    record: dict[str, object] = {"cpu": cpu, "commit": commit(), "python": platform.python_version()}

    ingest_file = work / "ingest.json"
    if args.data_dir and not args.reembed_pps:
        raise SystemExit("--data-dir needs --reembed-pps (the re-embed rate to estimate the full re-embed from)")
    if not args.data_dir and not ingest_file.is_file():
        n = corpus(work / "corpus.jsonl", args.docs)
        dpr(env, "models", "activate", "base")
        seconds, out = dpr(env, "ingest", str(work / "corpus.jsonl"), "--format", "beir")
        assert isinstance(out, dict)
        ingest_file.write_text(json.dumps({"documents": n, "seconds": round(seconds, 1), "summary": out}))
    ingest = {"documents": 0} if args.data_dir else json.loads(ingest_file.read_text())  # nothing ingested here
    _, status = dpr(env, "status")
    assert isinstance(status, dict)
    passages = int(status["points"])
    record["collection"] = {"documents": ingest["documents"], "passages": passages, "generation": status["generation"],
                            "data_dir": str(data_dir)}
    if args.data_dir:
        record["full_reembed_estimate"] = {"seconds": round(passages / args.reembed_pps, 1), "measured": False,
                                           "how": f"passages / {args.reembed_pps} re-embed passages/s (--reembed-pps)"}
    else:
        rate = passages / ingest["seconds"]
        record["ingest_with_partner"] = {"seconds": ingest["seconds"], "passages_per_s": round(rate, 2),
                                         "measured": True}
        record["full_reembed_estimate"] = {"seconds": round(passages / (REEMBED_OVER_INGEST * rate), 1),
                                           "measured": False,
                                           "how": f"passages / ({REEMBED_OVER_INGEST} x the ingest's passages/s)"}

    model = wait_for_model(str(args.model), args.wait)
    models = data_dir / "models"
    target = models / model.name
    if not target.exists():
        shutil.copytree(model, target)
    t0 = time.perf_counter()
    activate_s, activated = dpr(env, "models", "activate", target.name)
    query_s, hits = dpr(env, "query", QUESTION, "-k", "10", "--mode", "dense")
    first_answer = time.perf_counter() - t0
    again_s, _ = dpr(env, "query", QUESTION, "-k", "10", "--mode", "dense")
    _, after = dpr(env, "status")
    assert isinstance(activated, dict) and isinstance(hits, list) and isinstance(after, dict)
    t1 = time.perf_counter()
    back_s, _ = dpr(env, "models", "activate", "base")
    back_query_s, base_hits = dpr(env, "query", QUESTION, "-k", "10", "--mode", "dense")
    rollback = time.perf_counter() - t1
    assert isinstance(base_hits, list)
    record["activation"] = {
        "model": target.name, "passage_tower": activated.get("passage_tower"),
        "activate_s": round(activate_s, 2), "first_query_s": round(query_s, 2),
        "activation_to_first_answer_s": round(first_answer, 2), "second_query_s": round(again_s, 2),
        "generation_before": status["generation"], "generation_after": after["generation"],
        "hits": len(hits), "top_hit": hits[0]["doc_id"] if hits else None,
        "rollback_to_first_answer_s": round(rollback, 2), "rollback_activate_s": round(back_s, 2),
        "rollback_query_s": round(back_query_s, 2),
        "answers_differ_from_base": [h["doc_id"] for h in hits] != [h["doc_id"] for h in base_hits]
        or [h["score"] for h in hits] != [h["score"] for h in base_hits],
    }
    record["ratio_reembed_over_activation"] = round(
        float(record["full_reembed_estimate"]["seconds"]) / first_answer, 1)  # type: ignore[index]
    if ingest["documents"] >= SCIFACT_DOCS and not args.data_dir:
        record["scifact_test_through_this_collection"] = quality(work, target.name)
    record["load_average"] = os.getloadavg()
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
