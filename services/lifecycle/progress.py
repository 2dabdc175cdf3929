"""The progress record of a re-embed spread over workers (which batches were sent, which are done, the result).

One small interface, ``ReembedProgress``; one implementation in Redis (the broker), keyed per target generation:
``dpr:reembed:<alias>:<target>:sent`` / ``:done`` (sets of batch ids), ``:last`` (time of the last finished
batch), ``:result`` (the finalize outcome, JSON). All keys expire after a week. A re-embed in process keeps no
record (its progress goes to a callback).
"""

from __future__ import annotations

import json
import time
from typing import Any, Protocol

from services.lifecycle.locks import redis_client
from services.settings import Settings

TTL = 7 * 24 * 3600


class ReembedProgress(Protocol):
    def reset(self) -> None:
        """Forget an earlier run's progress (a generation name can come back after `dpr gc`)."""

    def sent(self, batch_ids: list[str]) -> None: ...

    def done(self, batch_id: str) -> None: ...

    def touch(self) -> None:
        """Record activity now (what ``idle_seconds`` measures from)."""

    def pending(self) -> int:
        """Batches sent and not done yet."""

    def counts(self) -> tuple[int, int]:
        """(batches done, batches sent)."""

    def idle_seconds(self) -> float: ...

    def set_result(self, result: dict[str, Any]) -> None: ...

    def result(self) -> dict[str, Any] | None: ...


class RedisProgress:
    def __init__(self, client: Any, alias: str, target: str) -> None:
        self.client = client
        self.key = f"dpr:reembed:{alias}:{target}"

    def reset(self) -> None:
        self.client.delete(*(f"{self.key}:{part}" for part in ("sent", "done", "last", "result")))

    def sent(self, batch_ids: list[str]) -> None:
        if batch_ids:
            self.client.sadd(f"{self.key}:sent", *batch_ids)
            self.client.expire(f"{self.key}:sent", TTL)
            self.touch()

    def done(self, batch_id: str) -> None:
        self.client.sadd(f"{self.key}:done", batch_id)
        self.client.expire(f"{self.key}:done", TTL)
        self.touch()

    def touch(self) -> None:
        self.client.set(f"{self.key}:last", f"{time.time():.3f}", ex=TTL)

    def pending(self) -> int:
        return int(len(self.client.sdiff(f"{self.key}:sent", f"{self.key}:done")))

    def counts(self) -> tuple[int, int]:
        return int(self.client.scard(f"{self.key}:done")), int(self.client.scard(f"{self.key}:sent"))

    def idle_seconds(self) -> float:
        last = self.client.get(f"{self.key}:last")
        return time.time() - float(last) if last else float("inf")

    def set_result(self, result: dict[str, Any]) -> None:
        self.client.set(f"{self.key}:result", json.dumps(result), ex=TTL)

    def result(self) -> dict[str, Any] | None:
        raw = self.client.get(f"{self.key}:result")
        return json.loads(raw) if raw else None


def progress_for(settings: Settings, target: str, alias: str | None = None) -> ReembedProgress:
    """The progress record of the re-embed into ``target`` of ``alias`` (default ``settings.collection``)."""
    return RedisProgress(redis_client(settings.broker_url or ""), alias or settings.collection, target)
