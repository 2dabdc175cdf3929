"""What one API process shares between requests: the settings, one ``Runtime`` (store calls serialised, models
loaded once in the background at start-up), the executor the settings choose, the metrics, the access gate (keys,
rate limits, audit log), and a small pool
for readiness probes. Routes reach it through ``api_state(request)``."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import Request

from entrypoints.api.metrics import ApiMetrics
from services.access import AccessGate
from services.core.settings import Settings
from services.ingest.executor import Executor
from services.runtime import Runtime

if TYPE_CHECKING:
    from services.store.edge.owner import Owner

log = logging.getLogger(__name__)


@dataclass
class ApiState:
    settings: Settings
    runtime: Runtime
    executor: Executor
    metrics: ApiMetrics
    gate: AccessGate
    model_ready: threading.Event = field(default_factory=threading.Event)
    model_error: str | None = None
    probes: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=2, thread_name_prefix="dpr-probe")
    )
    owner: Owner | None = None

    def own_store(self) -> None:
        """Answer other processes' point reads and writes of the generations this process has open (the embedded
        store; ``services/store/edge/owner.py``), unless another server process of the data dir does."""
        s = self.settings
        if s.qdrant_url or not s.edge.serve_writes:
            return
        from services.store import Answers
        from services.store.edge.engine import EdgeEngine
        from services.store.edge.owner import Owner

        owner = Owner(s.store_dir, Answers(lambda alias: EdgeEngine.from_settings(s.for_collection(alias))))
        if owner.start():
            self.owner = owner

    def warm(self) -> None:
        """Load the towers (and touch the model) once, so the first search does not pay for it."""
        try:
            self.runtime.question_towers.encode_queries(["warm up"], batch_size=1)
            _ = self.runtime.sparse
        except Exception as e:  # reported by /readyz; searches will raise the real error
            log.exception("loading the towers failed")
            self.model_error = f"{type(e).__name__}: {e}"
        finally:
            self.model_ready.set()

    def close(self) -> None:
        if self.owner is not None:
            self.owner.close()
        self.executor.close()
        self.probes.shutdown(wait=False, cancel_futures=True)
        try:
            self.runtime.close()
        except Exception:  # shutting down: say so and go on
            log.exception("closing the runtime failed")


def api_state(request: Request) -> ApiState:
    state: ApiState = request.app.state.api
    return state
