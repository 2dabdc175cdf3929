"""The re-embed lease: one re-embed per collection, in Redis when a broker is configured, else a file under
``DATA_DIR/locks`` (over ``services.core.locks``, which also holds the collection's write fence). All processes of
one deployment must share the same settings (broker or not).
"""

from __future__ import annotations

from pathlib import Path

from services.core.locks import FileLease, Lease, RedisLease, redis_client
from services.core.settings import Settings

__all__ = ["lease_for", "redis_client", "reembed_lease", "reembed_lock_key"]


def reembed_lock_key(alias: str) -> str:
    """The Redis key of a collection's re-embed lease (its value: the holder's token)."""
    return f"dpr:lock:reembed:{alias}"


def reembed_lease(
    alias: str, data_dir: Path, broker_url: str | None, ttl: float, token: str | None = None
) -> Lease:
    """One re-embed per collection: a Redis key when a broker is configured, else a file lock.

    ``token``: adopt the Redis lease another task of the same re-embed took (its token is in the re-embed record)."""
    if broker_url:
        return RedisLease(redis_client(broker_url), reembed_lock_key(alias), ttl, name=f"reembed-{alias}", token=token)
    return FileLease(data_dir / "locks" / f"reembed-{alias}.lock", name=f"reembed-{alias}")


def lease_for(settings: Settings, token: str | None = None) -> Lease:
    """The re-embed lease of ``settings.collection``."""
    return reembed_lease(settings.collection, settings.data_dir, settings.broker_url, settings.reembed.lock_ttl,
                         token=token)
