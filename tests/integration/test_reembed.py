"""Re-embedding through real Redis (Valkey) and real `dpr worker` processes, with the real base model and a real
second model (the base model with one layer scaled: valid, different weights, different fingerprint).

- a worker SIGKILLed in the middle of a re-embed, `dpr reembed` run again: same ids and count as the source,
  one fingerprint, and the alias only moved once the target was complete;
- a query loop across the swap (while documents are ingested): zero errors, every answer from one generation,
  documents ingested during the re-embed present in the new generation; `dpr rollback` restores the fingerprint.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kit.tiny_models import second_base_model
from worker_cluster import DPR, Cluster, Worker, wait_until

from services.core.settings import Settings
from services.jobs import JobStore
from services.lifecycle import reembed_status
from services.lifecycle.progress import ReembedProgress
from services.runtime import Runtime
from services.store import open_store

pytestmark = [pytest.mark.integration, pytest.mark.serial]  # timing-bound: runs after the parallel part

WORDS = (
    "protein folding immune vaccine retrieval passage vector encoder climate ocean coral gradient descent "
    "statin cholesterol trial photosynthesis chlorophyll ribosome chaperone"
).split()


def write_corpus(folder: Path, n: int, start: int = 0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(start, start + n):
        words = " ".join(WORDS[(i * 5 + j * 3) % len(WORDS)] for j in range(40 + (i % 3) * 30))
        (folder / f"doc_{i:03d}.txt").write_text(f"Doc {i}\n\n{words}.\n", encoding="utf-8")


@pytest.fixture(scope="session")
def second_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return second_base_model(tmp_path_factory.mktemp("models") / "v2")


def install_model(cluster: Cluster, model: Path) -> None:
    models = cluster.data_dir / "models"
    models.mkdir(parents=True, exist_ok=True)
    (models / "v2").symlink_to(model, target_is_directory=True)


def start_worker(cluster: Cluster, queues: str = "ingest,reembed") -> Worker:
    return cluster.start_worker(queues=queues)


def settings_of(cluster: Cluster, collection: str) -> Settings:
    return Settings(data_dir=cluster.data_dir, collection=collection, broker_url=cluster.broker_url)


def snapshot(cluster: Cluster, collection: str) -> dict[str, Any]:
    store = open_store(Settings(data_dir=cluster.data_dir, collection=collection))
    try:
        info = store.info()
        gens = {}
        for g in info.generations:
            passages = [p for b in store.scroll(generation=g.name) for p in b]
            gens[g.name] = {
                "ids": {p.id for p in passages},
                "count": store.count(generation=g.name),
                "models": {p.model for p in passages},
                "docs": {p.doc_id for p in passages},
                "spec_model": g.spec.model,
            }
        return {"active": info.active.name if info.active else None, "generations": gens}
    finally:
        store.close()


def wait_for_reembed(settings: Settings, target: str, timeout: float = 300) -> dict[str, Any]:
    def finished() -> dict[str, Any] | None:
        status = reembed_status(settings, target)
        return status if status.get("result") else None

    return wait_until(finished, timeout, f"re-embed into {target} to finish")


@pytest.fixture
def cluster(make_cluster: Callable[[], Cluster], second_model: Path) -> Iterator[Cluster]:
    c = make_cluster()
    c.env["DPR_REEMBED__BATCH_SIZE"] = "6"
    install_model(c, second_model)
    yield c


@pytest.mark.slow  # `make test-slow`: a whole re-embed waiting out a killed worker's redelivery (~1 min)
def test_reembed_with_a_worker_killed_midway_resumes_to_a_complete_uniform_generation(
    cluster: Cluster, tmp_path: Path
) -> None:
    folder = tmp_path / "corpus"
    write_corpus(folder, 48)
    # Many small batches, so that the kill below lands while most of them are still to do (with a handful of
    # batches a fast run finished, swapped included, before the kill).
    cluster.env["DPR_REEMBED__BATCH_SIZE"] = "2"
    ingester = start_worker(cluster)
    assert cluster.dpr_json("ingest", str(folder), "--collection", "k", "--wait")["failed"] == []
    ingester.stop()  # the re-embed's batches wait in the queue for the victim: none runs before we watch
    before = snapshot(cluster, "k")
    source = before["active"]
    source_ids = before["generations"][source]["ids"]
    assert len(source_ids) >= 48

    first = cluster.dpr_json("reembed", "--model", "v2", "--collection", "k")
    assert first["outcome"] == "submitted" and first["source"] == source and first["batches"] >= 4
    victim = start_worker(cluster)  # (with a worker already up, a quick run once finished before the kill)
    target = first["target"]
    progress = ReembedProgress(JobStore.from_url(cluster.broker_url), "k", target)
    assert first["job"] == progress.job
    wait_until(lambda: progress.counts()[0] >= 2, 180, "two re-embed batches to finish", interval=0.02)
    victim.kill()  # SIGKILL mid re-embed: a batch in flight, more queued
    during = snapshot(cluster, "k")
    assert during["active"] == source, "the alias moved before the new generation was complete"
    assert 0 < during["generations"][target]["count"] < len(source_ids)

    second = cluster.dpr_json("reembed", "--model", "v2", "--collection", "k")  # run it again: resumes
    assert second["outcome"] == "submitted" and second["target"] == target and second["resumed"] is True
    assert second["passages"] < len(source_ids), "the resumed run re-sent passages already re-embedded"
    start_worker(cluster)
    status = wait_for_reembed(settings_of(cluster, "k"), target)
    assert status["result"]["outcome"] == "activated", (status, cluster.logs())
    job = cluster.dpr_json("jobs", first["job"])  # the re-embed is a job of the one job model
    assert job["executor"] == "reembed" and job["batches_pending"] == [] and job["result"]["outcome"] == "activated"

    after = snapshot(cluster, "k")
    assert after["active"] == target
    new, old = after["generations"][target], after["generations"][source]
    assert new["ids"] == source_ids == old["ids"]
    assert new["count"] == len(source_ids)
    assert new["models"] == {new["spec_model"]} and new["spec_model"] != old["spec_model"]
    assert (cluster.data_dir / "models" / "ACTIVE").read_text().strip() == "v2"


def test_queries_across_the_swap_never_fail_and_rollback_restores_the_fingerprint(
    cluster: Cluster, tmp_path: Path
) -> None:
    folder, extra = tmp_path / "corpus", tmp_path / "extra"
    write_corpus(folder, 16)
    write_corpus(extra, 4, start=100)
    start_worker(cluster, queues="ingest")  # the re-embed waits in its queue until a second worker comes
    assert cluster.dpr_json("ingest", str(folder), "--collection", "q", "--wait")["failed"] == []
    old_model = snapshot(cluster, "q")["generations"]["q__g0001"]["spec_model"]

    runtime = Runtime(settings_of(cluster, "q").model_copy(update={"broker_url": None}))
    errors: list[str] = []
    answers: list[set[str]] = []
    stop = threading.Event()

    def query_loop() -> None:
        from services.query import QueryOptions, search

        while not stop.is_set():
            try:
                hits = search("protein folding vaccine", store=runtime.store, towers=runtime.towers,
                              options=QueryOptions(k=5, mode="dense"), towers_for=runtime.towers_for)
                answers.append({h.passage.model for h in hits})
            except Exception as e:  # noqa: BLE001 - every failure is the finding
                errors.append(f"{type(e).__name__}: {e}")
            time.sleep(0.05)

    loop = threading.Thread(target=query_loop, daemon=True)
    loop.start()
    try:
        submitted = cluster.dpr_json("reembed", "--model", "v2", "--collection", "q")
        # documents ingested after the re-embed planned its batches (into the still active source generation)
        # must end up in the new generation too: the finalize catch-up copies them
        assert cluster.dpr_json("ingest", str(extra), "--collection", "q", "--wait")["failed"] == []
        start_worker(cluster, queues="reembed")
        status = wait_for_reembed(settings_of(cluster, "q"), submitted["target"])
        assert status["result"]["outcome"] == "activated", (status, cluster.logs())
        wait_until(lambda: answers and answers[-1] != {old_model}, 60, "queries answered by the new generation")
    finally:
        stop.set()
        loop.join(30)
        runtime.close()

    assert errors == [], errors[:5]
    assert all(len(models) == 1 for models in answers), "an answer mixed two generations"
    seen = set().union(*answers)
    assert old_model in seen and len(seen) == 2, "the query loop did not span the swap"
    after = snapshot(cluster, "q")
    new = after["generations"][submitted["target"]]
    extra_docs = {f"doc_{i:03d}.txt" for i in range(100, 104)}
    assert extra_docs <= {Path(d).name for d in after["generations"]["q__g0001"]["docs"]}  # written before the swap
    assert extra_docs <= {Path(d).name for d in new["docs"]}
    assert new["ids"] == after["generations"]["q__g0001"]["ids"] and new["models"] == {new["spec_model"]}

    back = cluster.dpr_json("rollback", "--collection", "q")
    assert back["to"] == "q__g0001" and back["model"] == old_model
    status = cluster.dpr_json("status", "--collection", "q")
    assert status["model"] == old_model and status["model_matches"] is True
    assert (cluster.data_dir / "models" / "ACTIVE").read_text().strip() == "base"


def test_the_beat_starts_a_reembed_when_the_active_model_changes_and_only_one_beat_runs(
    cluster: Cluster, tmp_path: Path
) -> None:
    folder = tmp_path / "corpus"
    write_corpus(folder, 6)
    start_worker(cluster)
    assert cluster.dpr_json("ingest", str(folder), "--collection", "b", "--wait")["failed"] == []
    cluster.dpr("models", "activate", "v2")
    assert (cluster.data_dir / "models" / "ACTIVE").read_text().strip() == "v2"
    env = {**cluster.env, "DPR_REEMBED__SCHEDULE_SECONDS": "1", "DPR_COLLECTION": "b"}
    log = cluster.root / "beat.log"
    with open(log, "wb") as out:
        beat = subprocess.Popen([DPR, "beat"], env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=cluster.root)
    try:
        wait_until(lambda: "beat: Starting" in log.read_text(errors="replace") or beat.poll() is not None, 60,
                   "the beat to start")
        assert beat.poll() is None, log.read_text()
        second = subprocess.run([DPR, "beat"], env=env, capture_output=True, text=True, timeout=60)
        assert second.returncode != 0 and "another beat" in second.stderr

        def swapped() -> bool:
            status = cluster.dpr_json("status", "--collection", "b")
            return bool(status["generation"] != "b__g0001" and status["model_matches"])

        wait_until(swapped, 240, "the scheduled re-embed to swap the collection", interval=2)
    finally:
        os.killpg(beat.pid, 15)
        beat.wait(30)
    after = snapshot(cluster, "b")
    new = after["generations"][after["active"]]
    assert new["ids"] == after["generations"]["b__g0001"]["ids"] and len(new["models"]) == 1


def test_a_model_outside_the_models_dir_is_refused_before_anything_reaches_the_workers(
    cluster: Cluster, second_model: Path, tmp_path: Path
) -> None:
    # The workers find a re-embed's towers by fingerprint under DATA_DIR/models: given a path elsewhere, every
    # batch failed on them while `dpr reembed --wait` waited on. It is refused up front, naming the fix.
    outside = tmp_path / "elsewhere"
    outside.symlink_to(second_model, target_is_directory=True)
    (cluster.data_dir / "models" / "v2").unlink()  # the fixture's link: v2 is now nowhere under DATA_DIR/models
    done = cluster.dpr("reembed", "--model", str(outside), "--collection", "p", "--wait")
    assert done.returncode == 2, done.stdout + done.stderr
    assert str(cluster.data_dir / "models") in done.stderr and "dpr reembed --model NAME" in done.stderr
    import redis

    assert redis.Redis.from_url(cluster.broker_url).llen("reembed") == 0  # nothing was sent to the workers
