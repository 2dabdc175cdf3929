"""``ShardLease``: one process's exclusive, shared-by-threads ownership of the generations of an embedded collection.

qdrant-edge lets one process open a shard directory (a second ``load`` fails on the WAL lock). So every call
of the edge engine goes through a lease, and the lease is per **generation**: an exclusive ``fcntl.flock`` on
``A/locks/G.lock``, taken the first time a call touches generation ``G`` (waiting up to
``edge.lock_timeout`` seconds, then ``StoreUnavailable``), its shard loaded lazily while it is held, and kept
open for ``edge.idle_release`` seconds after the last call so that a busy process does not reopen per call (for
``WAITER_GRACE`` only when another process is waiting for it). Its idle timer then flushes, closes and unlocks,
and the next process gets its turn (``lease_lifetime.py``: when a lease lets go, idle, at exit or around a fork).
So ``dpr serve`` reading the active generation and workers writing the next one (a re-embed) never wait for each
other, and neither reloads its shard because the other had a turn.

Having the shard open is a second lock, ``A/locks/G.open``, taken before the load and given up with the close. A
process that hands ``G.lock`` on keeps its shard open (flushed if it wrote) and answers reads from it without
``G.lock`` until a process that wants to load the shard waits for ``G.open`` (then it closes at once, under that
process's ``G.lock``) or it is idle for ``idle_release``: holders that never load it (an index build's copy and
swap, a re-embed's read copy) cost `dpr serve` no reload. Nothing can change the shard's points meanwhile (a
writer must load it), and a swapped-in index build holds the same points: reads from the old shard stay right
until the next call sees the swap and loads the new one (``EdgeShard.load`` and ``close`` hold the GIL: a load
in a thread beside the questions would stall them as much, so it runs on the call that finds the swap).

A process that keeps a generation busy for longer than its fair share yields it at the end of the current call
when another process is waiting (waiters touch ``G.lock.wait``). Making, dropping and restoring generations
(and choosing the first one) hold the directory's lock ``A/.lock`` for their block (``structure``), then each
generation they touch. Locks are taken in the order calls touch generations. A process waiting for one hands on
the generations it only keeps idle from an earlier run of calls when another process wants them, so two
processes wanting each other's generation do not deadlock; two runs of calls each using one and waiting for the
other are settled by ``lock_timeout`` (a ``StoreUnavailable``, which callers retry). The lock files themselves:
``services/store/edge/generation_lock.py``.

In one process every engine of a directory shares one lease (``lease_for``), and a re-entrant mutex serialises
threads.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from qdrant_edge import EdgeShard

from services.core.errors import StoreUnavailable
from services.store.edge.generation_lock import GenerationLock, busy, lock_file
from services.store.edge.lease_lifetime import IdleTimer, one_per_directory

if TYPE_CHECKING:
    from services.core.locks import FileLease

log = logging.getLogger(__name__)

_MIN_FAIR_SHARE = 0.25  # seconds a busy holder keeps the lease before yielding to a waiter
_HANDOFF_WINDOW = 2.0  # seconds a holder that yielded waits for the waiter to take the lock


class ShardLease:
    """This process's exclusive ownership of the generations of one collection directory it touches.
    Thread-safe; one per directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.lock_path = root / ".lock"  # the directory's: making, dropping and restoring generations
        self._mutex = threading.RLock()
        self._owner: int | None = None  # the thread inside ``held``
        self._held: dict[str, GenerationLock] = {}  # taken by ``claim``
        self._shards: dict[str, EdgeShard] = {}  # open: their ``G.open`` held; without ``G.lock``: handed on
        self._open: dict[str, GenerationLock] = {}
        self._inode: dict[str, int] = {}  # of the shard directory each was loaded from (an index swap replaces it)
        self._retired: list[EdgeShard] = []  # swapped out: closed when the lease is idle
        self._dirty: set[str] = set()
        self._depth = 0
        self._lock_timeout = 120.0  # the current run's (``held`` sets it); the settings' default until then
        self._structure: FileLease | None = None  # made on first use: a query never needs it
        self._structure_depth = 0
        self._idle = IdleTimer(self._mutex, self._idle_expired)
        self._yield_until: dict[str, float] = {}

    # -- public -------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def held(self, lock_timeout: float, idle_release: float) -> Iterator[ShardLease]:
        """A run of calls: this thread alone uses the lease, and every generation it claims stays locked until
        the run ends (then ``idle_release`` decides)."""
        with self._mutex:
            outer = self._depth == 0
            if outer:
                self._idle.cancel()
                self._lock_timeout = lock_timeout
                self._owner = threading.get_ident()
                for h in self._held.values():
                    h.touched = False
            self._depth += 1
            try:
                yield self
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self._owner = None
                    self._after_use(idle_release)

    def holds(self, generation: str) -> bool:
        """This process has ``generation`` locked."""
        return generation in self._held

    def in_use_here(self) -> bool:
        """This thread is inside ``held``."""
        return self._owner == threading.get_ident()

    @contextlib.contextmanager
    def structure(self) -> Iterator[None]:
        """The directory's lock for the block (making, dropping or restoring generations); only inside ``held``."""
        with self._mutex:
            if self._structure is None:
                from services.core.locks import FileLease  # writers only: `dpr query` never loads the locks

                self._structure = FileLease(self.lock_path, "edge-structure")
            if self._structure_depth == 0 and not self._structure.acquire(wait=self._lock_timeout):
                raise busy(self.root, self.lock_path, self._lock_timeout)
            self._structure_depth += 1
            try:
                yield
            finally:
                self._structure_depth -= 1
                if self._structure_depth == 0:
                    self._structure.release()

    def claim(self, generation: str, wait: bool = True, sole: bool = False) -> bool:
        """Lock ``generation`` for this process if it has not yet (no shard is loaded). Only inside ``held``.

        With ``wait=False`` one attempt only, and no sign of waiting left for the holder (which would otherwise
        hand the generation over and reload its shard afterwards): False when another process holds it (or, with
        ``sole``, has its shard open). ``sole``: no other process has its shard open either (``G.open``; they close
        it when they see this one waiting)."""
        held = self._held.get(generation)
        if held is not None:
            held.touched = True
        else:
            taken = self._take(generation, wait, self._hand_on_carried, self._yield_until.get(generation, 0.0))
            if taken is None:
                return False
            self._held[generation] = taken
            log.debug("edge lock acquired", extra={"generation": generation})
        if sole and generation not in self._open:
            opener = self._take(generation, wait, self._hand_on_carried, kind="open")
            if opener is None:
                return False
            self._open[generation] = opener
        return True

    def _take(self, generation: str, wait: bool, on_wait: Callable[[], None], yield_until: float = 0.0,
              kind: str = "lock") -> GenerationLock | None:
        """``GenerationLock.take`` waiting up to ``lock_timeout``; with ``wait`` False one attempt (None if busy)."""
        try:
            return GenerationLock.take(self.root, generation, self._lock_timeout if wait else 0.0,
                                       yield_until if wait else 0.0, on_wait=on_wait, kind=kind)
        except StoreUnavailable:
            if wait:
                raise
            return None

    def shard(self, generation: str, path: Path, prepare: Callable[[], None] | None = None,
              write: bool = False) -> EdgeShard:
        """The open shard of ``generation`` (claiming it and loading it if needed; ``prepare`` runs first, under
        the claim). One kept open after its claim was handed on answers reads without it (``write``: claimed
        again); one an index build swapped out is closed later and the new one loaded. Only inside ``held``."""
        shard = self._shards.get(generation)
        if shard is not None and (write or generation in self._held or self._swapped(generation, path)):
            self.claim(generation)  # first: the swap is checked under the claim (waiting may close the shard)
            shard = self._shards.get(generation)
            if shard is not None and self._swapped(generation, path):
                self._retired.append(self._shards.pop(generation))  # the same points: closed when idle, not now
                shard = None
        if shard is None:
            self.claim(generation, sole=True)
            if prepare is not None:
                prepare()
            started = time.monotonic()
            try:
                shard = EdgeShard.load(str(path))
            except Exception as e:  # the engine raises plain Exception
                raise StoreUnavailable(
                    f"cannot open the embedded shard {path}: {e}; another program may hold it outside the "
                    f"{lock_file(self.root, generation)} lock"
                ) from e
            log.debug("loaded shard", extra={"generation": generation, "ms": (time.monotonic() - started) * 1e3})
            self._adopt(generation, shard, path)
        return shard

    def opened(self, generation: str) -> EdgeShard | None:
        """The shard of ``generation`` if this process has it open (never loads it)."""
        return self._shards.get(generation)

    def adopt(self, generation: str, shard: EdgeShard, path: Path) -> None:
        """A shard this process just created at ``path`` (nobody else can have it open)."""
        self.claim(generation, sole=True)
        self._adopt(generation, shard, path)

    def _adopt(self, generation: str, shard: EdgeShard, path: Path) -> None:
        self._shards[generation], self._inode[generation] = shard, path.stat().st_ino

    def _swapped(self, generation: str, path: Path) -> bool:
        try:
            return path.stat().st_ino != self._inode[generation]
        except OSError:
            return True  # mid-swap: ``recover_swap`` finishes it under the claim

    def mark_dirty(self, generation: str) -> None:
        self._dirty.add(generation)

    def flush(self, generation: str) -> None:
        """Write back what this process wrote into the generation's shard, if it has it open and wrote."""
        shard = self._shards.get(generation)
        if shard is not None and generation in self._dirty:
            shard.flush()
            self._dirty.discard(generation)

    def forget(self, generation: str) -> None:
        """Flush and close one generation's shard (before replacing or deleting its directory); the claim stays."""
        shard = self._shards.pop(generation, None)
        try:
            if shard is not None:
                self._close_shard(generation, shard)
        finally:
            opener = self._open.pop(generation, None)
            if opener is not None:
                opener.release()

    def dropped(self, generation: str) -> None:
        """``generation``'s directory is gone: close its shard, unlock and remove its lock files."""
        self.forget(generation)
        held = self._held.get(generation)
        if held is not None:
            held.remove_files()
        self._unclaim(generation)

    def release(self) -> None:
        """Flush, close every shard and unlock, now."""
        with self._mutex:
            self._idle.cancel()
            self._let_go(wait=True)
            self._close_retired()

    def release_before_fork(self) -> None:
        """In the parent, just before ``os.fork()``: hand everything back so the child inherits nothing.

        Skipped when a call is in flight (the child then closes what it inherited, see ``reset_after_fork``).
        """
        if not self._mutex.acquire(timeout=5):
            return
        try:
            if self._depth == 0:
                self._let_go(wait=False)
                self._close_retired()
        finally:
            self._mutex.release()

    def reset_after_fork(self) -> list[EdgeShard]:
        """In a forked child: the parent's locks and shards are not ours. Returns the parent's shard objects, never
        to be used or dropped here (``lease_lifetime`` closes the inherited descriptors)."""
        inherited = [*self._shards.values(), *self._retired]
        self._mutex = threading.RLock()
        self._idle = IdleTimer(self._mutex, self._idle_expired)
        self._held, self._shards, self._dirty, self._depth = {}, {}, set(), 0
        self._open, self._inode, self._retired = {}, {}, []
        self._owner, self._structure, self._structure_depth = None, None, 0
        return inherited

    # -- internals ----------------------------------------------------------------------------------------
    def _hand_on_carried(self) -> None:
        """While this process waits for a generation: hand on what this run of calls has not used but an earlier
        one kept (idle) and another process wants, and close the shards kept open that a process waits to load;
        that process may be the one we wait for (it holds ours, wants theirs)."""
        self._hand_on([g for g, h in self._held.items() if not h.touched and h.wanted()], window=0.0)
        self._close_wanted()

    def _hand_on(self, generations: list[str], window: float = _HANDOFF_WINDOW) -> None:
        """Unlock ``generations`` for the processes waiting for them, and stay out of their way for ``window``. Their
        shards stay open (written back first) until a process waits to load one (``_close_wanted``)."""
        if generations:
            log.debug("handing edge locks to a waiting process", extra={"generations": generations})
            for g in generations:
                try:
                    self.flush(g)
                except Exception:
                    log.exception("flushing an edge shard failed", extra={"generation": g})
                    with contextlib.suppress(Exception):
                        self.forget(g)
                self._unclaim(g)
                self._yield_until[g] = time.monotonic() + window

    def _handed_on(self) -> list[str]:
        """The generations whose shard this process keeps open without their ``G.lock``."""
        return [g for g in self._shards if g not in self._held]

    def _close_wanted(self) -> None:
        for g in self._handed_on():
            if self._open[g].wanted():
                self._close_handed_on(g, wait=False)

    def _close_handed_on(self, generation: str, wait: bool) -> bool:
        """Close a shard kept open without its claim: under the claim of the process waiting to load it (it holds
        ``G.lock``), else under ``G.lock`` taken again (``wait``: for up to ``lock_timeout``; a closing shard
        writes its files, which a holder copying them must not see). False when that lock is busy."""
        opener = self._open[generation]

        def give_way() -> None:
            if opener.wanted():
                raise _Wanted

        if not opener.wanted():
            try:
                taken = self._take(generation, wait, give_way)
                if taken is None:
                    return False
                self._held[generation] = taken
            except _Wanted:
                pass  # the waiter holds ``G.lock``: closed under its claim
        self._release_locked([generation])
        return True

    def _let_go(self, wait: bool) -> None:
        """Unlock every generation and close every shard, those kept open after their claim was handed on too
        (``_close_handed_on``; with ``wait`` False one whose lock is busy stays open for the next look)."""
        self._release_locked(list(self._held))
        for generation in self._handed_on():
            self._close_handed_on(generation, wait)

    def _close_retired(self) -> None:
        while self._retired:
            try:
                self._retired.pop().close()
            except Exception:
                log.exception("closing a swapped-out edge shard failed")

    def _after_use(self, idle_release: float) -> None:
        last_used = self._idle.used(idle_release)
        self._close_wanted()
        if idle_release <= 0:
            self._let_go(wait=False)
        else:
            self._hand_on([g for g, h in self._held.items()
                           if last_used - h.acquired_at > max(idle_release, _MIN_FAIR_SHARE) and h.wanted()])
        if self._held or self._shards or self._retired:
            self._idle.start()

    def _idle_expired(self) -> bool:
        """The idle timer's look (``IdleTimer.due``): release once the lease has been idle for ``idle_release``; a
        generation another process waits for goes after ``WAITER_GRACE``. True while it keeps something (the timer
        then looks again). Called by the timer's thread with the mutex held."""
        with self._mutex:
            if self._depth > 0:
                return False  # in use: the end of that use re-arms the timer
            self._close_retired()
            due = self._idle.due()
            if due == "release":
                self._let_go(wait=False)  # its lock busy: the next look
            elif due == "hand on":
                self._hand_on([g for g, h in self._held.items() if h.wanted()])
            self._close_wanted()
            return bool(self._held or self._shards)

    def _close_shard(self, generation: str, shard: EdgeShard) -> None:
        try:
            if generation in self._dirty:
                shard.flush()
        finally:
            self._dirty.discard(generation)
            shard.close()

    def _release_locked(self, generations: list[str]) -> None:
        if len(generations) == len(self._held):
            self._idle.cancel()
        for generation in generations:
            try:
                self.forget(generation)
            except Exception:
                log.exception("closing an edge shard failed", extra={"generation": generation})
            finally:
                self._dirty.discard(generation)
                self._unclaim(generation)

    def _unclaim(self, generation: str) -> None:
        held = self._held.pop(generation, None)
        if held is not None:
            held.release()
            log.debug("edge lock released", extra={"generation": generation})


class _Wanted(Exception):
    """A process waits to load a shard this one kept open: it holds the lock this one was waiting for."""


def lease_for(root: Path) -> ShardLease:
    """The lease of the collection directory ``root`` in this process (every engine of it shares one)."""
    return one_per_directory(root, ShardLease)
