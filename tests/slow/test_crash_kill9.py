"""Kill -9 anywhere: real `dpr ingest` processes on SciFact abstracts (the real base model, the default backend),
SIGKILLed at random moments over several rounds. After each kill the next command opens the store at once (with
DPR_EDGE__LOCK_TIMEOUT=5, a lease left behind would fail it), and the run after the kills gives exactly the points
a clean run gives (point ids, document hashes, chunk indices). A `dpr reembed` killed mid-way leaves no orphan
generation that the collection shows or answers from, and the collection still answers. A `dpr serve` killed
mid-upload reopens at once and a new server's re-run of the upload gives the clean points; a `dpr train` (tiny
model) killed mid-way leaves no half-written model listed or activatable, and a re-run adds exactly one model.

``CRASH_SEED`` picks the kill moments (default: a fixed seed); ``CRASH_REPORT=FILE`` writes the rounds
and outcomes as JSON (benchmarks/results/reliability/crash.md was made that way).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from kit.documents import scifact_jsonl
from kit.stored import stored_points

pytestmark = pytest.mark.slow

DOCS = 200
ROUNDS = 5
KILL_WINDOW = (0.15, 1.0)  # kill moments, as a share of a whole run's wall time (model load, read, encode, write)


def _env(data: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPR_") or k == "DPR_ONNX_CACHE"}
    env |= {"DPR_DATA_DIR": str(data), "DPR_EDGE__LOCK_TIMEOUT": "5", "DPR_MIN_FREE_MB": "0",
            "DPR_EDGE__INDEX_THRESHOLD": "100000"}
    return env


def _dpr(data: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "entrypoints.cli.main", *args], env=_env(data), text=True,
                          capture_output=True, timeout=timeout)


def _status(data: Path) -> dict[str, Any]:
    started = time.monotonic()
    done = _dpr(data, "status", "--json", timeout=120)
    assert done.returncode == 0, f"the store did not open after a kill: {done.stderr[-800:]}"
    return json.loads(done.stdout) | {"open_seconds": round(time.monotonic() - started, 2)}


def test_ingest_killed_at_random_moments_loses_nothing_and_doubles_nothing(shared_data: Path, tmp_path: Path
                                                                           ) -> None:
    corpus = scifact_jsonl(shared_data, tmp_path / "corpus.jsonl", DOCS)
    clean_dir, crash_dir = tmp_path / "clean", tmp_path / "crashed"
    clean = _dpr(clean_dir, "ingest", str(corpus), "--json")
    assert clean.returncode == 0, clean.stderr[-800:]
    expected = stored_points(clean_dir)
    assert len(expected) >= DOCS
    started = time.monotonic()  # a whole run's wall time once the ONNX export exists: the kill moments' scale
    assert _dpr(tmp_path / "timing", "ingest", str(corpus), "--json").returncode == 0
    run_seconds = time.monotonic() - started

    seed = int(os.environ.get("CRASH_SEED", "20261127"))
    rng = random.Random(seed)
    rounds: list[dict[str, Any]] = []
    for number in range(ROUNDS):
        delay = round(rng.uniform(*KILL_WINDOW) * run_seconds, 2)
        proc = subprocess.Popen([sys.executable, "-m", "entrypoints.cli.main", "ingest", str(corpus), "--json"],
                                env=_env(crash_dir), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        finished_first = proc.poll() is not None
        if not finished_first:
            proc.send_signal(signal.SIGKILL)
        code = proc.wait()
        status = _status(crash_dir)  # opens at once: the kernel dropped the dead process's lock
        rounds.append({"round": number + 1, "kill_after_s": delay, "killed": not finished_first, "exit": code,
                       "points_after": status["points"], "status_exit": 0, "open_s": status["open_seconds"]})
    final = _dpr(crash_dir, "ingest", str(corpus), "--json")
    assert final.returncode == 0, final.stderr[-800:]
    report = json.loads(final.stdout)
    got = stored_points(crash_dir)
    missing, extra = set(expected) - set(got), set(got) - set(expected)
    changed = [pid for pid in set(expected) & set(got) if expected[pid] != got[pid]]
    outcome = {"seed": seed, "documents": DOCS, "clean_points": len(expected), "run_seconds": round(run_seconds, 1),
               "rounds": rounds,
               "final": {"points": len(got), "missing": len(missing), "extra": len(extra), "changed": len(changed),
                         "documents_encoded": report.get("documents"), "unchanged": report.get("unchanged")}}
    if os.environ.get("CRASH_REPORT"):
        Path(os.environ["CRASH_REPORT"]).write_text(json.dumps(outcome, indent=2))
    assert any(r["killed"] and 0 < r["points_after"] < len(expected) for r in rounds) or not any(
        r["killed"] for r in rounds[1:]), f"no kill landed while points were being written: {outcome}"
    assert (missing, extra, changed) == (set(), set(), []), outcome


def test_reembed_killed_midway_leaves_no_orphan_generation(shared_data: Path, tmp_path: Path) -> None:
    from kit.tiny_models import tiny_sentence_model

    corpus = scifact_jsonl(shared_data, tmp_path / "corpus.jsonl", DOCS)
    data = tmp_path / "data"
    assert _dpr(data, "ingest", str(corpus), "--json").returncode == 0
    built = tiny_sentence_model(tmp_path / "tiny")  # another model, so that there is something to re-embed
    (data / "models").mkdir(exist_ok=True)
    os.replace(built, data / "models" / "tiny")
    before = _status(data)
    rng = random.Random(int(os.environ.get("CRASH_SEED", "20261127")))
    delay = round(rng.uniform(0.5, 4.0), 2)
    generations = data / "store" / "passages" / "generations"
    known = {p.name for p in generations.iterdir()}
    proc = subprocess.Popen([sys.executable, "-m", "entrypoints.cli.main", "reembed", "--model", "tiny", "--json"],
                            env=_env(data), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline and {p.name for p in generations.iterdir()} <= known:
        time.sleep(0.05)  # until the re-embed has made its new generation: then it is copying into it
    new_dirs = sorted({p.name for p in generations.iterdir()} - known)
    time.sleep(delay)
    killed = proc.poll() is None
    if killed:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    after = _status(data)
    outcome = {"kill_after_new_generation_s": delay, "killed": killed, "new_dirs": new_dirs,
               "before": before["generations"],
               "after": after["generations"], "unfinished_after": after.get("unfinished")}
    swapped = after["generation"] != before["generation"]  # killed after its swap (on exit): the new one, whole
    outcome["swapped_before_the_kill"] = swapped
    if killed and swapped:
        assert after["generation"] in new_dirs and after["points"] == before["points"], outcome
    elif killed:  # the collection still answers from the generation it had, with every point
        assert (after["generation"], after["points"]) == (before["generation"], before["points"]), outcome
    hits = _dpr(data, "query", "cancer cells", "--json", timeout=300)
    assert hits.returncode == 0 and json.loads(hits.stdout), hits.stderr[-500:]
    rerun = _dpr(data, "reembed", "--model", "tiny", "--json")  # the re-run completes
    assert rerun.returncode == 0, rerun.stderr[-800:]
    final = _status(data)
    assert final["generation"] != before["generation"] and final["points"] == before["points"], final
    outcome["after_rerun"] = final["generations"]
    if os.environ.get("CRASH_REPORT"):
        Path(os.environ["CRASH_REPORT"]).with_suffix(".reembed.json").write_text(json.dumps(outcome, indent=2))
    shown = {g["name"] for g in after["generations"]} - {g["name"] for g in before["generations"]} - {
        after["generation"]}
    assert not shown, f"a killed re-embed's generation is listed as one of the collection's: {outcome}"
    if killed:  # it is shown apart, as unfinished, with its builder dead (the re-run resumed it)
        assert all(u["owner"]["alive"] is False for u in after["unfinished"]), after["unfinished"]
        assert {u["name"] for u in after["unfinished"]} <= set(new_dirs), (after["unfinished"], new_dirs)
    assert final["unfinished"] == [], final["unfinished"]


def _compare(expected: dict[str, tuple[str, int, str]], got: dict[str, tuple[str, int, str]]) -> dict[str, int]:
    missing, extra = set(expected) - set(got), set(got) - set(expected)
    changed = [pid for pid in set(expected) & set(got) if expected[pid] != got[pid]]
    return {"points": len(got), "missing": len(missing), "extra": len(extra), "changed": len(changed)}


def _upload(server: Any, corpus: Path) -> tuple[Any, str]:
    import httpx

    client = httpx.Client(base_url=server.url, timeout=60)
    r = client.post("/v1/documents", files={"file": (corpus.name, corpus.read_bytes(), "application/x-ndjson")})
    assert r.status_code == 202, r.text
    return client, str(r.json()["job"])


def test_serve_killed_mid_upload_reopens_at_once_and_a_rerun_gives_the_cleanstored_points(shared_data: Path,
                                                                                     tmp_path: Path) -> None:
    """`dpr serve` (its own process group, the in-process executor) SIGKILLed a seeded random moment after it
    accepted a JSONL upload; then `dpr status`, then a new server, the same upload, to the end."""
    from integration.api_server import ServeProcess, wait_job, wait_ready

    corpus = scifact_jsonl(shared_data, tmp_path / "corpus.jsonl", DOCS)
    started = time.monotonic()
    clean = _dpr(tmp_path / "clean", "ingest", str(corpus), "--json")
    run_seconds = time.monotonic() - started  # the kill moments' scale
    assert clean.returncode == 0, clean.stderr[-800:]
    expected = stored_points(tmp_path / "clean")
    data = tmp_path / "crashed"
    seed = int(os.environ.get("CRASH_SEED", "20261127"))
    delay = round(random.Random(seed).uniform(0.1, 0.9) * run_seconds, 2)
    server = ServeProcess(_env(data), tmp_path)
    try:
        wait_ready(server.url, timeout=180, process=server.process, log=server.log)
        client, job = _upload(server, corpus)
        time.sleep(delay)
        state = client.get(f"/v1/jobs/{job}").json()
        client.close()
        killed = server.process.poll() is None
        os.killpg(server.process.pid, signal.SIGKILL)  # the server and anything it started
        code = server.process.wait()
    finally:
        server.stop()
    status = _status(data)  # DPR_EDGE__LOCK_TIMEOUT=5: a lease left behind would fail it
    outcome: dict[str, Any] = {"seed": seed, "documents": DOCS, "clean_points": len(expected),
                               "run_seconds": round(run_seconds, 1), "kill_after_upload_s": delay, "killed": killed,
                               "exit": code, "job_state_at_kill": state.get("state"),
                               "points_after": status["points"], "open_s": status["open_seconds"]}
    rerun = ServeProcess(_env(data), tmp_path)
    try:
        wait_ready(rerun.url, timeout=180, process=rerun.process, log=rerun.log)
        client, job = _upload(rerun, corpus)
        done = wait_job(client, job, timeout=600)
        client.close()
    finally:
        assert rerun.stop() in (0, -15), rerun.log.read_text(errors="replace")[-2000:]
    outcome["rerun"] = {"state": done["state"], "documents": done.get("documents"),
                        "unchanged": done.get("unchanged"), "failed": len(done.get("failed") or [])}
    outcome["final"] = _compare(expected, stored_points(data))
    if os.environ.get("CRASH_REPORT"):
        Path(os.environ["CRASH_REPORT"]).with_suffix(".serve.json").write_text(json.dumps(outcome, indent=2))
    assert done["state"] == "done", outcome
    assert outcome["final"] == {"points": len(expected), "missing": 0, "extra": 0, "changed": 0}, outcome


def _train_args(tmp_path: Path) -> list[str]:
    from kit.tiny_models import tiny_sentence_model

    from services.lab.shared.recipe_files import recipe_text

    words = ["lava magma eruption", "ice snow moraine", "sand dune cactus", "wave salt reef", "tree moss fern",
             "street subway crowd", "bank delta bridge", "peak summit ridge"]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"question": f"tell me about {w.split()[0]} {r}",
                                         "passage": f"A passage on {w}, part {r}."}) + "\n"
                             for r in range(4) for w in words))
    base = tiny_sentence_model(tmp_path / "tiny")
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(recipe_text(train={"max_steps": 6, "batch_size": 8}, negatives={"num_negatives": 0}))
    return ["train", str(pairs), "--base", str(base), "--recipe", str(recipe), "--name", "crash", "--json"]


def _models(data: Path) -> list[dict[str, Any]]:
    listed = _dpr(data, "models", "list", "--json", timeout=120)
    assert listed.returncode == 0, listed.stderr[-800:]
    return [m for m in json.loads(listed.stdout)["models"] if m["name"] not in ("base", "multilingual")]


def _whole(model_dir: Path) -> bool:
    """Every file a model card promises: the weights' fingerprint is the card's."""
    from encoders.towers import model_fingerprint

    card = model_dir / "model_card.json"
    return (model_dir / "modules.json").is_file() and card.is_file() and \
        json.loads(card.read_text()).get("fingerprint") == model_fingerprint(model_dir)


def test_train_killed_midway_leaves_no_half_written_model(tmp_path: Path) -> None:
    args = _train_args(tmp_path)
    started = time.monotonic()
    clean = _dpr(tmp_path / "clean", *args)
    run_seconds = time.monotonic() - started
    assert clean.returncode == 0, clean.stderr[-800:]
    data = tmp_path / "crashed"
    models = data / "models"
    seed = int(os.environ.get("CRASH_SEED", "20261127"))
    delay = round(random.Random(seed).uniform(0.0, 1.5), 2)
    proc = subprocess.Popen([sys.executable, "-m", "entrypoints.cli.main", *args], env=_env(data),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline and not (models.is_dir() and any(models.iterdir())):
        time.sleep(0.01)  # until the save has begun (its staging directory): then it writes, renames, exports
    time.sleep(delay)
    killed = proc.poll() is None
    if killed:
        proc.send_signal(signal.SIGKILL)
    code = proc.wait()
    listed = _models(data)
    on_disk = sorted(p.name for p in models.iterdir()) if models.is_dir() else []
    outcome: dict[str, Any] = {"seed": seed, "run_seconds": round(run_seconds, 1), "kill_after_save_began_s": delay,
                               "killed": killed, "exit": code, "on_disk": on_disk,
                               "listed": [m["name"] for m in listed]}
    half = [m["name"] for m in listed if not _whole(models / m["name"])]
    activatable = [name for name in on_disk if name not in outcome["listed"] and (models / name).is_dir()
                   and _dpr(data, "models", "activate", name, "--json", timeout=120).returncode == 0]
    rerun = _dpr(data, *args)
    assert rerun.returncode == 0, rerun.stderr[-800:]
    after = _models(data)
    new = sorted({m["name"] for m in after} - set(outcome["listed"]))
    outcome |= {"half_written_listed": half, "unlisted_but_activatable": activatable, "new_after_rerun": new,
                "after_rerun_whole": all(_whole(models / m["name"]) for m in after)}
    if os.environ.get("CRASH_REPORT"):
        Path(os.environ["CRASH_REPORT"]).with_suffix(".train.json").write_text(json.dumps(outcome, indent=2))
    assert killed or code == 0, outcome
    assert (half, activatable) == ([], []), f"a killed train left a half-written model visible: {outcome}"
    assert len(new) == 1 and outcome["after_rerun_whole"], outcome
