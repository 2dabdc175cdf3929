"""The lifecycle's locks over ``services.core.locks``: one re-embed per collection (a lease) and the collection's
write fence (writers hold it shared; a re-embed swap and a rollback take it exclusive).

Both live in Redis when a broker is configured, else in files under ``DATA_DIR/locks``: all processes of one
deployment must share the same settings (broker or not).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from services.core.locks import FileFence, FileLease, Lease, RedisFence, RedisLease, WriteFence
from services.core.settings import Settings


def redis_client(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)


def reembed_lock_key(alias: str) -> str:
    """The Redis key of a collection's re-embed lease (its value: the holder's token)."""
    return f"dpr:lock:reembed:{alias}"


def reembed_lease(
    alias: str, data_dir: Path, broker_url: str | None, ttl: float, token: str | None = None
) -> Lease:
    """One re-embed per collection: a Redis key when a broker is configured, else a file lock.

    ``token``: adopt the Redis lease another task of the same re-embed took (its token is in the re-embed record)."""
    if broker_url:
        lease = RedisLease(redis_client(broker_url), reembed_lock_key(alias), ttl, name=f"reembed-{alias}")
        if token:
            lease.token = token
            lease._held = True  # noqa: SLF001 - adopting a lease another task of this re-embed took
        return lease
    return FileLease(data_dir / "locks" / f"reembed-{alias}.lock", name=f"reembed-{alias}")


def lease_for(settings: Settings, token: str | None = None) -> Lease:
    """The re-embed lease of ``settings.collection``."""
    return reembed_lease(settings.collection, settings.data_dir, settings.broker_url, settings.reembed.lock_ttl,
                         token=token)


def write_fence(alias: str, data_dir: Path, broker_url: str | None, timeout: float) -> WriteFence:
    """The collection's write fence: in Redis when a broker is configured, else a file beside the store."""
    if broker_url:
        return RedisFence(redis_client(broker_url), f"dpr:fence:{alias}", timeout=timeout)
    return FileFence(data_dir / "locks" / f"fence-{alias}", timeout=timeout)
