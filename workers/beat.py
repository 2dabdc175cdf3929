"""The beat: one process that sends ``dpr.reembed.check`` every ``reembed.schedule_seconds`` (off by default).

Only one beat may run (two would double every schedule): ``run_beat`` takes a Redis lock with a TTL that a
thread refreshes; a second ``dpr beat`` exits at once naming the holder, and a beat that loses its lock (Redis
gone for longer than the TTL) stops itself. The re-embed itself is guarded by its own lock as well, so even a
duplicated check cannot start two re-embeds.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

from services.core.errors import ConfigError
from services.core.locks import RedisLease, redis_client
from services.core.settings import Settings
from services.lifecycle.state import ReembedBusy
from services.sources.registry import Registry
from workers.app import INGEST_QUEUE
from workers.reembed_dispatch import CHECK_TASK, REEMBED_QUEUE
from workers.source_tasks import TICK_TASK

log = logging.getLogger(__name__)

BEAT_LOCK = "dpr:lock:beat"


def beat_schedule(settings: Settings) -> dict[str, Any]:
    """The Celery beat schedule for these settings (empty when nothing is scheduled): the re-embed check when
    ``reembed.schedule_seconds`` is set; the sources' tick when the data dir has a source with an interval
    (``dpr sources add ... --every``) and ``sources.tick_seconds`` is not 0."""
    schedule: dict[str, Any] = {}
    seconds = settings.reembed.schedule_seconds
    if seconds is not None:
        schedule["dpr-reembed-check"] = {
            "task": CHECK_TASK,
            "schedule": float(seconds),
            "kwargs": {"collection": settings.collection},
            "options": {"queue": REEMBED_QUEUE, "expires": float(seconds)},
        }
    tick = settings.sources.tick_seconds
    if tick and any(spec.every_s for spec in Registry(settings.data_dir).all()):
        schedule["dpr-sources-tick"] = {
            "task": TICK_TASK,
            "schedule": float(tick),
            "options": {"queue": INGEST_QUEUE, "expires": float(tick)},
        }
    return schedule


def run_beat(settings: Settings, loglevel: str = "info") -> None:
    """Run the one beat in the foreground (blocks)."""
    if not settings.broker_url:
        raise ConfigError("the beat needs a broker; set DPR_BROKER_URL=redis://host:6379/0")
    if not beat_schedule(settings):
        raise ConfigError("no schedule configured; set DPR_REEMBED__SCHEDULE_SECONDS (e.g. 3600), or add a source "
                          "with an interval (`dpr sources add NAME URI --every 15m`)")
    ttl = max(30.0, 3 * float(settings.reembed.schedule_seconds or 10))
    lease = RedisLease(redis_client(settings.broker_url), BEAT_LOCK, ttl, name="beat")
    if not lease.acquire():
        raise ReembedBusy(f"another beat is running ({lease.holder()}); only one beat may run")
    stop = threading.Event()

    def keep() -> None:
        while not stop.wait(lease.ttl_ms / 3000):
            try:
                lease.refresh()
            except Exception:
                log.exception("the beat lost its lock; stopping")
                os.kill(os.getpid(), signal.SIGTERM)
                return

    threading.Thread(target=keep, name="beat-lock", daemon=True).start()
    from workers.app import create_app

    app = create_app(settings)
    app.conf.beat_schedule = beat_schedule(settings)
    schedule_file = settings.data_dir / "celerybeat-schedule"
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    try:
        app.Beat(schedule=str(schedule_file), loglevel=loglevel).run()
    finally:
        stop.set()
        lease.release()
