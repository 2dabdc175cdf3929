"""A dict-backed stand-in for the few redis-py calls ``services.jobs.backends`` makes (unit tests: no sockets)."""

from __future__ import annotations

from typing import Any

import redis.exceptions


class FakeRedis:
    """``down``: every call fails as an unreachable server; ``refusing``: writes fail with this answer, as a server
    whose disk is full does (``MISCONF Errors writing to the AOF file: No space left on device``)."""

    def __init__(self, down: bool = False, refusing: str | None = None) -> None:
        self.hashes: dict[str, dict[bytes, bytes]] = {}
        self.strings: dict[str, bytes] = {}
        self.ttls: dict[str, int] = {}
        self.down = down
        self.refusing = refusing
        self.config = {"dir": "/var/lib/redis"}

    def _check(self, write: bool = False) -> None:
        if self.down:
            raise redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:6399. Connection refused.")
        if write and self.refusing:
            raise redis.exceptions.ResponseError(self.refusing)

    def get(self, key: str) -> bytes | None:
        self._check()
        return self.strings.get(key)

    def set(self, key: str, value: Any, nx: bool = False, px: int | None = None, ex: int | None = None) -> bool:
        self._check(write=True)
        if nx and key in self.strings:
            return False
        self.strings[key] = self._b(value)
        return True

    def eval(self, script: str, numkeys: int, key: str, token: Any, *args: Any) -> int:
        """The two scripts ``services.core.locks.RedisLease`` runs: refresh (pexpire) and release (del) while the key
        still holds ``token``."""
        self._check(write=True)
        if self.strings.get(key) != self._b(token):
            return 0
        if "'del'" in script:
            del self.strings[key]
        return 1

    def config_get(self, pattern: str) -> dict[str, str]:
        self._check()
        return {k: v for k, v in self.config.items() if k == pattern}

    def close(self) -> None:
        return None

    def __enter__(self) -> FakeRedis:  # redis.Redis closes itself at the end of a with block
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _b(value: Any) -> bytes:
        return value if isinstance(value, bytes) else str(value).encode()

    def ping(self) -> bool:
        self._check()
        return True

    def hset(self, key: str, field: Any = None, value: Any = None, mapping: dict[str, Any] | None = None) -> int:
        self._check(write=True)
        h = self.hashes.setdefault(key, {})
        items = dict(mapping or {})
        if field is not None:
            items[field] = value
        new = sum(1 for k in items if self._b(k) not in h)
        h.update({self._b(k): self._b(v) for k, v in items.items()})
        return new

    def hincrby(self, key: str, field: Any, amount: int = 1) -> int:
        self._check(write=True)
        h = self.hashes.setdefault(key, {})
        value = int(h.get(self._b(field), b"0")) + amount
        h[self._b(field)] = self._b(value)
        return value

    def hgetall(self, key: str) -> dict[bytes, bytes]:
        self._check()
        return dict(self.hashes.get(key, {}))

    def expire(self, key: str, seconds: int) -> bool:
        self._check(write=True)
        self.ttls[key] = seconds
        return key in self.hashes

    def delete(self, *keys: str) -> int:
        self._check(write=True)
        removed = sum(self.hashes.pop(key, None) is not None for key in keys)
        removed += sum(self.strings.pop(key, None) is not None for key in keys)
        for key in keys:
            self.ttls.pop(key, None)
        return removed

    def pipeline(self) -> FakePipeline:
        return FakePipeline(self)


class FakePipeline:
    def __init__(self, client: FakeRedis) -> None:
        self.client = client
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        def queue(*args: Any, **kwargs: Any) -> FakePipeline:
            self.calls.append((name, args, kwargs))
            return self

        return queue

    def execute(self) -> list[Any]:
        return [getattr(self.client, name)(*args, **kwargs) for name, args, kwargs in self.calls]
