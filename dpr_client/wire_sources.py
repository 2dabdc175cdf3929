"""The sources' request and response bodies (``/v1/sources``, docs/sources.md), beside ``dpr_client.wire``'s
(whose base models and rules they use): the server's routes and the client both import them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StringConstraints
from pydantic.json_schema import SkipJsonSchema

from dpr_client.wire import NOT_BLANK, Request, Wire, _no_null_default

SOURCE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"  # services.sources.registry.NAME
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"  # the NAME of a variable: credentials are never sent
_Glob = Annotated[str, StringConstraints(min_length=1, max_length=500)]


def _optional(description: str, **constraints: Any) -> Any:
    return Field(default=None, json_schema_extra=_no_null_default, description=description, **constraints)


class SourceIn(Request):
    """A source to add (``POST /v1/sources``, admin), as `dpr sources add`."""

    name: str = Field(pattern=SOURCE_NAME_PATTERN, description="Its documents' ids start with NAME/.")
    uri: str = Field(min_length=1, max_length=2000, pattern=NOT_BLANK,
                     description="A folder on the server, s3://bucket/prefix, https://site/path/, or a git URL.")
    every: Annotated[str, StringConstraints(pattern=r"^\d+(\.\d+)?[smhd]?$")] | SkipJsonSchema[None] = _optional(
        "Sync interval (15m, 1h, 1d; at least 1m); absent: only when asked.")
    include: list[_Glob] = Field(default_factory=list, max_length=100, description="Only keys matching a glob.")
    exclude: list[_Glob] = Field(default_factory=list, max_length=100, description="Leave out keys matching one.")
    collection: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")] | SkipJsonSchema[None] = (
        _optional("The collection it syncs into; absent: the server's."))
    endpoint: Annotated[str, StringConstraints(min_length=1, max_length=2000)] | SkipJsonSchema[None] = _optional(
        "s3: the store's URL.")
    key_env: Annotated[str, StringConstraints(pattern=ENV_NAME_PATTERN)] | SkipJsonSchema[None] = _optional(
        "s3: the NAME of the server's environment variable holding the access key id.")
    secret_env: Annotated[str, StringConstraints(pattern=ENV_NAME_PATTERN)] | SkipJsonSchema[None] = _optional(
        "s3: the NAME of the server's environment variable holding the secret key.")
    branch: Annotated[str, StringConstraints(min_length=1, max_length=250)] | SkipJsonSchema[None] = _optional(
        "git: the branch followed; absent: HEAD.")


class SourceOut(Wire):
    """A source as recorded (no credential: only the variables' names)."""

    model_config = ConfigDict(extra="allow")

    name: str
    uri: str
    kind: str
    collection: str | None
    every_s: float | None


class SourceStatus(SourceOut):
    """A source with its last sync (outcome, counts, error), whether one runs, and its next run (`dpr sources list`)."""

    last: dict[str, Any]
    running: bool
    next_run: str | None


class SourceList(Wire):
    sources: list[SourceStatus]


class SyncAccepted(Wire):
    """A sync started on the server (``POST /v1/sources/{name}/sync``): follow it with ``GET /v1/sources/{name}``."""

    source: str
    state: Literal["started"]


class SourceRemoved(Wire):
    source: str
    purged: bool
    documents: int = Field(description="Documents removed with --purge (0 without).")
    points: int
