"""The sources' tick on the workers (queue ``ingest``): ``dpr.sources.tick`` runs the due syncs
(``services.sources.schedule.sync_due``) in the worker that takes it, each sync's ingest job run in this process
(``LocalExecutor``: a task that waited on other workers' tasks could wait on itself). Sent by the beat every
``DPR_SOURCES__TICK_SECONDS`` (``workers.beat``); acknowledged at once, since a lost tick is made up by the next,
and a sync cut short (a time limit, a killed worker) is a failed sync that deleted nothing."""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task

from services.core.settings import Settings
from services.ingest.executor import LocalExecutor
from services.sources.registry import Registry
from services.sources.schedule import sync_due
from workers.tasks import worker_runtime

TICK_TASK = "dpr.sources.tick"


@shared_task(name=TICK_TASK, bind=True, acks_late=False, ignore_result=True)
def sources_tick_task(self: Task) -> dict[str, Any]:
    settings: Settings = self.app.settings  # type: ignore[attr-defined]
    runtime = worker_runtime(settings)
    executor = LocalExecutor(runtime.jobs, lambda collection: runtime.for_collection(collection).pipeline)
    return sync_due(runtime, Registry(settings.data_dir), executor)
