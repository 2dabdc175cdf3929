"""Does the HTTP API keep its published contract under a long fuzz? (issue 71)

schemathesis (`st run URL/openapi.json --checks all`: every check, the coverage, fuzzing and stateful phases) against
a real `dpr serve` on loopback over SciFact abstracts, as a new user would run it: first the server with no keys,
then the same server with an admin key made on the machine (what `dpr keys create --role admin` does) and sent by
the run. Thousands of cases (``--max-examples`` per operation and phase), a random seed that the results record
(``--seed`` to replay one). `tests/integration/test_api_contract.py` runs the same thing small and deterministic in
`make test`; this is the long run, whose output is committed.

    .venv/bin/python benchmarks/bench_api_contract.py            # 60 SciFact abstracts, 100 examples, ~10 min
    .venv/bin/python benchmarks/bench_api_contract.py --max-examples 20 --out /tmp/contract

Writes ``benchmarks/results/reliability/api-contract.md`` and ``.json`` (the schemathesis JSON reports and the
console output of each run beside them, under ``api-contract/``); exits 1 when a run found a failure.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from machine import OFFLINE, machine, machine_line, script

REPO = script()

import httpx  # noqa: E402
from serve_process import ServeProcess  # noqa: E402

from services.access import KeyStore, keys_path  # noqa: E402

SCHEMATHESIS = str(Path(sys.executable).with_name("schemathesis"))
SCIFACT = REPO.parent / "shared" / "data" / "beir-scifact" / "corpus.jsonl.gz"
RESULTS = REPO / "benchmarks" / "results" / "reliability"
# the API's contract exceptions (shared with tests/integration/test_api_contract.py), 5 examples of POST /v1/snapshots
CONFIG = (REPO / "benchmarks" / "api_contract.toml").read_text() + (
    '[[operations]]\ninclude-path = "/v1/snapshots"\ninclude-method = "POST"\ngeneration.max-examples = 5\n')
FALLBACK = [  # without ../shared/data: a few documents of our own
    ("The Nile is the longest river in Africa and flows north into the Mediterranean Sea.", "rivers"),
    ("Alpha particles are helium nuclei emitted in radioactive decay.", "physics"),
    ("Python reads a file line by line when you iterate over the file object.", "python"),
    ("The Danube flows east through ten countries into the Black Sea.", "rivers"),
]


def corpus(n: int) -> tuple[list[dict[str, Any]], str]:
    """``n`` SciFact abstracts as API documents (with a filterable field), or the fallback; and what they are."""
    if not SCIFACT.exists():
        docs = [{"id": f"doc-{i}", "text": t, "metadata": {"topic": topic}} for i, (t, topic) in enumerate(FALLBACK)]
        return docs, f"{len(docs)} built-in documents ({SCIFACT} is missing)"
    docs = []
    with gzip.open(SCIFACT, "rt", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            docs.append({"id": str(row["_id"]), "title": row.get("title", "")[:2000], "text": row["text"],
                         "metadata": {"year": 2000 + len(docs) % 20, "topic": "scifact"}})
            if len(docs) == n:
                break
    return docs, f"{len(docs)} SciFact abstracts (the first of {SCIFACT.relative_to(REPO.parent)})"


def ingest(url: str, docs: list[dict[str, Any]], batch: int) -> None:
    with httpx.Client(base_url=url, timeout=120) as client:
        for i in range(0, len(docs), batch):
            r = client.post("/v1/documents", json={"documents": docs[i:i + batch]})
            r.raise_for_status()
            job = r.json()["job"]
            while (state := client.get(f"/v1/jobs/{job}").json()["state"]) not in ("done", "failed"):
                time.sleep(0.2)
            if state != "done":
                raise RuntimeError(f"ingest job {job} {state}")


def fuzz(url: str, out: Path, max_examples: int, seed: int, *extra: str) -> dict[str, Any]:
    """One schemathesis run; its JSON report (plus the console's summary) or raises if it wrote none."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "schemathesis.toml").write_text(CONFIG)
    command = [SCHEMATHESIS, "--config-file", str(out / "schemathesis.toml"), "run", f"{url}/openapi.json",
               "--checks", "all", "--max-examples", str(max_examples), "--seed", str(seed), "--workers", "1",
               "--no-color", "--generation-database", "none", "--request-timeout", "120", "--report", "json",
               "--report-dir", str(out), "--report-json-path", str(out / "report.json"), *extra]
    t0 = time.perf_counter()
    work = Path(os.environ.get("TMPDIR", "/tmp"))  # schemathesis keeps a cache (.schemathesis/) where it runs
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=work)
    console = done.stdout + done.stderr
    (out / "console.txt").write_text(console.replace(url, "http://127.0.0.1:PORT"))
    if not (out / "report.json").exists():
        raise RuntimeError(f"schemathesis wrote no report (exit {done.returncode}):\n{console[-3000:]}")
    report = dict(json.loads((out / "report.json").read_text()))
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    report["command"] = " ".join(c if not c.startswith("X-API-Key") else "X-API-Key: KEY" for c in command[1:])
    report["command"] = report["command"].replace(url, "http://127.0.0.1:PORT")
    return report


def summary(name: str, report: dict[str, Any]) -> dict[str, Any]:
    cases = report["test_cases"]
    return {
        "run": name, "seed": report["seed"], "wall_s": report["wall_s"], "exit_code": report["exit_code"],
        "operations": report["operations"]["tested"], "cases": cases["generated"],
        "failures": cases["unique_failures"], "errors": len(report["errors"]),
        "phases": {k: v["status"] for k, v in report["phases"].items()},
        "failure_titles": [  # the console.txt beside the report has each case and its curl
            f"{f.get('code')} {f.get('title')} ({f.get('count')}x): {', '.join(f.get('operations') or [])}"
            for f in report["failures"]],
        "warnings": {k: v for k, v in report["warnings"].items() if v},
    }


def markdown(rows: list[dict[str, Any]], about: dict[str, Any]) -> str:
    lines = [
        "# The HTTP API's contract under a long fuzz (issue 71)", "",
        "`benchmarks/bench_api_contract.py`: schemathesis "
        f"{about['schemathesis']} (`st run URL/openapi.json --checks all`, coverage, fuzzing and stateful phases, "
        f"{about['max_examples']} examples per operation and phase, seed {about['seed']}) against `dpr serve` on "
        f"loopback over {about['corpus']}: first with no keys, then with an admin key made on the machine.", "",
        f"Machine: {about['machine']}" + (f"; the server ran {about['code']}" if about["code"] else ""), "",
        "| run | operations | cases | failures | errors | phases | wall |", "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        phases = ", ".join(f"{k} {v}" for k, v in r["phases"].items())
        lines.append(f"| {r['run']} | {r['operations']} | {r['cases']:,} | {r['failures']} | {r['errors']} | "
                     f"{phases} | {r['wall_s']:.0f} s |")
    for r in rows:
        lines += ["", f"## {r['run']}", ""]
        lines += [f"- failure: {t}" for t in r["failure_titles"]] or ["- no failure of any check"]
        lines += [f"- schemathesis warning `{k}`: {', '.join(map(str, v)) if isinstance(v, list) else v}"
                  for k, v in r["warnings"].items()]
    lines += ["", "Warnings are not failures: `missing_auth` without keys lists the key routes (refused with 403 "
              "on a server without keys, by design: the first key is made on the machine); `missing_test_data` lists "
              "operations whose generated ids name nothing (no evaluation report in the data dir, random key ids).",
              "", "Each run's schemathesis JSON report and console output: `api-contract/`."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=60, help="SciFact abstracts to ingest first (60)")
    parser.add_argument("--max-examples", type=int, default=100, help="examples per operation and phase (100)")
    parser.add_argument("--seed", type=int, default=None, help="schemathesis seed (default: a random one, recorded)")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"results folder ({RESULTS})")
    parser.add_argument("--code", default=None, help="what code the server ran, for the results (default: the "
                        "commit of this checkout); e.g. run from `git archive COMMIT` with PYTHONPATH set to it")
    parser.add_argument("--keep", action="store_true", help="keep the server's data dir (removed by default)")
    args = parser.parse_args()
    args.out = args.out.resolve()  # schemathesis runs in another folder
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-api-contract-{os.getpid()}"
    data = work / "dpr"
    work.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPR_")} | OFFLINE | {
        "DPR_DATA_DIR": str(data), "DPR_ENCODER__THREADS": "1", "DPR_API__RATE_LIMIT": "100000",
        "DPR_API__RATE_BURST": "100000", "DPR_API__MAX_DOCUMENTS": "16", "DPR_API__MAX_REQUEST_BYTES": "200000"}
    docs, about_corpus = corpus(args.docs)
    print(machine_line(), flush=True)
    os.chdir(work)  # the server's working directory: nothing it is asked to read relative to it is the repository's
    server = ServeProcess(env, work / "serve.log")
    rows, reports = [], {}
    try:
        print(f"dpr serve ready in {server.wait_ready():.1f} s; ingesting {about_corpus}", flush=True)
        ingest(server.url, docs, 16)
        detail = args.out / "api-contract"
        reports["no keys"] = fuzz(server.url, detail / "no-keys", args.max_examples, seed)
        rows.append(summary("no keys", reports["no keys"]))
        print(rows[-1], flush=True)
        _, token = KeyStore(keys_path(data)).create("admin", name="bench-api-contract")
        reports["admin key"] = fuzz(server.url, detail / "admin-key", args.max_examples, seed,
                                    "--header", f"X-API-Key: {token}")
        rows.append(summary("admin key", reports["admin key"]))
        print(rows[-1], flush=True)
        still = httpx.get(f"{server.url}/v1/whoami", headers={"X-API-Key": token}, timeout=30).status_code
    finally:
        server.stop()
    log = (work / "serve.log").read_text(errors="replace")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    about = {"schemathesis": reports["no keys"]["schemathesis_version"], "max_examples": args.max_examples,
             "seed": seed, "corpus": about_corpus, "machine": machine_line(), "code": args.code,
             "server_tracebacks": log.count("Traceback"), "admin_key_after_run": still}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "api-contract.json").write_text(json.dumps({"about": about, "machine": machine(), "runs": rows,
                                                             "commands": {k: r["command"] for k, r in
                                                                          reports.items()}}, indent=2) + "\n")
    text = markdown(rows, about) + (f"\nServer log: {about['server_tracebacks']} tracebacks; the admin key answered "
                                    f"{still} after the run (the fuzzer may not revoke the key it runs with).\n")
    (args.out / "api-contract.md").write_text(text)
    print(text)
    failed = any(r["failures"] or r["errors"] or r["exit_code"] for r in rows) or about["server_tracebacks"]
    return 1 if failed or still != 200 else 0


if __name__ == "__main__":
    sys.exit(main())
