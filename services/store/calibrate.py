"""The search ef a generation needs, measured on its own vectors after each HNSW build (engine-neutral).

Probes made from a sample of the generation's vectors (the midpoint of each pair: not a point of the graph, as a
question is not) ask the exact scan for their 10 nearest neighbours (the two sources left out), then the HNSW graph
at the ef of ``EF_LADDER`` (bisected: recall rises with ef) for the smallest whose recall@10 against the scan
reaches the target (``DPR_EDGE__RECALL_TARGET``, default 0.98): that ef serves dense queries. A hybrid query's dense
branch fetches ``FUSED_LIMIT`` candidates (the engine searches with ef >= limit), so its ef is found the same way
with that limit. The whole measurement is held to ``CALIBRATION_SHARE`` of the build's own time (the probes shrink,
never below ``MIN_SAMPLE``); where the target is not reached (or the time runs out first) the largest ef tried is
kept and the record says so (``reached``: false); the first ef tried is the ladder's middle (128), above the
engines' default of 100. Where the graph at the chosen ef answers a probe slower than the exact scan did (a small
or structureless collection), the record says ``exact`` and queries scan exactly: full recall, less time; so
it does where the graph falls short of the target and the scan costs at most twice its time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

K = 10
SAMPLE = 400  # vectors: 200 probes
MIN_SAMPLE = 20
FUSED_LIMIT = 100  # a hybrid query's candidates per branch (services.query: max(100, k))
EF_LADDER = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)
CALIBRATION_SHARE = 0.10  # of the build's time
EXACT_SLACK = 0.5  # a graph short of the target loses to a scan that costs at most 2x its time per query
SERVER_BUDGET_S = 10.0  # a server builds its graphs itself: no build time to take a share of

# (vector, limit, ef or None for the exact scan) -> point ids, best first
Search = Callable[[list[float], int, "int | None"], list[str]]


def probes(sample: Sequence[tuple[str, list[float]]]) -> list[tuple[set[str], list[float]]]:
    """Questions that are not points of the graph (a stored vector finds itself and its own graph neighbours, an
    easier search than a question's): the midpoint of each pair of sampled vectors, its two sources left out of
    the answers."""
    return [({a, b}, [(x + y) / 2 for x, y in zip(u, v, strict=True)])
            for (a, u), (b, v) in zip(sample[0::2], sample[1::2], strict=False)]


def calibrate(sample: Sequence[tuple[str, list[float]]], search: Search, target: float, budget_s: float
              ) -> dict[str, Any]:
    """``{"target", "sample", "ef", "recall", "fused_ef", "fused_recall", "reached", "seconds"}`` for the graph
    ``search`` asks, on the ``probes`` of ``sample``; ``{"skipped": why, ...}`` when the budget does not buy
    ``MIN_SAMPLE`` exact scans."""
    started = time.perf_counter()
    deadline = started + budget_s
    truth: list[tuple[set[str], list[float], set[str]]] = []
    for skip, vector in probes(sample):
        if len(truth) >= MIN_SAMPLE and time.perf_counter() > started + budget_s / 3:
            break  # a third of the budget for the exact scans, the rest for the ladder
        truth.append((skip, vector, set(_top(search(vector, K + 2, None), skip))))
    out: dict[str, Any] = {"target": target, "sample": len(truth)}
    if len(truth) < MIN_SAMPLE:
        return out | {"skipped": f"fewer than {MIN_SAMPLE} probes", "seconds": _since(started)}
    exact_s = (time.perf_counter() - started) / len(truth)  # one exact scan
    took: dict[tuple[int, int], float] = {}  # (ef, limit) -> seconds per probe

    def recall(ef: int, limit: int) -> float | None:
        """Recall@10 at ``ef``; None when the budget ran out before every probe was asked."""
        found, t0 = 0, time.perf_counter()
        for skip, v, want in truth:
            if time.perf_counter() > deadline:
                return None
            found += len(want & set(_top(search(v, limit, ef), skip)))
        took[ef, limit] = (time.perf_counter() - t0) / len(truth)
        return found / max(1, sum(len(want) for _, _, want in truth))

    reached = True
    for key, limit, ladder in (("", K + 2, EF_LADDER), ("fused_", FUSED_LIMIT, _fused_ladder())):
        tried: dict[int, float] = {}
        lo, hi = 0, len(ladder) - 1
        while lo <= hi:  # bisection: recall rises with ef
            mid = (lo + hi) // 2
            got = recall(ladder[mid], limit)
            if got is None:
                break
            tried[ladder[mid]] = got
            lo, hi = (lo, mid - 1) if got >= target else (mid + 1, hi)
        if not tried:  # out of time before one ef was measured: that kind of query keeps the engine's default
            out[f"{key}skipped"], reached = "out of time before an ef was measured", False
            continue
        good = [ef for ef, got in tried.items() if got >= target]
        ef = min(good) if good else max(tried)  # out of reach (or of time): the largest ef tried, and say so
        out[f"{key}ef"], out[f"{key}recall"] = ef, round(tried[ef], 4)
        if took[ef, limit] > exact_s * (1 if good else EXACT_SLACK):  # the scan (recall 1) is faster, or the
            out[f"{key}exact"] = True  # graph cannot show the target and the scan costs little more
        else:
            reached = reached and bool(good)
    return out | {"reached": reached, "seconds": _since(started), "exact_ms": round(exact_s * 1e3, 3),
                  **{f"ef{ef}_ms": round(t * 1e3, 3) for (ef, limit), t in took.items() if limit == K + 2}}


def _top(ids: list[str], skip: set[str]) -> list[str]:
    return [i for i in ids if i not in skip][:K]


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
        elif cal.get(key.replace("ef", "exact")):
            out[f"{kind}_ef"], out[f"{kind}_reason"] = "exact", (
                f"exact scan: faster than the graph at ef {cal[key]} (recall@10 {cal.get(key.replace('ef', 'recall'))}"
                f" on {cal.get('sample')} probes, target {cal.get('target')}), or under twice its time where the graph "
                "fell short of the target")
        elif cal.get(key):
            out[f"{kind}_ef"] = cal[key]
            out[f"{kind}_reason"] = (f"calibrated: recall@10 {cal.get(key.replace('ef', 'recall'))} vs the exact scan "
                                     f"on {cal.get('sample')} probes from its own vectors (target {cal.get('target')})")
        else:
            why = cal.get("skipped") or cal.get(key.replace("ef", "skipped")) or "not calibrated"
            out[f"{kind}_ef"], out[f"{kind}_reason"] = None, f"engine default ({why})"
    return out
