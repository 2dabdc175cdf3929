"""The one place an entry point picks the executor: Celery workers when ``DPR_BROKER_URL`` is set, else this
process (``services.ingest.executor.LocalExecutor`` over the runtime's pipelines). The CLI and the API both call it."""

from __future__ import annotations

from services.ingest.executor import BatchHook, Executor, LocalExecutor
from services.runtime import Runtime


def executor_for(runtime: Runtime, *, background: bool = False, on_batch: BatchHook | None = None) -> Executor:
    """``background``: in-process jobs run on a thread and ``submit`` returns at once (the API).
    ``on_batch`` sees each in-process batch's report (progress, metrics); workers report through the job store."""
    if runtime.settings.broker_url:
        from workers.executor import CeleryExecutor

        return CeleryExecutor(runtime.settings, jobs=runtime.jobs)
    return LocalExecutor(
        runtime.jobs, lambda collection: runtime.for_collection(collection).pipeline,
        background=background, on_batch=on_batch,
    )
