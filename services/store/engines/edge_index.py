"""HNSW for an embedded generation, built without holding its lease while the graph is built.

qdrant-edge builds graphs only in ``EdgeShard.optimize()``, which blocks its caller and holds the GIL (measured:
another thread of the same process ran 2 queries in the 12.7 s a 20k-point build took). So the build runs on a
copy, in a child process, and only the two short ends hold the generation's lease:

1. under the lease: flush, note the write token (the WAL files' stat and the segments' versions), copy the shard
   directory to ``shard.build``;
2. no lease: a child process (``nice`` 10) loads the copy with the indexing threshold and runs ``optimize()``;
3. under the lease: if the token is unchanged (nobody wrote meanwhile), close the shard and swap the directories
   (``shard.build`` -> ``shard.next`` -> ``shard``, the old one renamed ``shard.old`` and removed after). If
   somebody wrote, the copy is dropped and nothing changes (the next job end or ``dpr optimize`` builds again).

A crash between the renames leaves ``shard.next`` and no ``shard``: ``recover_swap`` finishes it before the shard is
next loaded. One build per generation at a time (``.index.lock``); ``index.json`` records the points the last build
saw, so ``needs_index`` asks for a build only when ``threshold`` new points have arrived since.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Hashable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from services.core.errors import StoreUnavailable
from services.core.fsutil import write_atomic

if TYPE_CHECKING:
    from services.store.engines.edge import EdgeEngine

log = logging.getLogger(__name__)

SHARD, BUILD, NEXT, OLD = "shard", "shard.build", "shard.next", "shard.old"
INDEX_RECORD = "index.json"
_BUILD_LOCK = ".index.lock"
_BUILD_TIMEOUT = 6 * 3600  # seconds; a build that takes longer is killed and reported
_CHILD = "from services.store.engines.edge_index import child_main; child_main()"
_PROJECT_ROOT = Path(__file__).resolve().parents[3]


def threshold_kb(points: int, dim: int) -> int:
    """Qdrant's indexing threshold is in KB of vectors per segment: ``points`` float32 vectors of ``dim``."""
    return max(1, points * dim * 4 // 1024)


def write_token(shard_dir: Path) -> Hashable:
    """Changes with every write that reached the disk (call it after a flush): WAL files and segment versions."""
    wal = sorted((e.name, e.stat().st_size, e.stat().st_mtime_ns) for e in os.scandir(shard_dir / "wal"))
    versions = sorted(str(_segment_config(p).get("version")) for p in (shard_dir / "segments").glob("*/segment.json"))
    return (tuple(wal), tuple(versions))


def segment_kinds(shard_dir: Path) -> list[str]:
    """The dense index type of each segment: ``hnsw`` or ``plain``."""
    kinds: list[str] = []
    for path in sorted((shard_dir / "segments").glob("*/segment.json")):
        vectors = (_segment_config(path).get("config") or {}).get("vector_data") or {}
        kinds.extend(str((v.get("index") or {}).get("type", "plain")) for v in vectors.values())
    return kinds


def _segment_config(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return {}


def indexed_points(generation_dir: Path) -> int:
    """Points the last build saw (0: never built)."""
    try:
        return int(json.loads((generation_dir / INDEX_RECORD).read_text(encoding="utf-8"))["points"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def record_build(generation_dir: Path, points: int) -> None:
    write_atomic(generation_dir / INDEX_RECORD, json.dumps({"points": points}))


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
    """Remove what an interrupted build left (only under the build lock and the lease)."""
    for name in (BUILD, NEXT, OLD):
        if name == NEXT and not (generation_dir / SHARD).exists():
            continue  # a swap cut short: ``recover_swap`` finishes it
        shutil.rmtree(generation_dir / name, ignore_errors=True)


def recover_swap(generation_dir: Path) -> None:
    """Finish a swap a crash cut short between its renames (``shard.next`` present, ``shard`` gone)."""
    if not (generation_dir / SHARD).exists() and (generation_dir / NEXT).is_dir():
        os.replace(generation_dir / NEXT, generation_dir / SHARD)
        log.warning("finished an interrupted index swap", extra={"generation": generation_dir.name})


def copy_for_build(shard: Any, generation_dir: Path) -> tuple[Hashable, int]:
    """Step 1, under the lease: flush ``shard`` (the generation's, open), clear an interrupted build's leftovers,
    note the write token and copy the shard to ``BUILD``. Returns the token and the points copied."""
    shard.flush()
    clear_leftovers(generation_dir)
    token = write_token(generation_dir / SHARD)
    shutil.copytree(generation_dir / SHARD, generation_dir / BUILD)
    return token, shard.info().points_count


def unchanged_since(shard: Any | None, generation_dir: Path, token: Hashable) -> bool:
    """Step 3, under the lease: nobody wrote the generation since ``token`` (``shard``: this process's open one,
    flushed first, or None)."""
    if shard is not None:
        shard.flush()
    if write_token(generation_dir / SHARD) == token:
        return True
    log.info("a write arrived during the index build; keeping the shard as it is",
             extra={"generation": generation_dir.name})
    return False


def build(shard_copy: Path, spec_json: str, indexing_threshold_kb: int, levers_json: str = "{}") -> bool:
    """Run ``optimize()`` on ``shard_copy`` in a child process (no model, no lease); True if it changed anything.
    ``levers_json``: the generation's ``EdgeLevers`` (the reload must repeat the vectors' memory placement)."""
    path = os.pathsep.join(filter(None, [str(_PROJECT_ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, str(shard_copy), spec_json, str(indexing_threshold_kb), levers_json],
            capture_output=True, text=True, timeout=_BUILD_TIMEOUT, check=False, env=env,
        )
    except subprocess.TimeoutExpired as e:
        raise StoreUnavailable(f"building the HNSW index of {shard_copy.parent.name} took over {_BUILD_TIMEOUT} s; "
                               "run `dpr optimize` again on a quieter machine") from e
    if done.returncode != 0:
        raise StoreUnavailable(
            f"building the HNSW index of {shard_copy.parent.name} failed (exit {done.returncode}): "
            f"{done.stderr.strip()[-500:]}; run `dpr optimize` again, or check free disk space"
        )
    return done.stdout.strip().splitlines()[-1:] == ["1"]


def child_main() -> None:
    """The build process: ``argv`` = shard copy, spec JSON, indexing threshold (KB)[, levers JSON]. Prints 1 if it
    changed."""
    from qdrant_edge import EdgeShard

    from services.store.engines.edge_config import EdgeLevers, edge_config
    from services.store.points import CollectionSpec

    os.nice(10)  # the serving process's queries come first
    path, spec, kb = sys.argv[1], CollectionSpec.from_json(json.loads(sys.argv[2])), int(sys.argv[3])
    levers = EdgeLevers.from_json(json.loads(sys.argv[4]) if len(sys.argv) > 4 else None)
    shard = EdgeShard.load(path, edge_config(spec, indexing_threshold_kb=kb, levers=levers))
    changed = shard.optimize()
    shard.flush()
    shard.close()
    print(int(changed))


def swap_in(generation_dir: Path) -> None:
    """Replace ``shard`` with the built copy (the shard must be closed; only under the lease)."""
    os.replace(generation_dir / BUILD, generation_dir / NEXT)
    os.replace(generation_dir / SHARD, generation_dir / OLD)
    os.replace(generation_dir / NEXT, generation_dir / SHARD)


def optimize(engine: EdgeEngine, generation: str) -> bool:
    """Steps 1-3 above for ``engine``'s ``generation`` (``EdgeEngine.optimize``): True if the built copy was swapped
    in; False if nothing changed, another process is building, or a write arrived during the build."""
    from services.store.engines.edge_config import levers_of

    gen_dir = engine._generations_dir / generation  # noqa: SLF001 - the engine's own layout
    lease = engine._lease  # noqa: SLF001 - the engine's own lease: the build's two ends hold it
    changed = swapped = False
    with build_lock(gen_dir) as mine:
        if not mine:
            log.info("another process is building this generation's index", extra={"generation": generation})
            return False
        try:
            with engine.session():
                token, points = copy_for_build(engine._shard(generation), gen_dir)  # noqa: SLF001 - under its lease
                spec = engine.read_spec(generation)
            kb = threshold_kb(engine.index_threshold, spec.dim)
            changed = build(gen_dir / BUILD, json.dumps(spec.to_json()), kb, json.dumps(levers_of(gen_dir)))
            with engine.session():
                lease.claim(generation)  # no writer between the token check and the swap
                if changed and unchanged_since(lease.opened(generation), gen_dir, token):
                    lease.forget(generation)
                    swap_in(gen_dir)
                    swapped = True
                if not changed or swapped:
                    record_build(gen_dir, points)
        finally:
            for leftover in (OLD, BUILD):
                shutil.rmtree(gen_dir / leftover, ignore_errors=True)
    log.info("edge index build", extra={"generation": generation, "changed": changed, "swapped": swapped})
    return swapped
