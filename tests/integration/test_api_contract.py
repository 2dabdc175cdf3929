"""The API's published contract, checked by a tool nobody here wrote: schemathesis (`st run URL/openapi.json --checks
all`), against a real `dpr serve` this test starts, as a new user would run it (issue 71).

One server over a small collection: first with no keys (every caller the anonymous admin; the schema names no
security and POST /v1/keys is refused), then with an admin key made on the machine as `dpr keys create` makes it
(the server locks at once, its schema now names the two ways to send a key) and the run sends it. Every check
(not_a_server_error, status and content-type conformance, response schemas and headers, negative data rejected,
positive data accepted, missing headers, unsupported methods and Allow, ignored auth, use after free, resource
availability) runs over the coverage, fuzzing and stateful phases, with a bounded number of examples per operation
(``MAX_EXAMPLES``) and deterministic generation, so a run takes seconds and meets the same cases each time; a
longer, randomised run with thousands of cases is ``benchmarks/bench_api_contract.py``. Whatever routes the app has
when this runs are fuzzed: the schema is fetched from the server.

The test fails on any failure schemathesis reports, on a run that could not authenticate (every keyed operation
answered 401/403: the cases would prove nothing), on a traceback in the server's log, and if the admin key no
longer works afterwards (the fuzzer may not revoke the key it runs with).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_server import ServeProcess, wait_job, wait_ready

from services.access import KeyStore, keys_path

pytestmark = pytest.mark.integration

SCHEMATHESIS = str(Path(sys.executable).with_name("schemathesis"))
MAX_EXAMPLES = 12  # per operation and phase: both runs together well under a minute on 2 busy cores
# The API's contract exceptions (shared with the benchmark); POST /v1/snapshots takes no input and each example writes
# an archive (~1 s): two are enough (the coverage phase's probes of it run whatever the bound).
CONFIG = (Path(__file__).resolve().parents[2] / "benchmarks" / "api_contract.toml").read_text() + (
    '[[operations]]\ninclude-path = "/v1/snapshots"\ninclude-method = "POST"\ngeneration.max-examples = 2\n')
RUN_TIMEOUT = 240  # seconds: a hung run fails the test instead of the suite
DOCS = [
    {"id": f"doc-{i}", "title": f"Note {i}", "text": text, "metadata": {"topic": topic, "year": 2000 + i}}
    for i, (text, topic) in enumerate([
        ("The Nile is the longest river in Africa and flows north into the Mediterranean Sea.", "rivers"),
        ("Alpha particles are helium nuclei emitted in radioactive decay.", "physics"),
        ("Python reads a file line by line when you iterate over the file object.", "python"),
        ("The Danube flows east through ten countries into the Black Sea.", "rivers"),
        ("Beta decay emits an electron or a positron from the nucleus.", "physics"),
        ("A context manager closes the file when the with block ends.", "python"),
    ])
]


def serve_env(data_dir: Path, onnx_cache: Path, **extra: str) -> dict[str, str]:
    """``dpr serve``'s environment: the test's data dir, the session's ONNX export, no rate limit in the way of a
    fuzzer, small request limits (a generated batch stays cheap to encode); nothing else of the caller's DPR_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPR_")}
    env.update({
        "DPR_DATA_DIR": str(data_dir), "DPR_ONNX_CACHE": str(onnx_cache), "DPR_ENCODER__THREADS": "1",
        "DPR_API__RATE_LIMIT": "100000", "DPR_API__RATE_BURST": "100000", "DPR_API__MAX_DOCUMENTS": "8",
        "DPR_API__MAX_REQUEST_BYTES": "200000", "DPR_CHUNK__MAX_TOKENS": "64", "DPR_CHUNK__OVERLAP": "8",
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **extra,
    })
    return env


def run_schemathesis(url: str, report_dir: Path, max_examples: int, *extra: str,
                     timeout: float = RUN_TIMEOUT) -> dict[str, Any]:
    """``st run URL/openapi.json --checks all`` with bounded, deterministic examples; its JSON report (which the
    caller checks) plus the console's tail for the assertion messages."""
    report_dir.mkdir(parents=True, exist_ok=True)
    config = report_dir / "schemathesis.toml"
    config.write_text(CONFIG)
    command = [SCHEMATHESIS, "--config-file", str(config), "run", f"{url}/openapi.json", "--checks", "all",
               "--max-examples", str(max_examples), "--workers", "1", "--no-color", "--report", "json",
               "--report-dir", str(report_dir), "--request-timeout", "60", *extra]
    # run in the report's folder: schemathesis keeps a cache (.schemathesis/) in its working directory
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False, cwd=report_dir)
    (report_dir / "console.txt").write_text(done.stdout + done.stderr)
    reports = sorted(report_dir.glob("json-*.json"))
    assert reports, f"schemathesis wrote no report (exit {done.returncode}):\n{done.stdout[-3000:]}{done.stderr}"
    report = dict(json.loads(reports[-1].read_text()))
    report["console_tail"] = (done.stdout + done.stderr)[-6000:]
    return report


def assert_clean(report: dict[str, Any], keyed: bool) -> None:
    """No failure of any check, no error, every operation tested, and (keyed) the key was accepted."""
    cases = report["test_cases"]
    tail = report["console_tail"]
    assert report["exit_code"] == 0 and report["complete"], tail
    assert report["failures"] == [] and report["errors"] == [] and cases["with_failures"] == 0, tail
    assert report["operations"]["tested"] == report["operations"]["total"] >= 15, report["operations"]
    assert cases["generated"] >= 200, cases  # a run that sent almost nothing proves nothing
    if keyed:  # every operation answered only 401/403: the run never got past the key
        assert not report["warnings"].get("missing_auth"), report["warnings"]["missing_auth"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, onnx_cache: Path) -> Iterator[tuple[ServeProcess, Path]]:
    root = tmp_path_factory.mktemp("contract")
    data = root / "dpr"
    process = ServeProcess(serve_env(data, onnx_cache), root)
    try:
        wait_ready(process.url, timeout=180, process=process.process, log=process.log)
        with httpx.Client(base_url=process.url, timeout=60) as client:
            job = client.post("/v1/documents", json={"documents": DOCS})
            assert job.status_code == 202, job.text
            assert wait_job(client, job.json()["job"])["state"] == "done"
        yield process, root
    finally:
        process.stop()
    log = process.log.read_text(errors="replace")
    assert "Traceback" not in log, log[-5000:]


def test_the_contract_holds_without_keys_and_with_an_admin_key(server: tuple[ServeProcess, Path]) -> None:
    process, root = server
    url = process.url
    # no keys: anyone on the machine is served, nobody may mint the first key over HTTP
    seized = httpx.post(f"{url}/v1/keys", json={"role": "read", "name": "mine", "rate": 1.0})
    assert seized.status_code == 403 and "dpr keys create" in seized.json()["error"]["message"], seized.text
    open_schema = httpx.get(f"{url}/openapi.json").json()
    assert not any("security" in op for ops in open_schema["paths"].values() for op in ops.values())
    started = time.monotonic()
    assert_clean(run_schemathesis(url, root / "report-open", MAX_EXAMPLES, "--generation-deterministic"), False)
    assert not keys_path(root / "dpr").exists(), "the run without keys made a key: the server was seized"

    # an admin key made on the machine (what `dpr keys create --role admin` does): the server locks at once
    _, token = KeyStore(keys_path(root / "dpr")).create("admin", name="contract-admin")
    assert httpx.get(f"{url}/v1/status").status_code == 401
    keyed_schema = httpx.get(f"{url}/openapi.json").json()
    assert keyed_schema["paths"]["/v1/status"]["get"]["security"] == [{"APIKeyHeader": []}, {"HTTPBearer": []}]
    report = run_schemathesis(url, root / "report-admin", MAX_EXAMPLES, "--generation-deterministic",
                              "--header", f"X-API-Key: {token}")
    assert_clean(report, True)
    took = time.monotonic() - started
    whoami = httpx.get(f"{url}/v1/whoami", headers={"X-API-Key": token})
    assert whoami.status_code == 200 and whoami.json()["key"]["role"] == "admin", whoami.text
    print(f"\nschemathesis without keys and with an admin key: {took:.0f} s; admin run {report['test_cases']} "
          f"({root})")
