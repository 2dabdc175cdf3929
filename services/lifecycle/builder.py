"""Who builds an unfinished generation (a re-embed's target), and whether that builder still runs.

- An in-process `dpr reembed` records its pid and host in the re-embed record: alive while that process runs
  (``ReembedState.owner_alive``; unknown from another host).
- A re-embed spread over workers is the job ``reembed_job_id(alias, target)`` (`dpr jobs JOB` shows it) run under
  the collection's re-embed lease: a Redis key the submitter took, whose token the record keeps, refreshed by
  every batch and finalize step (TTL ``reembed.lock_ttl``). The workers' build is alive while the key holds that
  token. Once the key is gone or holds another token, no step refreshed it for ``lock_ttl`` seconds (the workers
  died or were stopped, the submitter's steps were lost): its builder is dead, exactly like a killed in-process
  re-embed: `dpr status` lists it so, `dpr gc` drops it and the next `dpr reembed` resumes it (both take the
  lease first, so nothing else can resume it meanwhile). Unknown (None) when the broker cannot be read.
"""

from __future__ import annotations

import logging
from typing import Any

from services.core.settings import Settings
from services.lifecycle import locks
from services.lifecycle.locks import reembed_lock_key
from services.lifecycle.progress import reembed_job_id
from services.lifecycle.state import ReembedState

log = logging.getLogger(__name__)


def by_workers(st: ReembedState) -> bool:
    """Built through a broker: no process recorded, the lease's token is."""
    return st.pid <= 0 and bool(st.lock_token)


def lease_holds(settings: Settings, alias: str, token: str) -> bool | None:
    """Whether the collection's re-embed lease key holds ``token`` now; None when the broker cannot be read."""
    if not settings.broker_url:
        return None
    import redis.exceptions

    with locks.redis_client(settings.broker_url) as client:
        try:
            value = client.get(reembed_lock_key(alias))
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as e:
            log.warning("cannot read the re-embed lease; its builder's state is unknown (%s)", e)
            return None
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return text == token


def builder_alive(settings: Settings, st: ReembedState) -> bool | None:
    """Whether the builder of ``st.target`` still runs: True, False (dead: resume it or drop it), None (cannot be
    told here: another host, an unreadable broker, a record older than the owner fields)."""
    if by_workers(st):
        return lease_holds(settings, settings.collection, st.lock_token)
    return st.owner_alive()


def builder(settings: Settings, st: ReembedState, alias: str | None = None) -> dict[str, Any]:
    """The builder as `dpr status` shows it: ``pid``/``host`` (in process) or ``job``/``lease`` (workers), and
    ``alive``."""
    alias = alias or settings.collection
    if by_workers(st):
        return {"pid": None, "host": None, "job": reembed_job_id(alias, st.target), "lease": reembed_lock_key(alias),
                "alive": lease_holds(settings, alias, st.lock_token)}
    return {"pid": st.pid or None, "host": st.host or None, "job": None, "lease": None, "alive": st.owner_alive()}
