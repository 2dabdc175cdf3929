"""Error hierarchy: transient errors are retried, permanent ones fail one document (or one request) with a reason."""

from __future__ import annotations


class DprError(Exception):
    """Base of every error this service raises on purpose. The message names the thing and the fix."""


class TransientError(DprError):
    """Worth retrying with backoff: a store or broker that is unavailable for now, a lock held too long."""


class StoreUnavailable(TransientError):
    """The vector store cannot be reached or locked right now."""


class PermanentError(DprError):
    """Retrying cannot help: bad input, a configuration mistake."""


class DocumentError(PermanentError):
    """One document cannot be ingested (unreadable, binary, empty, invalid encoding, oversized).

    ``reason`` is a short machine-readable code; the message says what to do.
    """

    def __init__(self, source: str, reason: str, message: str) -> None:
        super().__init__(f"{source}: {message}")
        self.source = source
        self.reason = reason


class DataError(PermanentError, ValueError):
    """A training or evaluation data file is missing or malformed; the message names the file (and line) and the fix.

    Unlike ``DocumentError`` (one document fails, ingest goes on), the whole data set is refused.
    """


class ConfigError(PermanentError):
    """Settings or a command's arguments do not make sense together."""


class Conflict(ConfigError):
    """A well-formed request that the collection, as it is now, cannot serve: a search mode it has no vectors for, a
    reranker it does not have, a language other than its own. The API answers 409 (the request is fine, the state
    is not); the CLI treats it as any ConfigError."""


class ModelMismatch(PermanentError):
    """The towers at hand are not the ones the collection was embedded with."""


class CollectionNotFound(PermanentError):
    """No collection (or generation) of that name exists yet."""


class DiskFull(TransientError):
    """Too little free space to write safely (or the disk filled up): the message names the disk, its free space
    and the fix. Nothing was written; after space is freed a re-run completes (exit 3)."""


class DataDirFormatError(PermanentError):
    """The data dir was written in a format this release does not read as it is (newer, or older: `dpr migrate`)."""


class SnapshotError(PermanentError):
    """A snapshot cannot be made or restored: corrupt, truncated, checksum mismatch, or a target that is not empty."""
