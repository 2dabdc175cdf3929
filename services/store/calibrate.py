"""The search ef a generation needs, measured on its own vectors after each HNSW build (engine-neutral).

A sample of the generation's vectors asks the exact scan for its 10 nearest neighbours (itself left out), then the
HNSW graph at the ef of ``EF_LADDER`` (bisected: recall rises with ef) for the smallest whose recall@10 against the
scan reaches the target (``DPR_EDGE__RECALL_TARGET``, default 0.98): that ef serves dense queries. A hybrid query's
dense branch fetches ``FUSED_LIMIT`` candidates (the engine searches with ef >= limit), so its ef is found the same
way with that limit. The whole measurement is held to ``CALIBRATION_SHARE`` of the build's own time (the sample
shrinks, never below ``MIN_SAMPLE``); where the target is not reached (or the time runs out first) the largest ef
tried is kept and the record says so (``reached``: false); the first ef tried is the ladder's middle (128), above
the engines' default of 100.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

K = 10
SAMPLE = 200
MIN_SAMPLE = 20
FUSED_LIMIT = 100  # a hybrid query's candidates per branch (services.query: max(100, k))
EF_LADDER = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)
CALIBRATION_SHARE = 0.10  # of the build's time
SERVER_BUDGET_S = 10.0  # a server builds its graphs itself: no build time to take a share of

# (vector, limit, ef or None for the exact scan) -> point ids, best first
Search = Callable[[list[float], int, "int | None"], list[str]]


def calibrate(sample: Sequence[tuple[str, list[float]]], search: Search, target: float, budget_s: float
              ) -> dict[str, Any]:
    """``{"target", "sample", "ef", "recall", "fused_ef", "fused_recall", "reached", "seconds"}`` for the graph
    ``search`` asks; ``{"skipped": why, ...}`` when the budget does not buy ``MIN_SAMPLE`` exact scans."""
    started = time.perf_counter()
    deadline = started + budget_s
    truth: list[tuple[str, list[float], set[str]]] = []
    for pid, vector in sample:
        if len(truth) >= MIN_SAMPLE and time.perf_counter() > started + budget_s / 2:
            break  # half the budget for the exact scans, half for the ladder
        exact = [i for i in search(vector, K + 1, None) if i != pid][:K]
        truth.append((pid, vector, set(exact)))
    out: dict[str, Any] = {"target": target, "sample": len(truth)}
    if len(truth) < MIN_SAMPLE:
        return out | {"skipped": f"fewer than {MIN_SAMPLE} vectors to sample", "seconds": _since(started)}

    def recall(ef: int, limit: int) -> float:
        found = sum(len(want & {i for i in search(v, limit, ef) if i != pid}) for pid, v, want in truth)
        return found / max(1, sum(len(want) for _, _, want in truth))

    reached = True
    for key, limit, ladder in (("", K + 1, EF_LADDER), ("fused_", FUSED_LIMIT, _fused_ladder())):
        tried: dict[int, float] = {}
        lo, hi = 0, len(ladder) - 1
        while lo <= hi and (not tried or time.perf_counter() <= deadline):  # bisection: recall rises with ef
            mid = (lo + hi) // 2
            tried[ladder[mid]] = recall(ladder[mid], limit)
            lo, hi = (lo, mid - 1) if tried[ladder[mid]] >= target else (mid + 1, hi)
        good = [ef for ef, got in tried.items() if got >= target]
        ef = min(good) if good else max(tried)  # out of reach (or of time): the largest ef tried, and say so
        out[f"{key}ef"], out[f"{key}recall"] = ef, round(tried[ef], 4)
        reached = reached and bool(good)
    return out | {"reached": reached, "seconds": _since(started)}


def _fused_ladder() -> tuple[int, ...]:
    return (FUSED_LIMIT, *(e for e in EF_LADDER if e > FUSED_LIMIT))


def _since(started: float) -> float:
    return round(time.perf_counter() - started, 3)


def describe(index: dict[str, Any], explicit: dict[str, int | None]) -> dict[str, Any]:
    """What `dpr status` says of a generation's search ef: the measured calibration, the ef each kind of query uses,
    and why (an explicit ``DPR_EDGE__HNSW_EF`` / ``HYBRID_EF`` wins; no graph: the exact scan)."""
    cal = index.get("calibration") or {}
    if not index.get("hnsw_segments"):
        threshold = index.get("index_threshold")
        return {"search": "exact scan", "reason": "no HNSW graph" + (f" (below the index threshold, {threshold:,} "
                                                                      "points)" if threshold else "")}
    out: dict[str, Any] = {"calibration": cal}
    for kind, setting, key in (("dense", "hnsw_ef", "ef"), ("hybrid", "hybrid_ef", "fused_ef")):
        value = explicit.get(setting) or (explicit.get("hnsw_ef") if kind == "hybrid" else None)
        if value:
            name = setting if explicit.get(setting) else "hnsw_ef"
            out[f"{kind}_ef"], out[f"{kind}_reason"] = value, f"set by DPR_EDGE__{name.upper()}"
        elif cal.get(key):
            out[f"{kind}_ef"] = cal[key]
            out[f"{kind}_reason"] = (f"calibrated: recall@10 {cal.get(key.replace('ef', 'recall'))} vs the exact scan "
                                     f"on {cal.get('sample')} of its vectors (target {cal.get('target')})")
        else:
            out[f"{kind}_ef"], out[f"{kind}_reason"] = None, cal.get("skipped") or "engine default (not calibrated)"
    return out
