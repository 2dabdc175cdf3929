"""The Celery app, built from the one Settings object at the composition root (``dpr worker``, the submitter).

``create_app(settings)`` is the only constructor. ``celery -A workers.app worker`` also works: the module's ``app``
attribute is built on first access from the environment (``Settings()``), never at import.

Delivery guarantees (tests/integration/test_workers.py): JSON only, ``acks_late`` + ``reject_on_worker_lost``
+ prefetch 1, so a task whose worker dies, or that the hard time limit kills, is delivered again (after
``visibility_timeout`` when the whole worker died). Every task must therefore be idempotent, and the visibility
timeout must exceed the longest task, or a slow task would be delivered a second time while still running.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from services.core.errors import ConfigError
from services.core.settings import Settings
from services.core.threads import resolve_threads

INGEST_QUEUE = "ingest"
TASK_ROUTES: dict[str, dict[str, str]] = {  # task name -> queue
    "dpr.ingest_batch": {"queue": INGEST_QUEUE},
    "dpr.reembed.*": {"queue": "reembed"},
}
# Modules whose shared tasks every app registers.
TASK_MODULES = ("workers.tasks", "workers.reembed_tasks", "workers.source_tasks")
# Seconds between the soft time limit (raised inside the task, which then reports the batch) and the hard one.
SOFT_LIMIT_MARGIN = 5
# Seconds the pool waits for a new pool process to come up before killing it (Celery's default is 4 s). Each pool
# process loads the models right after the fork, before it takes a task (workers.tasks), so no task's time limit
# pays for the load; this must cover the slowest load (a cold disk, a busy machine).
POOL_START_TIMEOUT = 600.0


class DprCelery(Celery):
    """A Celery app that carries the Settings it was built from (tasks read them from ``self.app``)."""

    settings: Settings


def check_limits(settings: Settings) -> None:
    c = settings.celery
    if c.task_time_limit >= c.visibility_timeout:
        raise ConfigError(
            f"celery.task_time_limit ({c.task_time_limit} s) must be below celery.visibility_timeout "
            f"({c.visibility_timeout} s), otherwise a task still running is delivered again; raise "
            "DPR_CELERY__VISIBILITY_TIMEOUT or lower DPR_CELERY__TASK_TIME_LIMIT"
        )


def celery_config(settings: Settings) -> dict[str, Any]:
    """The Celery configuration for these settings (pure; unit-tested)."""
    check_limits(settings)
    c = settings.celery
    transport: dict[str, Any] = {"visibility_timeout": c.visibility_timeout}
    if c.unacked_restore_interval is not None:
        transport["unacked_restore_interval"] = c.unacked_restore_interval
    if c.unacked_restore_throttle is not None:
        transport["unacked_restore_throttle"] = c.unacked_restore_throttle
    return {
        "broker_url": settings.broker_url,
        "broker_transport_options": transport,
        "broker_connection_retry_on_startup": True,
        # A broker that answers but refuses a write (MISCONF: its disk is full; OOM) fails an ack with a Redis
        # ResponseError, a "channel error": reconnect and go on instead of the worker shutting down; the
        # message stays unacked and is delivered again once the broker takes writes.
        "broker_channel_error_retry": True,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_backend": None,  # job state lives in Redis through services.jobs
        "task_ignore_result": True,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_acks_on_failure": True,  # the task records a failed batch itself
        # A task killed by the hard time limit never got to record its batch: requeue it rather than lose it (the
        # job counts deliveries and fails a batch that keeps killing its worker, services.ingest.batches.run_batch).
        "task_acks_on_timeout": False,
        "worker_prefetch_multiplier": 1,
        "worker_proc_alive_timeout": POOL_START_TIMEOUT,
        "task_time_limit": c.task_time_limit,
        "task_soft_time_limit": max(1, c.task_time_limit - SOFT_LIMIT_MARGIN),
        "task_default_queue": INGEST_QUEUE,
        "task_routes": TASK_ROUTES,
        "worker_hijack_root_logger": False,
        "worker_send_task_events": False,
        "enable_utc": True,
    }


def worker_settings(settings: Settings, concurrency: int, cores: int | None = None) -> Settings:
    """The settings a worker runs with: the usable cores split between its ``concurrency`` pool processes
    (``services.core.threads``: an explicit ``DPR_ENCODER__THREADS`` wins)."""
    return resolve_threads(settings, processes=concurrency, cores=cores)


def create_app(settings: Settings) -> DprCelery:
    """The Celery app for ``settings``; registers the tasks of ``workers.tasks``."""
    if not settings.broker_url:
        raise ConfigError("no broker configured; set DPR_BROKER_URL=redis://host:6379/0")
    app = DprCelery("dpr", set_as_current=True)
    app.settings = settings
    app.conf.update(celery_config(settings))
    register_task_modules()
    return app


def register_task_modules() -> None:
    """Import the task modules: their ``shared_task``s attach to every app, this one included."""
    import importlib

    for module in TASK_MODULES:
        importlib.import_module(module)


_default: DprCelery | None = None


def __getattr__(name: str) -> Any:
    """``workers.app.app`` for ``celery -A workers.app``: built from the environment on first access."""
    global _default
    if name in ("app", "celery"):
        if _default is None:
            _default = create_app(Settings())
        return _default
    raise AttributeError(name)
