"""The re-embed record: one per target generation, kept in that generation's spec settings under ``"reembed"``.

Any process that can open the store can resume or report a re-embed. Statuses: ``building`` -> ``active`` |
``rejected`` (gate) | ``abandoned`` (its source stopped being active, or another model was asked for).
"""

from __future__ import annotations

import os
import socket
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from services.core.errors import DprError, PermanentError
from services.core.fsutil import pid_alive
from services.store.points import CollectionSpec, GenerationInfo
from services.store.protocol import VectorStore

STATE_KEY = "reembed"  # the re-embed record inside a target generation's spec settings
PREVIOUS_KEY = "previous"  # generation that was active before this one was activated (rollback target)
ACTIVATED_KEY = "activated_at"
MODEL_NAME_KEY = "model_name"
LIFECYCLE_KEYS = (STATE_KEY, PREVIOUS_KEY, ACTIVATED_KEY, MODEL_NAME_KEY)

Status = Literal["building", "active", "rejected", "abandoned"]


class ReembedError(PermanentError):
    """A re-embed cannot go on (verification failed, source vanished, model changed under it)."""


class ReembedBusy(DprError):
    """Another re-embed holds the collection's lock."""


@dataclass(frozen=True)
class ReembedState:
    source: str
    target: str
    model: str  # fingerprint of the new passage tower
    model_name: str
    started: str
    status: Status = "building"
    finished: str = ""
    lock_token: str = ""  # the Redis lock token, so that any task of this re-embed can refresh / release it
    gate: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    pid: int = 0  # the process building it, for an in-process `dpr reembed` (0: workers, through a broker)
    host: str = ""

    def to_json(self) -> dict[str, Any]:
        """The record as stored (the target is the generation that holds it)."""
        data = asdict(self)
        del data["target"]
        return data

    @classmethod
    def from_generation(cls, g: GenerationInfo) -> ReembedState | None:
        return cls.from_spec(g.name, g.spec)

    @classmethod
    def from_spec(cls, name: str, spec: CollectionSpec) -> ReembedState | None:
        """The re-embed record kept in generation ``name``'s spec (None: it has none)."""
        data = spec.settings.get(STATE_KEY)
        if not isinstance(data, dict):
            return None
        return cls(
            source=str(data.get("source", "")),
            target=name,
            model=str(data.get("model", spec.model)),
            model_name=str(data.get("model_name", "")),
            started=str(data.get("started", "")),
            status=data.get("status", "building"),
            finished=str(data.get("finished", "")),
            lock_token=str(data.get("lock_token", "")),
            gate=dict(data.get("gate") or {}),
            error=str(data.get("error", "")),
            pid=int(data.get("pid") or 0),
            host=str(data.get("host", "")),
        )

    def owner_alive(self) -> bool | None:
        """Whether the process building this generation still runs: None when it cannot be told here (workers,
        another host, or a record older than the owner fields)."""
        if self.pid <= 0 or self.host != socket.gethostname():
            return None
        return pid_alive(self.pid)

    def owned_here(self) -> ReembedState:
        """This record with this process as its owner (an in-process re-embed creating or resuming it)."""
        return replace(self, pid=os.getpid(), host=socket.gethostname())


def save_state(store: VectorStore, state: ReembedState) -> None:
    store.update_settings({STATE_KEY: state.to_json()}, generation=state.target)


def find_state(store: VectorStore) -> ReembedState | None:
    """The re-embed record of the newest generation in status ``building``."""
    info = store.info(counts=False)
    for g in reversed(info.generations):
        st = ReembedState.from_generation(g)
        if st is not None and st.status == "building":
            return st
    return None


def current_state(store: VectorStore) -> ReembedState | None:
    """The newest re-embed record of any status (for `dpr status` / `dpr reembed --wait`)."""
    info = store.info()
    for g in reversed(info.generations):
        st = ReembedState.from_generation(g)
        if st is not None:
            return st
    return None


def state_and_spec(store: VectorStore, target: str) -> tuple[ReembedState | None, Any]:
    """The record and the spec of generation ``target`` ((None, None) when it is gone)."""
    spec = store.spec(target)  # that generation alone: the active one stays with whoever serves it
    if spec is None:
        return None, None
    return ReembedState.from_spec(target, spec), spec
