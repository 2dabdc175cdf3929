"""HNSW for an embedded generation, built without holding its lease while the graph is built, and swapped in
even while writers keep writing.

qdrant-edge builds graphs only in ``EdgeShard.optimize()``, which blocks its caller and holds the GIL (measured:
another thread of the same process ran 2 queries in the 12.7 s a 20k-point build took). So the build runs on a
copy, in a child process (``BuildChild``; what runs there: ``build_child.py``), and only the short ends hold the
generation's lease:

1. no lease: copy the shard directory to ``shard.build`` while others use it; then under the lease (the shard is
   not loaded here for it: a process that has it open flushed it and keeps it open) copy again only the files
   that changed since
   (``fsutil.copy_tree_changed``: sealed segments do not; the appendable one and the WAL are small) and open the
   build journal (``edge_journal.py``): from here every write to the shard is also journaled;
2. no lease: the child (``nice`` 10) loads the copy with the indexing threshold, counts it (with a memory budget,
   chooses the levers for that many points, records them and loads the copy again if they changed), moves payload
   indexes a generation made before they followed ``payload_on_disk`` (``move_payload_indexes``, once) and runs
   ``optimize()``, then replays the journal's writes onto it in rounds while writers go on;
3. under the lease: the child replays what is left and the copy's point count must equal the shard's (else the
   copy is dropped: nothing is lost, the next job end or ``dpr optimize`` builds again);
4. still under it: the child closes the copy and the directories are swapped (``shard.build`` -> ``shard.next`` ->
   ``shard``, the old one renamed ``shard.old`` and removed after); a process that has the old one open answers
   from it until its next call loads the new one (``lease.py``).

The lease is held for the changed files' copy and for the last replay round and the swap; the build itself, the
bulk of the copy and of the replay run beside the writers and readers. A crash between the renames leaves
``shard.next`` and no ``shard``: ``recover_swap`` finishes it before the shard is next loaded. One build per
generation at a time (``.index.lock``); ``index.json`` records the points the last build saw (the replayed ones are
not in its graph), so ``needs_index`` asks for a build only when ``threshold`` new points have arrived since.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdrant_edge import CountRequest

from services.core.errors import StoreUnavailable
from services.core.fsutil import Noted, copy_tree_changed, json_or_empty, tracks_mapped_writes, write_atomic
from services.store.edge.config import (  # what every query reads of a generation's folder
    BUILD,
    INDEX_RECORD,
    NEXT,
    OLD,
    SHARD,
    index_record,
    recover_swap,
)

if TYPE_CHECKING:
    from services.store.edge.engine import EdgeEngine

log = logging.getLogger(__name__)

PARTS = "shard.parts"  # a first build's copy written anew a segment at a time (``build_child.split_copy``)
_BUILD_LOCK = ".index.lock"
_BUILD_TIMEOUT = 6 * 3600  # seconds; a build that takes longer is killed and reported
_STEP_TIMEOUT = 3600  # seconds for one replay round, or for closing the copy
_CATCH_UP_ROUNDS, _CATCH_UP_ENOUGH = 8, 16  # replay rounds off the lease; a round this short ends them
_CHILD = "from services.store.edge.build_child import child_main; child_main()"
_PROJECT_ROOT = Path(__file__).resolve().parents[3]


def threshold_kb(points: int, dim: int) -> int:
    """Qdrant's indexing threshold is in KB of vectors per segment: ``points`` float32 vectors of ``dim``."""
    return max(1, points * dim * 4 // 1024)


def segment_kinds(shard_dir: Path) -> list[str]:
    """The dense index type of each segment: ``hnsw`` or ``plain``."""
    kinds: list[str] = []
    for path in sorted((shard_dir / "segments").glob("*/segment.json")):
        vectors = (json_or_empty(path).get("config") or {}).get("vector_data") or {}
        kinds.extend(str((v.get("index") or {}).get("type", "plain")) for v in vectors.values())
    return kinds


def record_build(generation_dir: Path, points: int, calibration: dict[str, Any] | None = None) -> None:
    """``calibration`` None: the build changed nothing, the last one's measurement still holds; what this build had no
    time to measure is kept from the last one (``calibrate.carry_over``)."""
    from services.store.calibrate import carry_over

    previous = index_record(generation_dir)
    if calibration is None:
        calibration = previous.get("calibration")
    elif previous.get("calibration"):
        calibration = carry_over(calibration, previous["calibration"], int(previous.get("points") or 0))
    record = {"points": points} | ({"calibration": calibration} if calibration else {})
    write_atomic(generation_dir / INDEX_RECORD, json.dumps(record))


@contextlib.contextmanager
def build_lock(generation_dir: Path) -> Iterator[bool]:
    """True while this process holds the generation's build lock; False at once if another build runs."""
    fd = os.open(generation_dir / _BUILD_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def clear_leftovers(generation_dir: Path) -> None:
    """Remove what an interrupted build left (only under the build lock; a cut swap's ``shard.next`` is left to
    ``recover_swap``, which runs under the lease)."""
    for name in (BUILD, NEXT, OLD, PARTS):
        if name == NEXT and not (generation_dir / SHARD).exists():
            continue  # a swap cut short: ``recover_swap`` finishes it
        shutil.rmtree(generation_dir / name, ignore_errors=True)


def copy_for_build(generation_dir: Path, noted: Noted | None = None) -> Noted:
    """Step 1's copy of the shard to ``BUILD`` (``copy_shard``)."""
    if noted is None:
        clear_leftovers(generation_dir)
    return copy_shard(generation_dir, generation_dir / BUILD, noted)


def copy_shard(generation_dir: Path, dest: Path, noted: Noted | None = None) -> Noted:
    """The shard copied to ``dest`` in two calls (an index build's, a snapshot's): ``noted`` None, off the lease
    while others may write (on a file system that ``tracks_mapped_writes``; elsewhere nothing: all is copied under
    the lease); else, under it with the shard flushed or closed, the files changed since (``copy_tree_changed``).
    Neither loads the shard, so a process answering from it keeps it open."""
    if noted is None and (not (generation_dir / SHARD).is_dir() or not tracks_mapped_writes(generation_dir)):
        return {}
    return copy_tree_changed(generation_dir / SHARD, dest, noted, settle=noted is None)


class BuildChild:
    """Step 2's process: ``optimize()`` on the copy, then (on request) the journal's writes replayed onto it, then
    closed. One line per answer on its stdout: ``built 0|1 POINTS CALIBRATION-JSON``, ``replayed RECORDS POINTS``,
    ``closed``; ``broken REASON`` when the journal cannot be replayed."""

    def __init__(self, shard_copy: Path, spec_json: str, indexing_threshold_kb: int, levers_json: str,
                 journal: Path, recall_target: float = 0.0, budget_mb: int | None = None) -> None:
        """``levers_json``: the generation's ``EdgeLevers`` (the reload must repeat the vectors' memory placement);
        ``recall_target`` > 0: the search ef is calibrated on the built graph (``build_child.calibrate_built``);
        ``budget_mb``: the levers the user did not set are chosen again for the copy's points (``budget_levers``)."""
        path = os.pathsep.join(filter(None, [str(_PROJECT_ROOT), os.environ.get("PYTHONPATH")]))
        self.name = shard_copy.parent.name
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - read on failure, closed in ``stop``
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(shard_copy), spec_json, str(indexing_threshold_kb), levers_json,
             str(journal), str(os.getpid()), str(recall_target), str(budget_mb or 0)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True,
            env={**os.environ, "PYTHONPATH": path},
        )

    def built(self) -> tuple[bool, int, dict[str, Any] | None]:
        """Wait for the build (at most ``_BUILD_TIMEOUT``): whether it changed anything, the points it was given,
        and its calibration."""
        words = self._answer("built", _BUILD_TIMEOUT)
        calibration = json.loads(" ".join(words[2:])) if len(words) > 2 else None  # its text has spaces
        return words[:1] == ["1"], int(words[1]), calibration

    def replay(self) -> tuple[int, int]:
        """Replay the journal's new writes onto the copy: (writes replayed, the copy's points after)."""
        records, points = self._ask("replay", "replayed")
        return int(records), int(points)

    def close(self) -> None:
        """Flush and close the copy (before the swap). Its process's exit is not waited for here, under the lease
        (0.16 s of a 0.72 s hold at 100k): ``stop`` ends it after."""
        self._ask("close", "closed")

    def stop(self) -> None:
        """End the process whatever it is doing (the copy is then dropped; after ``close`` it has only to exit)."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        for stream in (self._proc.stdin, self._proc.stdout):
            if stream is not None:
                stream.close()
        self._stderr.close()

    def _ask(self, command: str, answer: str) -> list[str]:
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(command + "\n")
            self._proc.stdin.flush()
        except BrokenPipeError:
            pass  # it died: ``_answer`` reports how
        return self._answer(answer, _STEP_TIMEOUT)

    def _answer(self, expected: str, timeout: float) -> list[str]:
        assert self._proc.stdout is not None
        ready, _, _ = select.select([self._proc.stdout], [], [], timeout)
        if not ready:
            self.stop()
            raise StoreUnavailable(f"building the HNSW index of {self.name} took over {timeout:.0f} s ({expected}); "
                                   "run `dpr optimize` again on a quieter machine")
        words = self._proc.stdout.readline().split()
        if words[:1] == ["broken"]:
            from services.store.edge import journal as edge_journal

            raise edge_journal.JournalBroken(" ".join(words[1:]))
        if words[:1] != [expected]:
            self._proc.wait(timeout=_STEP_TIMEOUT)
            self._stderr.seek(0)
            tail = self._stderr.read().decode("utf-8", "replace").strip()[-500:]
            raise StoreUnavailable(f"building the HNSW index of {self.name} failed (exit {self._proc.returncode}): "
                                   f"{tail}; run `dpr optimize` again, or check free disk space")
        return words[1:]


def swap_in(generation_dir: Path) -> None:
    """Replace ``shard`` with the built copy (the shard must be closed; only under the lease)."""
    os.replace(generation_dir / BUILD, generation_dir / NEXT)
    os.replace(generation_dir / SHARD, generation_dir / OLD)
    os.replace(generation_dir / NEXT, generation_dir / SHARD)




def optimize(engine: EdgeEngine, generation: str) -> bool:
    """Steps 1-4 above for ``engine``'s ``generation`` (``EdgeEngine.optimize``): True if the built copy was swapped
    in; False if nothing changed, another process is building, or the journal could not bring the copy up to date
    (the copy is then dropped and nothing is lost)."""
    from services.store.edge import journal as edge_journal  # builders only: `dpr query` never loads it
    from services.store.edge.config import levers_of

    gen_dir = engine.generations_dir / generation
    lease = engine.lease
    changed = swapped = False
    calibration: dict[str, Any] | None = None
    held = {"copy_s": 0.0, "swap_s": 0.0, "unleased_copy_s": 0.0}  # the lease's two holds and the copy before
    # them, in the log line (bench_search reads them)
    replayed = last = 0  # writes replayed off the lease, and in the last round under it
    with build_lock(gen_dir) as mine:
        if not mine:
            log.info("another process is building this generation's index", extra={"generation": generation})
            return False
        try:
            with contextlib.ExitStack() as stack:
                started = time.perf_counter()
                noted = copy_for_build(gen_dir)
                held["unleased_copy_s"] = time.perf_counter() - started
                with engine.session():
                    started = time.perf_counter()
                    lease.claim(generation)  # the shard is not loaded; one open elsewhere was flushed, and stays
                    recover_swap(gen_dir)  # open there: nothing writes it without loading it (``lease.py``)
                    lease.flush(generation)
                    copy_for_build(gen_dir, noted)
                    journal = stack.enter_context(edge_journal.opened(gen_dir))  # from here every write is journaled
                    spec = engine.read_spec(generation)
                    held["copy_s"] = time.perf_counter() - started
                kb = threshold_kb(engine.index_threshold, spec.dim)
                child = BuildChild(gen_dir / BUILD, json.dumps(spec.to_json()), kb, json.dumps(levers_of(gen_dir)),
                                   journal, engine.recall_target, engine.memory_budget_mb)
                stack.callback(child.stop)
                changed, points, calibration = child.built()
                replayed = _catch_up(child) if changed else 0
                with engine.session():
                    lease.claim(generation)  # no writer from here to the swap
                    started = time.perf_counter()
                    if changed:
                        last = _up_to_date(engine, generation, child)
                        child.close()
                        lease.forget(generation)
                        swap_in(gen_dir)
                        swapped = True
                    record_build(gen_dir, points, (calibration or {}) if swapped else None)
                    held["swap_s"] = time.perf_counter() - started
        except edge_journal.JournalBroken as e:
            log.warning("the index build's copy could not be brought up to date (%s); dropped, nothing lost; the "
                        "next job end or `dpr optimize` builds again", e, extra={"generation": generation})
        finally:
            for leftover in (OLD, BUILD, PARTS):
                shutil.rmtree(gen_dir / leftover, ignore_errors=True)
    log.info("edge index build", extra={"generation": generation, "changed": changed, "swapped": swapped,
                                        "replayed": replayed, "replayed_last": last, **held})
    return swapped


def _catch_up(child: BuildChild) -> int:
    """Replay the writes that arrived during the build without the lease, in rounds while the writers keep
    writing, so that the last round (under the lease) has little left. Returns the writes replayed."""
    total = 0
    for _ in range(_CATCH_UP_ROUNDS):
        records, _points = child.replay()
        total += records
        if records <= _CATCH_UP_ENOUGH:
            break
    return total


def _up_to_date(engine: EdgeEngine, generation: str, child: BuildChild) -> int:
    """Under the lease: replay the last writes onto the copy and, where this process has the shard open, check the
    copy holds as many points: a count that differs (a write the journal missed) raises ``JournalBroken`` and the
    copy is dropped. A shard open elsewhere is not loaded just to count (7-8 s at 1M points, under the lease): the
    journal is trusted. Returns the writes replayed in this round."""
    from services.store.edge import journal as edge_journal

    records, copied = child.replay()
    opened = engine.lease.opened(generation)
    held = opened.count(CountRequest(exact=True)) if opened is not None else copied
    if copied != held:
        raise edge_journal.JournalBroken(f"the copy holds {copied} points after the journal's writes, the shard "
                                         f"{held}")
    return records
