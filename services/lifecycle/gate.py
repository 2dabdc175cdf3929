"""The promotion gate: promote a re-embed only if its model scores at least as well as the active one on dev data.

``promotion_gate`` is the one wiring that `dpr reembed --gate` (in-process) and the finalize task both use; the
score is `dpr eval`'s store-backed evaluation (``services.lab.evaluation.store_retriever``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from encoders.towers import DualEncoder
from services.core.errors import CollectionNotFound, ConfigError
from services.core.fsutil import now_iso
from services.core.settings import Settings
from services.lifecycle.state import ReembedState
from services.store.protocol import VectorStore

log = logging.getLogger(__name__)

# Scores one generation with the towers that built it, on the gate's dev data (higher is better).
Scorer = Callable[[VectorStore, str, DualEncoder], float]
Gate = Callable[[], "GateDecision"]


@dataclass(frozen=True)
class GateDecision:
    promote: bool
    candidate: float
    active: float
    metric: str
    data: str

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "decided": now_iso()}


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


def promotion_gate(
    settings: Settings,
    store: VectorStore,
    state: ReembedState,
    towers: DualEncoder,
    data: Path | str | None,
    towers_for: Callable[[str], DualEncoder],
) -> Gate | None:
    """The gate ``finalize`` runs for a re-embed asked with ``--gate data`` (None without): `dpr eval` of the
    active generation's model against ``towers`` on ``data``."""
    if not data:
        return None
    scorer = eval_scorer(settings, Path(data))
    active = store.active()
    if active is None:
        raise CollectionNotFound(f"collection {store.alias!r} has no active generation to compare the candidate with")
    old = towers_for(active.spec.model)

    def gate() -> GateDecision:
        return run_gate(store, state, towers, old, scorer, data=str(data))

    return gate


def eval_scorer(settings: Any, data: Path, *, split: str = "test", metric: str = "ndcg@10") -> Scorer:
    """``dpr eval`` on the dev data (BEIR folder or SQuAD JSON): the model's ``metric`` through the real store
    (ingest the dev corpus with the towers, ask every dev question). The generation is not used: the gate
    compares models on the same dev data, as ``dpr eval`` does."""
    from services.lab.evaluation.retrieval import evaluate_systems
    from services.lab.evaluation.store_retriever import store_retriever

    if not data.exists():
        raise ConfigError(f"gate data {data} does not exist; give a BEIR folder or a SQuAD JSON file")
    from services.readers import load_dataset

    dataset = load_dataset(data, split)

    def score(store: VectorStore, generation: str, towers: DualEncoder) -> float:
        report = evaluate_systems(dataset, {"candidate": store_retriever(towers, settings=settings)}, k=100)
        value = report.results[0].metrics.get(metric)
        if value is None:
            raise ConfigError(f"the evaluation has no metric {metric!r}; known: {sorted(report.results[0].metrics)}")
        return float(value)

    return score
