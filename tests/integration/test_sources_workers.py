"""Sources with workers (a real Redis-compatible server, real `dpr worker` and `dpr beat` processes): the beat's
tick makes a worker sync a due source, and `dpr sources sync` with a broker hands its job to the workers and
reads only what changed."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from worker_cluster import DPR, Cluster, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.serial]


def test_the_beat_and_the_workers_sync_sources(make_cluster: Callable[[], Cluster], tmp_path: Path) -> None:
    cluster = make_cluster()
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "boiler.md").write_text("# Boiler\n\nTo reset the boiler, hold the red button for ten seconds.\n")
    (folder / "garden.txt").write_text("The garden hose is kept in the shed behind the house.\n")
    cluster.start_worker()
    cluster.dpr_json("sources", "add", "notes", str(folder), "--every", "1m")
    last = cluster.data_dir / "sources" / "notes" / "last.json"

    log = cluster.root / "beat.log"
    with open(log, "wb") as out:
        beat = subprocess.Popen([DPR, "beat"], env={**cluster.env, "DPR_SOURCES__TICK_SECONDS": "1"}, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, cwd=cluster.root)
    try:
        wait_until(lambda: last.exists() and json.loads(last.read_text()).get("outcome") == "ok", 240,
                   "the beat's tick to make a worker sync the source")
    finally:
        os.killpg(beat.pid, 15)
        beat.wait(30)
    first = json.loads(last.read_text())
    assert (first["added"], first["documents"]) == (2, 2), cluster.logs()
    hits = cluster.dpr_json("status")["sources"]
    assert hits[0]["name"] == "notes" and hits[0]["last"]["outcome"] == "ok"

    # `dpr sources sync` with a broker: its job's batches run on the workers; only the changed file is read
    (folder / "garden.txt").write_text("The garden hose now hangs on the hook by the back door.\n")
    second = cluster.dpr_json("sources", "sync", "notes")
    assert second["outcome"] == "ok" and second["read"] == ["garden.txt"] and second["documents"] == 1
    job = cluster.dpr_json("jobs", second["job"])
    assert job["executor"] == "broker" and job["state"] == "done", job
