"""When each source syncs, and the one loop that runs the due ones, wherever schedules already live:

- with workers: the beat sends ``dpr.sources.tick`` every ``DPR_SOURCES__TICK_SECONDS`` (``workers.source_tasks``)
  and the worker that takes it runs the due syncs;
- in the embedded default: ``dpr serve`` runs a ``SourceScheduler`` thread beside the API, syncing through the
  API's own runtime and ingest executor (one ingest at a time in the process, uploads included).

Never a thread of a CLI command. A source is due when it has an interval and its last sync finished at least that
long ago (or it never synced); one whose sync is running is not due (its lock would refuse the second anyway). A
change in a source is searchable within one interval plus the tick plus the sync's own time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from services.core.errors import DprError
from services.sources.registry import Registry
from services.sources.state import SyncRunning, is_running, load_last

if TYPE_CHECKING:
    from services.ingest.executor import Executor
    from services.runtime import Runtime

log = logging.getLogger(__name__)

_DETAIL = ("read", "gone", "failures")  # long lists of the last report: shown by `dpr sources sync`, not in status


def epoch(iso: Any) -> float | None:
    """An ISO time as epoch seconds; None when it is absent or not a time."""
    try:
        return datetime.fromisoformat(str(iso)).timestamp()
    except ValueError:
        return None


def next_run(every_s: float | None, last: dict[str, Any], now: float | None = None) -> float | None:
    """When the source is next due (epoch seconds): its last sync's end plus its interval; now if it never
    synced; None without an interval."""
    if every_s is None:
        return None
    finished = epoch(last.get("finished")) if last else None
    return (time.time() if now is None else now) if finished is None else finished + every_s


def source_status(registry: Registry, name: str) -> dict[str, Any]:
    """One source's spec (no secret: credentials are variable names), its last sync's record (outcome, counts,
    error), whether a sync runs now, and its next run (ISO 8601, or None)."""
    spec = registry.get(name)
    last = load_last(registry.folder(name))
    due = next_run(spec.every_s, last)
    return spec.to_json() | {
        "last": {k: v for k, v in last.items() if k not in _DETAIL},
        "running": is_running(registry.folder(name)),
        "next_run": datetime.fromtimestamp(due).astimezone().isoformat(timespec="seconds") if due else None,
    }


def sources_status(data_dir: Path, collection: str | None = None, default: str = "") -> list[dict[str, Any]]:
    """Every source's ``source_status``; with ``collection``, those that sync into it (``dpr status``), a source
    that names none syncing into ``default`` (DPR_COLLECTION)."""
    registry = Registry(data_dir)
    specs = registry.all()
    if collection is not None:
        specs = [s for s in specs if (s.collection or default) == collection]
    return [source_status(registry, spec.name) for spec in specs]


def due_sources(registry: Registry, now: float | None = None) -> list[str]:
    """The names of the sources whose next run has come and that no sync holds."""
    now = time.time() if now is None else now
    out = []
    for spec in registry.all():
        due = next_run(spec.every_s, load_last(registry.folder(spec.name)), now)
        if due is not None and due <= now and not is_running(registry.folder(spec.name)):
            out.append(spec.name)
    return out


def sync_due(runtime: Runtime, registry: Registry, executor: Executor, now: float | None = None) -> dict[str, str]:
    """Sync every due source, one after the other; name -> outcome (``ok``, ``failed``, ``busy``). A failure is
    recorded with the source (``last.json``) and logged; it never stops the others."""
    from services.sources.sync import sync_source

    outcomes: dict[str, str] = {}
    for name in due_sources(registry, now):
        try:
            outcomes[name] = sync_source(runtime, registry, name, executor).outcome
        except SyncRunning:
            outcomes[name] = "busy"
        except (DprError, OSError) as e:
            outcomes[name] = "failed"
            log.warning("scheduled sync failed", extra={"source": name, "error": str(e)})
    return outcomes


class SourceScheduler:
    """A thread that runs ``sync_due`` every ``tick_s`` seconds until closed (``dpr serve``'s, embedded default).
    ``executor_for``: the executor the syncs hand their jobs to (the API's)."""

    def __init__(self, runtime: Runtime, executor_for: Callable[[], Executor], tick_s: float) -> None:
        self.runtime, self.executor_for, self.tick_s = runtime, executor_for, tick_s
        self.registry = Registry(runtime.settings.data_dir)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="dpr-sources", daemon=True)

    def start(self) -> SourceScheduler:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=60)

    def _loop(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                outcomes = sync_due(self.runtime, self.registry, self.executor_for())
                if outcomes:
                    log.info("scheduled syncs", extra={"outcomes": outcomes})
            except Exception:  # the server goes on; the next tick tries again
                log.exception("the sources' tick failed")
