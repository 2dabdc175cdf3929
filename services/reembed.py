"""Model lifecycle: re-embed the stored passages into a new generation, verify, swap atomically, roll back, gc.

Plain functions over the ``VectorStore`` protocol (never Celery): the CLI runs them in-process on the embedded
default, the workers run ``copy_batch`` / ``finalize`` as tasks when a broker is configured.

State lives in the store, in the *target* generation's spec settings under ``"reembed"`` (source generation,
model fingerprint and name, status, started / finished, the gate's decision), so any process that can open the
store can resume or report it. Statuses: ``building`` -> ``active`` | ``rejected`` (gate) | ``abandoned``
(its source stopped being active, or another model was asked for).

Resumability: the copy skips every source passage whose point already sits in the target with the new
fingerprint, the same text hash and the same doc hash; point ids are uuid5(doc id, chunk), so a redelivered or
repeated batch overwrites and never duplicates. Ctrl-C, a SIGKILLed worker or a crash lose at most the batches
in flight; running ``dpr reembed`` again continues.

No lost writes: writers (ingest batches, deletes) hold the collection's ``WriteFence`` shared from resolving the
active generation to their last write. ``finalize`` catches up without the fence (cheap passes that copy what
changed meanwhile), then takes the fence exclusively (in-flight writes finish, new ones wait), catches up the
last changes, verifies (same count, same ids, same text and doc hash per id, one fingerprint), swaps the alias,
records, and releases: a write either landed in the source before the final catch-up read it, or waits and lands
in the new generation. Deletes cannot resurrect: the catch-up deletes target points whose id the source lacks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from encoders.towers import DualEncoder, base_model_path, model_fingerprint
from services.chunking import Chunk
from services.errors import CollectionNotFound, ConfigError, DprError, ModelMismatch, PermanentError
from services.ingest import SparseEncoder
from services.locks import FileFence, FileLease, Lease, NoFence, RedisFence, RedisLease, WriteFence
from services.store.points import CollectionSpec, GenerationInfo, Passage, PassagePoint
from services.store.protocol import VectorStore

log = logging.getLogger(__name__)

STATE_KEY = "reembed"  # the re-embed record inside a target generation's spec settings
PREVIOUS_KEY = "previous"  # generation that was active before this one was activated (rollback target)
ACTIVATED_KEY = "activated_at"
MODEL_NAME_KEY = "model_name"
_LIFECYCLE_KEYS = (STATE_KEY, PREVIOUS_KEY, ACTIVATED_KEY, MODEL_NAME_KEY)

Status = Literal["building", "active", "rejected", "abandoned"]


class ReembedError(PermanentError):
    """A re-embed cannot go on (verification failed, source vanished, model changed under it)."""


class ReembedBusy(DprError):
    """Another re-embed holds the collection's lock."""


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# --------------------------------------------------------------------------------------------------------------
# state
# --------------------------------------------------------------------------------------------------------------


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

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "model": self.model,
            "model_name": self.model_name,
            "started": self.started,
            "status": self.status,
            "finished": self.finished,
            "lock_token": self.lock_token,
            "gate": dict(self.gate),
            "error": self.error,
        }

    @classmethod
    def from_generation(cls, g: GenerationInfo) -> ReembedState | None:
        data = g.spec.settings.get(STATE_KEY)
        if not isinstance(data, dict):
            return None
        return cls(
            source=str(data.get("source", "")),
            target=g.name,
            model=str(data.get("model", g.spec.model)),
            model_name=str(data.get("model_name", "")),
            started=str(data.get("started", "")),
            status=data.get("status", "building"),
            finished=str(data.get("finished", "")),
            lock_token=str(data.get("lock_token", "")),
            gate=dict(data.get("gate") or {}),
            error=str(data.get("error", "")),
        )


def save_state(store: VectorStore, state: ReembedState) -> None:
    store.update_settings({STATE_KEY: state.to_json()}, generation=state.target)


def find_state(store: VectorStore, target: str | None = None) -> ReembedState | None:
    """The re-embed record of ``target``, or of the newest generation in status ``building``."""
    info = store.info()
    for g in reversed(info.generations):
        st = ReembedState.from_generation(g)
        if st is None:
            continue
        if target is not None and g.name == target:
            return st
        if target is None and st.status == "building":
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


# --------------------------------------------------------------------------------------------------------------
# models by fingerprint (the towers follow the collection)
# --------------------------------------------------------------------------------------------------------------


def model_candidates(models_dir: Path) -> list[tuple[Path, str]]:
    out = [(base_model_path(), "base")]
    if models_dir.is_dir():
        for p in sorted(models_dir.iterdir()):
            if p.is_dir() and not p.name.startswith(".") and (p / "modules.json").is_file():
                out.append((p, p.name))
    return out


def model_for_fingerprint(fingerprint: str, models_dir: Path) -> tuple[Path, str]:
    """The model directory whose fingerprint is ``fingerprint`` (the base model or one under ``models_dir``)."""
    for path, name in model_candidates(models_dir):
        if model_fingerprint(path) == fingerprint:
            return path, name
    raise ModelMismatch(
        f"no model with fingerprint {fingerprint} under {models_dir} or the base model; the collection was built "
        "by a model that is no longer here: restore it, `dpr rollback`, or re-embed with `dpr reembed --model NAME`"
    )


def point_active_model(models_dir: Path, name: str) -> None:
    """Make ``name`` the ACTIVE model (the desired model the beat reconciles the collection to)."""
    from encoders.registry import activate

    activate(models_dir, name)


def promote_model(settings: Any, state: ReembedState) -> None:
    """After the swap the new model becomes ACTIVE (the desired model), so the beat check does not undo it."""
    models_dir = settings.models_dir
    if state.model_name == "base" or (models_dir / state.model_name).is_dir():
        point_active_model(models_dir, state.model_name)
    else:
        log.warning("re-embedded with a model outside the models directory; ACTIVE unchanged",
                    extra={"model": state.model_name})


# --------------------------------------------------------------------------------------------------------------
# locks
# --------------------------------------------------------------------------------------------------------------


def redis_client(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)


def reembed_lease(
    alias: str, data_dir: Path, broker_url: str | None, ttl: float, token: str | None = None
) -> Lease:
    """One re-embed per collection: a Redis key when a broker is configured, else a file lock."""
    if broker_url:
        lease = RedisLease(redis_client(broker_url), f"dpr:lock:reembed:{alias}", ttl, name=f"reembed-{alias}")
        if token:
            lease.token = token
            lease._held = True  # noqa: SLF001 - adopting a lease another task of this re-embed took
        return lease
    return FileLease(data_dir / "locks" / f"reembed-{alias}.lock", name=f"reembed-{alias}")


def write_fence(alias: str, data_dir: Path, broker_url: str | None, timeout: float) -> WriteFence:
    """The collection's write fence: in Redis when a broker is configured, else a file beside the store."""
    if broker_url:
        return RedisFence(redis_client(broker_url), f"dpr:fence:{alias}", timeout=timeout)
    return FileFence(data_dir / "locks" / f"fence-{alias}", timeout=timeout)


# --------------------------------------------------------------------------------------------------------------
# plan
# --------------------------------------------------------------------------------------------------------------


def plan(
    store: VectorStore, towers: DualEncoder, *, model_name: str, lock_token: str = "", force: bool = False
) -> ReembedState | None:
    """The re-embed to run: resume the one in progress for this model, or create its target generation.

    None when the active generation is already embedded by ``towers`` (nothing to do) unless ``force``.
    Caller holds the re-embed lock.
    """
    info = store.info()
    if info.active is None:
        raise CollectionNotFound(f"collection {store.alias!r} does not exist yet; ingest something first")
    source = info.active
    for g in info.generations:
        st = ReembedState.from_generation(g)
        if st is None or st.status != "building":
            continue
        if g.active:  # activated but the record was not updated (crash right after the swap)
            save_state(store, replace(st, status="active", finished=st.finished or now_iso()))
            continue
        if st.source == source.name and st.model == towers.fingerprint:
            log.info("resuming re-embed", extra={"target": g.name, "source": source.name})
            if lock_token and lock_token != st.lock_token:
                st = replace(st, lock_token=lock_token)
                save_state(store, st)
            return st
        log.warning("abandoning a stale re-embed", extra={"target": g.name, "source": st.source})
        save_state(store, replace(st, status="abandoned", finished=now_iso(), error="superseded"))
    if source.spec.model == towers.fingerprint and not force:
        return None
    if towers.dim < 1:
        raise ConfigError("the new towers report no dimension")
    state = ReembedState(
        source=source.name,
        target="",
        model=towers.fingerprint,
        model_name=model_name,
        started=now_iso(),
        lock_token=lock_token,
    )
    kept = {k: v for k, v in source.spec.settings.items() if k not in _LIFECYCLE_KEYS}
    spec = CollectionSpec(
        dim=towers.dim,
        distance=towers.similarity,
        model=towers.fingerprint,
        sparse=source.spec.sparse,
        settings={**kept, MODEL_NAME_KEY: model_name, STATE_KEY: state.to_json()},
    )
    target = store.create_generation(spec)
    log.info("planned re-embed", extra={"source": source.name, "target": target, "model": towers.fingerprint})
    return replace(state, target=target)


# --------------------------------------------------------------------------------------------------------------
# copy
# --------------------------------------------------------------------------------------------------------------

# point id -> (model, text hash, doc hash)
Index = dict[str, tuple[str, str, str]]


def index_of(store: VectorStore, generation: str, batch_size: int = 1024) -> tuple[Index, dict[str, Passage]]:
    """Every point of a generation: its (model, text hash, doc hash), and its passage."""
    index: Index = {}
    passages: dict[str, Passage] = {}
    for batch in store.scroll(batch_size=batch_size, generation=generation):
        for p in batch:
            index[p.id] = (p.model, p.text_hash, p.doc_hash)
            passages[p.id] = p
    return index, passages


def is_done(target: Index, model: str, p: Passage) -> bool:
    return target.get(p.id) == (model, p.text_hash, p.doc_hash)


def pending_batches(store: VectorStore, state: ReembedState, batch_size: int) -> Iterator[list[Passage]]:
    """Source passages, in batches, that the target does not hold yet with the new model (resumability)."""
    target, _ = index_of(store, state.target)
    batch: list[Passage] = []
    for page in store.scroll(batch_size=batch_size, generation=state.source):
        for p in page:
            if not is_done(target, state.model, p):
                batch.append(p)
                if len(batch) >= batch_size:
                    yield batch
                    batch = []
    if batch:
        yield batch


def embed_passages(
    passages: Sequence[Passage], towers: DualEncoder, sparse: SparseEncoder | None, batch_size: int = 32
) -> list[PassagePoint]:
    """The passage tower reads exactly what ingest gave it (title + text); payloads are kept, model replaced."""
    texts = [Chunk(index=p.chunk_index, text=p.text, title=p.title).encoder_text for p in passages]
    vectors = towers.encode_documents(texts, batch_size=batch_size)  # (n, dim)
    sparse_vectors = [sparse.embed_document(t) for t in texts] if sparse is not None else None
    return [
        PassagePoint(
            passage=replace(p, model=towers.fingerprint),
            dense=vectors[i].tolist(),
            sparse=sparse_vectors[i] if sparse_vectors is not None else None,
        )
        for i, p in enumerate(passages)
    ]


def check_towers(state: ReembedState, towers: DualEncoder) -> None:
    if towers.fingerprint != state.model:
        raise ReembedError(
            f"re-embed into {state.target} is for model {state.model}, but the towers at hand are "
            f"{towers.fingerprint} (the model directory changed?); run `dpr reembed` again to start over"
        )


def copy_batch(
    store: VectorStore,
    state: ReembedState,
    passages: Sequence[Passage],
    towers: DualEncoder,
    sparse: SparseEncoder | None,
    encode_batch_size: int = 32,
) -> int:
    """Encode ``passages`` with the new passage tower and upsert them into the target. Idempotent."""
    check_towers(state, towers)
    if not passages:
        return 0
    store.upsert(embed_passages(passages, towers, sparse, encode_batch_size), generation=state.target)
    return len(passages)


# --------------------------------------------------------------------------------------------------------------
# catch-up and verification
# --------------------------------------------------------------------------------------------------------------


@dataclass
class Diff:
    source_count: int = 0
    target_count: int = 0
    stale: list[Passage] = field(default_factory=list)  # source passages missing or different in the target
    extra: dict[str, str] = field(default_factory=dict)  # target point id -> doc id, absent from the source
    foreign: int = 0  # target points embedded by another model
    source_docs: dict[str, tuple[str, int]] = field(default_factory=dict)  # doc id -> (doc hash, chunks)

    @property
    def clean(self) -> bool:
        return not self.stale and not self.extra and not self.foreign and self.source_count == self.target_count

    def to_json(self) -> dict[str, Any]:
        return {
            "source_count": self.source_count,
            "target_count": self.target_count,
            "missing_or_stale": len(self.stale),
            "extra": len(self.extra),
            "foreign_model": self.foreign,
            "ok": self.clean,
        }


def diff(store: VectorStore, state: ReembedState) -> Diff:
    src, src_passages = index_of(store, state.source)
    tgt, tgt_passages = index_of(store, state.target)
    d = Diff(source_count=len(src), target_count=len(tgt))
    for p in src_passages.values():
        h, n = d.source_docs.get(p.doc_id, (p.doc_hash, 0))
        d.source_docs[p.doc_id] = (h if h == p.doc_hash else "", n + 1)
        if not is_done(tgt, state.model, p):
            d.stale.append(p)
    for pid, (model, _, _) in tgt.items():
        if pid not in src:
            d.extra[pid] = tgt_passages[pid].doc_id
        if model != state.model:
            d.foreign += 1
    return d


def catch_up(
    store: VectorStore, state: ReembedState, towers: DualEncoder, sparse: SparseEncoder | None, batch_size: int = 256
) -> Diff:
    """Make the target hold exactly the source's passages (new model): copy what changed, delete what went."""
    d = diff(store, state)
    for start in range(0, len(d.stale), batch_size):
        copy_batch(store, state, d.stale[start : start + batch_size], towers, sparse)
    gone = sorted({doc for doc in d.extra.values() if doc not in d.source_docs})
    if gone:
        store.delete_documents(gone, generation=state.target)
    shrunk = sorted({doc for doc in d.extra.values() if doc in d.source_docs})
    for doc in shrunk:
        doc_hash, chunks = d.source_docs[doc]
        if doc_hash:
            store.delete_stale(doc, doc_hash, chunks, generation=state.target)
    if d.stale or d.extra:
        log.info("caught up", extra={"target": state.target, "copied": len(d.stale), "deleted": len(d.extra)})
    return d


@dataclass(frozen=True)
class Verification:
    ok: bool
    source_count: int
    target_count: int
    missing: int
    extra: int
    stale: int
    models: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "source_count": self.source_count,
            "target_count": self.target_count,
            "missing": self.missing,
            "extra": self.extra,
            "stale": self.stale,
            "models": self.models,
        }


def verify(store: VectorStore, state: ReembedState) -> Verification:
    """Same count as the source, every id present, same text and doc hash per id, one fingerprint (the new)."""
    src, _ = index_of(store, state.source)
    tgt, _ = index_of(store, state.target)
    missing = sum(1 for pid in src if pid not in tgt)
    extra = sum(1 for pid in tgt if pid not in src)
    stale = sum(1 for pid, v in src.items() if pid in tgt and tgt[pid][1:] != v[1:])
    models = sorted({v[0] for v in tgt.values()})
    counted = store.count(generation=state.target)
    ok = (
        missing == 0
        and extra == 0
        and stale == 0
        and len(src) == len(tgt) == counted == store.count(generation=state.source)
        and models in ([state.model], [])
    )
    return Verification(ok, len(src), counted, missing, extra, stale, models)


def _verified_by(d: Diff, state: ReembedState) -> Verification:
    return Verification(
        ok=d.clean, source_count=d.source_count, target_count=d.target_count, missing=0, extra=0, stale=0,
        models=[state.model] if d.target_count else [],
    )


# --------------------------------------------------------------------------------------------------------------
# finalize: gate, swap, record
# --------------------------------------------------------------------------------------------------------------

# Scores one generation with the towers that built it, on the gate's dev data (higher is better).
Scorer = Callable[[VectorStore, str, DualEncoder], float]


@dataclass(frozen=True)
class GateDecision:
    promote: bool
    candidate: float
    active: float
    metric: str
    data: str

    def to_json(self) -> dict[str, Any]:
        return {
            "promote": self.promote,
            "candidate": self.candidate,
            "active": self.active,
            "metric": self.metric,
            "data": self.data,
            "decided": now_iso(),
        }


def run_gate(
    store: VectorStore,
    state: ReembedState,
    new_towers: DualEncoder,
    old_towers: DualEncoder,
    scorer: Scorer,
    *,
    metric: str = "ndcg@10",
    data: str = "",
) -> GateDecision:
    """Promote only if the candidate generation scores at least as well as the active one on the dev data."""
    active = scorer(store, state.source, old_towers)
    candidate = scorer(store, state.target, new_towers)
    decision = GateDecision(candidate >= active, candidate, active, metric, data)
    log.info("gate decided", extra={"target": state.target, **decision.to_json()})
    return decision


@dataclass
class ReembedResult:
    state: ReembedState
    outcome: Literal["activated", "rejected", "nothing_to_do"]
    verification: Verification | None = None
    gate: GateDecision | None = None
    copied: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "source": self.state.source,
            "target": self.state.target,
            "model": self.state.model,
            "model_name": self.state.model_name,
            "copied": self.copied,
            "seconds": round(self.seconds, 3),
            "verification": self.verification.to_json() if self.verification else None,
            "gate": self.gate.to_json() if self.gate else None,
        }


def finalize(
    store: VectorStore,
    state: ReembedState,
    towers: DualEncoder,
    sparse: SparseEncoder | None,
    *,
    fence: WriteFence | None = None,
    gate: Callable[[], GateDecision] | None = None,
    on_activated: Callable[[ReembedState], None] | None = None,
    max_unfenced_passes: int = 3,
    small: int = 256,
) -> ReembedResult:
    """Catch up, (gate), then under the exclusive write fence: catch up, verify, swap, record. Idempotent."""
    check_towers(state, towers)
    fence = fence or NoFence()
    info = store.info()
    if info.active is not None and info.active.name == state.target:  # already swapped (a redelivered finalize)
        return ReembedResult(state=replace(state, status="active"), outcome="activated")
    if info.active is None or info.active.name != state.source:
        save_state(store, replace(state, status="abandoned", finished=now_iso(), error="source no longer active"))
        raise ReembedError(
            f"the source generation {state.source} is no longer active (now "
            f"{info.active.name if info.active else None}); run `dpr reembed` again to re-embed the new one"
        )
    copied = 0
    for _ in range(max_unfenced_passes):
        d = catch_up(store, state, towers, sparse)
        copied += len(d.stale)
        if len(d.stale) + len(d.extra) <= small:
            break
    decision = gate() if gate is not None else None
    if decision is not None and not decision.promote:
        state = replace(state, status="rejected", finished=now_iso(), gate=decision.to_json())
        save_state(store, state)
        return ReembedResult(state=state, outcome="rejected", gate=decision, copied=copied)
    with fence.exclusive():
        active_now = store.info().active.name  # type: ignore[union-attr]
        if active_now == state.target:  # a concurrent finalize of the same re-embed won
            return ReembedResult(state=replace(state, status="active"), outcome="activated", copied=copied)
        if active_now != state.source:
            raise ReembedError(f"the source generation {state.source} stopped being active during the re-embed")
        last = catch_up(store, state, towers, sparse)
        copied += len(last.stale)
        # a clean diff *is* the verification (same ids, hashes, one model); only re-scan after writing
        verification = _verified_by(last, state) if last.clean else verify(store, state)
        if not verification.ok:
            save_state(store, replace(state, error=f"verification failed: {verification.to_json()}"))
            raise ReembedError(
                f"re-embed into {state.target} failed verification {verification.to_json()}; the alias still "
                f"points at {state.source}; run `dpr reembed` again to resume"
            )
        store.activate(state.target)
        stamp = now_iso()
        state = replace(
            state, status="active", finished=stamp, error="", gate=decision.to_json() if decision else {}
        )
        store.update_settings(
            {STATE_KEY: state.to_json(), PREVIOUS_KEY: state.source, ACTIVATED_KEY: stamp}, generation=state.target
        )
        if on_activated is not None:
            on_activated(state)
    log.info("re-embed activated", extra={"target": state.target, "source": state.source, "model": state.model})
    return ReembedResult(state=state, outcome="activated", verification=verification, gate=decision, copied=copied)


def run_in_process(
    store: VectorStore,
    state: ReembedState,
    towers: DualEncoder,
    sparse: SparseEncoder | None,
    *,
    batch_size: int = 256,
    encode_batch_size: int = 32,
    fence: WriteFence | None = None,
    gate: Callable[[], GateDecision] | None = None,
    on_activated: Callable[[ReembedState], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
    keepalive: Callable[[], None] | None = None,
) -> ReembedResult:
    """The whole re-embed in this process: copy what is pending, then finalize. ``progress(done, total)``."""
    t0 = time.perf_counter()
    total = store.count(generation=state.source)
    copied = 0
    done = min(store.count(generation=state.target), total)  # resumed: roughly what is already there
    if progress:
        progress(done, total)
    for batch in pending_batches(store, state, batch_size):
        copied += copy_batch(store, state, batch, towers, sparse, encode_batch_size)
        if keepalive:
            keepalive()
        if progress:
            done += len(batch)
            progress(min(done, total), total)
    result = finalize(store, state, towers, sparse, fence=fence, gate=gate, on_activated=on_activated)
    result.copied += copied
    result.seconds = time.perf_counter() - t0
    return result


# --------------------------------------------------------------------------------------------------------------
# rollback and gc
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rollback:
    from_generation: str
    to_generation: str
    model: str

    def to_json(self) -> dict[str, Any]:
        return {"from": self.from_generation, "to": self.to_generation, "model": self.model}


def rollback_target(store: VectorStore) -> tuple[GenerationInfo, GenerationInfo]:
    info = store.info()
    if info.active is None:
        raise CollectionNotFound(f"collection {store.alias!r} does not exist yet")
    current = info.active
    by_name = {g.name: g for g in info.generations}
    previous = current.spec.settings.get(PREVIOUS_KEY)
    if isinstance(previous, str) and previous in by_name:
        return current, by_name[previous]
    # no record: the newest other generation that is complete (not an unfinished or rejected re-embed)
    for g in reversed(info.generations):
        st = ReembedState.from_generation(g)
        if g.name != current.name and (st is None or st.status == "active"):
            return current, g
    raise ConfigError(
        f"collection {store.alias!r} has no previous generation to roll back to (generations kept: "
        f"{', '.join(g.name for g in info.generations)})"
    )


def rollback(store: VectorStore, *, fence: WriteFence | None = None) -> Rollback:
    """Swap the alias back to the previous generation (which then records this one as its previous)."""
    fence = fence or NoFence()
    with fence.exclusive():
        current, previous = rollback_target(store)
        store.activate(previous.name)
        store.update_settings({PREVIOUS_KEY: current.name, ACTIVATED_KEY: now_iso()}, generation=previous.name)
    log.info("rolled back", extra={"from": current.name, "to": previous.name})
    return Rollback(current.name, previous.name, previous.spec.model)


def gc(store: VectorStore, keep: int) -> list[str]:
    """Drop all but the newest ``keep`` inactive generations. Never the active one, never a re-embed in progress."""
    if keep < 0:
        raise ConfigError(f"--keep must be >= 0, got {keep}")
    info = store.info()
    inactive = []
    for g in info.generations:
        st = ReembedState.from_generation(g)
        if g.active or (st is not None and st.status == "building"):
            continue
        inactive.append(g)
    inactive.sort(key=lambda g: g.name, reverse=True)  # names carry zero-padded numbers: newest first
    dropped = []
    for g in inactive[keep:]:
        store.drop_generation(g.name)
        dropped.append(g.name)
    return dropped


# --------------------------------------------------------------------------------------------------------------
# the promotion gate through `dpr eval` (services.evaluation)
# --------------------------------------------------------------------------------------------------------------


def eval_scorer(
    settings: Any, data: Path, *, split: str = "test", metric: str = "ndcg@10", max_queries: int | None = None
) -> Scorer:
    """``dpr eval`` on the dev data (BEIR folder or SQuAD JSON): the model's ``metric`` through the real store
    (ingest the dev corpus with the towers, ask every dev question). The generation is not used: the gate
    compares models on the same dev data, as ``dpr eval`` does."""
    from encoders.evaluate import evaluate_systems
    from services import readers as d
    from services.evaluation import store_retriever

    if not data.exists():
        raise ConfigError(f"gate data {data} does not exist; give a BEIR folder or a SQuAD JSON file")
    dataset = d.load_beir(data, split) if data.is_dir() else d.load_squad(data, split)  # type: ignore[arg-type]
    if max_queries is not None:
        dataset = dataset.subset(sorted(dataset.queries)[:max_queries])

    def score(store: VectorStore, generation: str, towers: DualEncoder) -> float:
        report = evaluate_systems(dataset, {"candidate": store_retriever(towers, settings=settings)}, k=100)
        value = report.results[0].metrics.get(metric)
        if value is None:
            raise ConfigError(f"the evaluation has no metric {metric!r}; known: {sorted(report.results[0].metrics)}")
        return float(value)

    return score
