"""Plan a re-embed and copy: a new generation built from the stored passage text (no source files needed).

Resumability: the copy skips every source passage whose point already sits in the target with the new
fingerprint, the same text hash and the same doc hash; point ids are uuid5(doc id, chunk), so a redelivered or
repeated batch overwrites and never duplicates. Ctrl-C, a SIGKILLed worker or a crash lose at most the batches in
flight; running ``dpr reembed`` again continues.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace

from encoders.towers import DualEncoder
from services.core.errors import CollectionNotFound, ConfigError
from services.core.fsutil import now_iso
from services.ingest.chunking import Chunk
from services.ingest.encoding import passage_points
from services.lifecycle.state import (
    LIFECYCLE_KEYS,
    MODEL_NAME_KEY,
    STATE_KEY,
    ReembedError,
    ReembedState,
    save_state,
)
from services.store.points import CollectionSpec, GenerationInfo, Passage, PassagePoint
from services.store.protocol import VectorStore
from services.store.sparse import SparseEncoder

log = logging.getLogger(__name__)

# point id -> (model, text hash, doc hash)
Index = dict[str, tuple[str, str, str]]


def plan(
    store: VectorStore, towers: DualEncoder, *, model_name: str, lock_token: str = "", force: bool = False,
    owned_here: bool = False,
) -> ReembedState | None:
    """The re-embed to run: resume the one in progress for this model, or create its target generation.

    None when the active generation is already embedded by ``towers`` (nothing to do) unless ``force``.
    ``owned_here``: record this process (pid, host) as the builder (an in-process re-embed), so that `dpr status`
    can tell a running build from one a kill left behind. Caller holds the re-embed lock.
    """
    info = store.info(counts=False)
    if info.active is None:
        raise CollectionNotFound(f"collection {store.alias!r} does not exist yet; ingest something first")
    source = info.active
    resumed = _resume_or_retire(store, info.generations, source.name, towers.fingerprint, lock_token)
    if resumed is not None:
        if owned_here or resumed.pid:  # this process builds it now, or workers do (no pid)
            resumed = resumed.owned_here() if owned_here else replace(resumed, pid=0, host="")
            save_state(store, resumed)
        return resumed
    if source.spec.model == towers.fingerprint and not force:
        return None
    return _create_target(store, source, towers, model_name, lock_token, owned_here)


def _resume_or_retire(
    store: VectorStore, generations: Sequence[GenerationInfo], source: str, model: str, lock_token: str
) -> ReembedState | None:
    """The building re-embed of ``source`` with ``model`` if any; every other building record is closed."""
    for g in generations:
        st = ReembedState.from_generation(g)
        if st is None or st.status != "building":
            continue
        if g.active:  # activated but the record was not updated (crash right after the swap)
            save_state(store, replace(st, status="active", finished=st.finished or now_iso()))
            continue
        if st.source == source and st.model == model:
            log.info("resuming re-embed", extra={"target": g.name, "source": source})
            if lock_token and lock_token != st.lock_token:
                st = replace(st, lock_token=lock_token)
                save_state(store, st)
            return st
        log.warning("abandoning a stale re-embed", extra={"target": g.name, "source": st.source})
        save_state(store, replace(st, status="abandoned", finished=now_iso(), error="superseded"))
    return None


def _create_target(
    store: VectorStore, source: GenerationInfo, towers: DualEncoder, model_name: str, lock_token: str,
    owned_here: bool = False,
) -> ReembedState:
    if towers.dim < 1:
        raise ConfigError("the new towers report no dimension")
    state = ReembedState(
        source=source.name, target="", model=towers.fingerprint, model_name=model_name, started=now_iso(),
        lock_token=lock_token,
    )
    if owned_here:
        state = state.owned_here()
    kept = {k: v for k, v in source.spec.settings.items() if k not in LIFECYCLE_KEYS}
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


def index_of(pages: Iterable[list[Passage]]) -> tuple[Index, dict[str, Passage]]:
    """Every point of a generation's pages: its (model, text hash, doc hash), and its passage."""
    index: Index = {}
    passages: dict[str, Passage] = {}
    for batch in pages:
        for p in batch:
            index[p.id] = (p.model, p.text_hash, p.doc_hash)
            passages[p.id] = p
    return index, passages


def is_done(target: Index, model: str, p: Passage) -> bool:
    return target.get(p.id) == (model, p.text_hash, p.doc_hash)


def pending_batches(store: VectorStore, state: ReembedState, batch_size: int) -> Iterator[list[Passage]]:
    """Source passages, in batches, that the target does not hold yet with the new model (resumability).

    The source is read from a copy of its files taken beside its holder (``VectorStore.scan``), so `dpr serve`,
    answering from it, keeps it. Read under the lease it
    was handed over and loaded again by both sides once per page (the first measured 100k re-embed beside `dpr
    serve` spent 14 minutes sending its batches that way), then once per 2 s slice (questions waited up to 25 s)."""
    target, _ = index_of(store.scroll(1024, generation=state.target))
    batch: list[Passage] = []
    for page in store.scan(batch_size, generation=state.source):
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
    """The passage tower reads exactly what ingest gave it (title › heading path + text), encoded as ingest encodes
    (``passage_points``); payloads are kept, model replaced."""
    texts = [
        Chunk(index=p.chunk_index, text=p.text, title=p.title, heading=p.heading).encoder_text for p in passages
    ]
    return passage_points([replace(p, model=towers.fingerprint) for p in passages], texts, None, towers=towers,
                          sparse=sparse, batch_size=batch_size)


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
    return write_points(store, state, embed_passages(passages, towers, sparse, encode_batch_size))


def write_points(store: VectorStore, state: ReembedState, points: Sequence[PassagePoint]) -> int:
    """Upsert encoded ``points`` into the re-embed's target; how many."""
    if points:
        store.upsert(list(points), generation=state.target)
    return len(points)
