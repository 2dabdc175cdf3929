"""A re-embed target left behind by workers: real Valkey, real `dpr worker`s (SIGKILLed mid re-embed), the real base
model and a second real model (the fixtures of test_reembed.py). Once the re-embed's lease expires (no step
refreshed it for DPR_REEMBED__LOCK_TTL), `dpr status` lists the target with its builder, the workers' job, dead,
and `dpr gc` drops it (before: owner "workers", alive unknown, kept by gc forever)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_reembed import cluster, second_model, snapshot, start_worker, write_corpus  # noqa: F401 - fixtures
from worker_cluster import Cluster, wait_until

from services.jobs import JobStore
from services.lifecycle.progress import ReembedProgress

pytestmark = [pytest.mark.integration, pytest.mark.serial]  # timing-bound: runs after the parallel part


@pytest.mark.slow  # `make test-slow`: waits out a dead re-embed's lease (~50 s)
def test_a_target_whose_workers_died_is_listed_dead_with_its_job_and_dropped_by_gc(
    cluster: Cluster, tmp_path: Path  # noqa: F811 - the fixture imported above
) -> None:
    folder = tmp_path / "corpus"
    write_corpus(folder, 24)
    cluster.env["DPR_REEMBED__BATCH_SIZE"] = "2"
    cluster.env["DPR_REEMBED__LOCK_TTL"] = "10"  # the shortest lease the settings allow
    ingester = start_worker(cluster)
    assert cluster.dpr_json("ingest", str(folder), "--collection", "k", "--wait")["failed"] == []
    ingester.stop()
    source = snapshot(cluster, "k")["active"]

    submitted = cluster.dpr_json("reembed", "--model", "v2", "--collection", "k")
    assert submitted["outcome"] == "submitted"
    target = submitted["target"]
    victim = start_worker(cluster)
    progress = ReembedProgress(JobStore.from_url(cluster.broker_url), "k", target)
    wait_until(lambda: progress.counts()[0] >= 2, 180, "two re-embed batches to finish", interval=0.02)
    victim.kill()  # every worker gone: nothing refreshes the re-embed's lease any more

    def listed_dead() -> dict | None:  # type: ignore[type-arg]
        unfinished = cluster.dpr_json("status", "--collection", "k")["unfinished"]
        return unfinished[0] if unfinished and unfinished[0]["owner"]["alive"] is False else None

    orphan = wait_until(listed_dead, 60, "the target to be listed with a dead builder", interval=1.0)
    assert orphan["name"] == target and orphan["status"] == "building"
    assert orphan["owner"]["job"] == submitted["job"] and orphan["owner"]["lease"] == "dpr:lock:reembed:k"
    assert orphan["owner"]["pid"] is None and "dpr gc" in orphan["next"]
    assert 0 < orphan["points"]

    dropped = cluster.dpr_json("gc", "--collection", "k", "--keep", "5")["dropped"]
    assert dropped == [target]
    after = snapshot(cluster, "k")
    assert after["active"] == source and set(after["generations"]) == {source}
    assert cluster.dpr_json("status", "--collection", "k")["unfinished"] == []
