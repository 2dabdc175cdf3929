"""Where job hashes live: Redis (with a broker) or one folder per hash under the data dir (in-process).

Both keep the same tiny surface ``JobStore`` needs: set fields of a hash, increment a field, read several
hashes, refresh expiry. Values are strings (the job store writes JSON).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit, urlunsplit

from services.core.errors import DiskFull, TransientError
from services.core.fsutil import write_atomic

T = TypeVar("T")


class JobStoreUnavailable(TransientError):
    """The job store (Redis, which also carries the queue) cannot be reached."""


class BrokerWriteRefused(JobStoreUnavailable):
    """The broker's Redis answers but refuses writes: its disk is full (MISCONF: the AOF or RDB write failed), it
    is out of memory (``maxmemory``), or it is a read-only replica. Reads keep working; nothing more can be sent
    or recorded until it accepts writes again (exit 3, like a full data dir)."""


class BrokerDiskFull(BrokerWriteRefused, DiskFull):
    """The broker's Redis refuses writes because its disk is full (``MISCONF`` ... ``No space left on device``)."""


# Redis' answers to a write it refuses (the text of its ResponseError), and what each means for the user
_REFUSALS = (("No space left on device", "disk"), ("MISCONF", "persistence"), ("OOM command not allowed", "memory"),
             ("READONLY", "replica"))


def refusal_kind(error: BaseException) -> str | None:
    """``disk`` | ``persistence`` | ``memory`` | ``replica`` when ``error`` (or an error it was raised from) is
    Redis refusing a write, else None."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        text = str(e)
        for marker, kind in _REFUSALS:
            if marker in text:
                return kind
        e = e.__cause__ or e.__context__
    return None


def broker_dir(client: Any) -> str | None:
    """Where the broker keeps its AOF / RDB files (``CONFIG GET dir``; None when CONFIG is not allowed)."""
    try:
        value = client.config_get("dir").get("dir")
    except Exception:  # noqa: BLE001 - managed Redis often disables CONFIG: the message goes without the folder
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else (str(value) if value else None)


def write_refused(url: str, error: BaseException, client: Any = None, what: str = "",
                  again: str = "documents already written are unchanged and cost nothing") -> BrokerWriteRefused | None:
    """The one-line error for Redis refusing a write (None when ``error`` is something else): names the broker,
    its folder when it says, why, and the fix. ``what``: what stopped (e.g. "job J stopped after 3 batches");
    ``again``: why running the command again is safe."""
    kind = refusal_kind(error)
    if kind is None:
        return None
    answer = " ".join(str(error).split())
    answer = answer[answer.find("MISCONF"):] if "MISCONF" in answer else answer
    where = f"Redis broker at {redact_url(url)}"
    folder = broker_dir(client) if client is not None and kind in ("disk", "persistence") else None
    done = f"{what}; " if what else ""
    tail = f"and run the command again ({again})"
    if kind == "disk":
        disk = f"the disk of its folder {folder}" if folder else "its disk (the folder `CONFIG GET dir` names)"
        return BrokerDiskFull(
            f"broker disk full: the {where} refuses writes ({answer[:160]}); {done}reads go on: free space on "
            f"{disk} (or move its dir / appendonly files to a larger disk) {tail}"
        )
    if kind == "persistence":
        disk = f" in {folder}" if folder else ""
        return BrokerWriteRefused(
            f"the {where} refuses writes: it cannot save its data{disk} ({answer[:160]}); {done}reads go on: fix "
            f"the broker's persistence (its log says why: a full disk, permissions) {tail}"
        )
    if kind == "memory":
        return BrokerWriteRefused(
            f"the {where} refuses writes: it is out of memory ({answer[:120]}); {done}reads go on: raise its "
            f"maxmemory or free memory there {tail}"
        )
    return BrokerWriteRefused(
        f"the {where} refuses writes: it is a read-only replica ({answer[:120]}); {done}point DPR_BROKER_URL at "
        f"the primary {tail}"
    )


class HashBackend(Protocol):
    def hset(self, key: str, fields: Mapping[str, str], ttl: int) -> None:
        """Set fields and refresh the key's expiry. Redis applies them at once; other backends may make them
        visible one by one, in the order given, so a caller puts the field that commits the others last."""
        ...

    def hincrby(self, key: str, field: str, ttl: int) -> int: ...

    def hgetall_many(self, keys: Sequence[str]) -> list[dict[str, str]]: ...

    def touch(self, keys: Sequence[str], ttl: int) -> None: ...

    def delete(self, keys: Sequence[str]) -> None: ...

    def ping(self) -> None: ...

    def describe(self) -> str: ...


def redact_url(url: str) -> str:
    """The URL without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = parts.username or ""
    return urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, parts.fragment))


def unavailable(url: str, error: Exception) -> JobStoreUnavailable:
    return JobStoreUnavailable(
        f"cannot reach Redis at {redact_url(url)} ({error}); start Redis (e.g. `redis-server --port 6379`) "
        "or fix DPR_BROKER_URL"
    )


def _decode(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


class RedisHashes:
    """Hashes in Redis; every write sets the key's expiry in the same pipeline. Hand it a redis-py client."""

    def __init__(self, client: Any, url: str = "redis://") -> None:
        self.client = client
        self.url = url

    @classmethod
    def from_url(cls, url: str) -> RedisHashes:
        import redis  # here, not at import: an embedded `dpr query` never loads redis-py (~19 MiB)

        client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=30, health_check_interval=30)
        return cls(client, url=url)

    def describe(self) -> str:
        return f"Redis at {redact_url(self.url)}"

    def _run(self, fn: Callable[[], T]) -> T:
        import redis.exceptions

        try:
            return fn()
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as e:
            raise unavailable(self.url, e) from e
        except redis.exceptions.ResponseError as e:
            refused = write_refused(self.url, e, self.client)
            if refused is None:
                raise
            raise refused from e

    def ping(self) -> None:
        self._run(self.client.ping)

    def _pipeline(self, commands: Iterable[tuple[str, tuple[Any, ...], dict[str, Any]]]) -> list[Any]:
        """The answers of ``(command, args, kwargs)`` sent as one pipeline (through ``_run``)."""

        def send() -> list[Any]:
            pipe = self.client.pipeline()
            for name, args, kwargs in commands:
                getattr(pipe, name)(*args, **kwargs)
            return list(pipe.execute())

        return self._run(send)

    def hset(self, key: str, fields: Mapping[str, str], ttl: int) -> None:
        self._pipeline([("hset", (key,), {"mapping": dict(fields)}), ("expire", (key, ttl), {})])

    def hincrby(self, key: str, field: str, ttl: int) -> int:
        return int(self._pipeline([("hincrby", (key, field, 1), {}), ("expire", (key, ttl), {})])[0])

    def hgetall_many(self, keys: Sequence[str]) -> list[dict[str, str]]:
        raws = self._pipeline(("hgetall", (key,), {}) for key in keys)
        return [{_decode(k): _decode(v) for k, v in (raw or {}).items()} for raw in raws]

    def touch(self, keys: Sequence[str], ttl: int) -> None:
        self._pipeline(("expire", (key, ttl), {}) for key in keys)

    def delete(self, keys: Sequence[str]) -> None:
        self._run(lambda: self.client.delete(*keys))


class FileHashes:
    """Hashes as folders (one file per field, replaced atomically) under ``root``; expired hashes are removed
    when a new one is created. Safe across processes: increments take an ``flock`` on the hash's folder."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def describe(self) -> str:
        return f"the job folder {self.root}"

    def _dir(self, key: str) -> Path:
        return self.root / key.replace(":", "~").replace("/", "_")

    def ping(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    def hset(self, key: str, fields: Mapping[str, str], ttl: int) -> None:
        folder = self._dir(key)
        if not folder.exists():
            self._expire_old(ttl)
            folder.mkdir(parents=True, exist_ok=True)
        for name, value in fields.items():
            write_atomic(folder / name, value)

    def hincrby(self, key: str, field: str, ttl: int) -> int:
        folder = self._dir(key)
        folder.mkdir(parents=True, exist_ok=True)
        with _flocked(folder / ".lock"):
            path = folder / field
            value = int(path.read_text() or 0) + 1 if path.exists() else 1
            write_atomic(path, str(value))
        return value

    def hgetall_many(self, keys: Sequence[str]) -> list[dict[str, str]]:
        return [self._read(self._dir(key)) for key in keys]

    @staticmethod
    def _read(folder: Path) -> dict[str, str]:
        out: dict[str, str] = {}
        if not folder.is_dir():
            return out
        for path in folder.iterdir():
            if path.name.startswith("."):
                continue
            with contextlib.suppress(FileNotFoundError):
                out[path.name] = path.read_text(encoding="utf-8")
        return out

    def touch(self, keys: Sequence[str], ttl: int) -> None:
        for key in keys:
            folder = self._dir(key)
            if folder.exists():
                os.utime(folder)

    def delete(self, keys: Sequence[str]) -> None:
        for key in keys:
            shutil.rmtree(self._dir(key), ignore_errors=True)

    def _expire_old(self, ttl: int) -> None:
        if not self.root.is_dir():
            return
        cutoff = time.time() - ttl
        for folder in self.root.iterdir():
            with contextlib.suppress(OSError):
                if folder.is_dir() and folder.stat().st_mtime < cutoff:
                    shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def _flocked(path: Path) -> Iterator[None]:
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
