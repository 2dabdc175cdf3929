"""The search ef a generation needs, measured on its own vectors after each HNSW build (engine-neutral).

Probes made from a sample of the generation's vectors (the midpoint of each pair: not a point of the graph, as a
question is not) ask the exact scan for their nearest neighbours (the two sources left out), then the HNSW graph
at the ef of ``EF_LADDER`` (bisected: recall rises with ef) for the smallest whose recall@10 against the scan
reaches the target (``DPR_EDGE__RECALL_TARGET``, default 0.98) with one standard error of the sample to spare: that
ef serves dense queries.

A hybrid query's dense branch hands the fusion its top ``FUSED_LIMIT`` (the engine searches with ef >= limit); what
it must keep is the *hybrid's* top 10, not the dense one: a passage the branch misses near the dense cut rarely
survives the fusion. So where the generation has BM25 vectors each probe also gets a few keywords, ``KEYWORDS``
terms drawn from each of its two sources' own, and the branch's ef is the smallest whose fused top 10 (the
collection's serving fusion: the label-free linear one unless `dpr tune-hybrid` chose another) reaches the target
against the same fusion over the exact scan. Without BM25 vectors the branch is held to the dense top 10 at its
limit (``fused_on``: ``dense``).

The whole measurement is held to ``CALIBRATION_SHARE`` of the build's own time (the probes shrink, never below
``MIN_SAMPLE``); where the target is not reached (or the time runs out first) the largest ef tried is kept and the
record says so (``reached``: false); the first ef tried is the ladder's middle (512), the lowest 128, above the
engines' default of 100. Where the graph at the chosen ef answers a probe slower than the exact scan did (a small or
structureless collection), the record says ``exact`` and queries scan exactly: full recall, less time; so it does
where the graph falls short of the target and the scan costs at most twice its time.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from services.store.common import LABEL_FREE_FUSION, linear_fusion

K = 10
SAMPLE = 400  # vectors: 200 probes
MIN_SAMPLE = 20
FUSED_LIMIT = 100  # a hybrid query's candidates per branch (services.query: max(100, k))
KEYWORDS = 4  # BM25 terms a probe takes from each of its two sources
# From 128, just above the engines' default of 100: lower rungs save under a millisecond, less than a small sample's
# error risks (10,000 passages: ef 64 reached 0.9875 on 56 probes, 0.978 on real questions; scale.md)
EF_LADDER = (128, 160, 192, 256, 320, 384, 512, 640, 768, 1024, 1280, 1536, 1792, 2048)
CALIBRATION_SHARE = 0.10  # of the build's time
EXACT_SLACK = 0.5  # a graph short of the target loses to a scan that costs at most 2x its time per query
SERVER_BUDGET_S = 10.0  # a server builds its graphs itself: no build time to take a share of

Ranked = list[tuple[str, float]]  # (point id, score), best first
# (vector, limit, ef or None for the exact scan) -> the dense branch's answer
Search = Callable[[list[float], int, "int | None"], Ranked]
# (BM25 term indexes, limit) -> the sparse branch's answer (each term weighted 1, as a question's once)
Keywords = Callable[[list[int], int], Ranked]
# a sampled point: (id, dense vector, its BM25 term indexes: empty where it has none)
Sampled = tuple[str, list[float], Sequence[int]]


@dataclass(frozen=True)
class Probe:
    skip: set[str]  # its two sources, left out of every answer
    vector: list[float]
    terms: list[int]


def probes(sample: Sequence[Sampled]) -> list[Probe]:
    """Questions that are not points of the graph (a stored vector finds itself and its own graph neighbours, an
    easier search than a question's): the midpoint of each pair of sampled vectors, with ``KEYWORDS`` of each
    source's BM25 terms (drawn by a generator seeded with the pair's place: the same sample gives the same
    probes)."""
    out = []
    for n, ((a, u, ta), (b, v, tb)) in enumerate(zip(sample[0::2], sample[1::2], strict=False)):
        pick = random.Random(n)
        terms = sorted({t for source in (ta, tb) for t in pick.sample(sorted(source), min(KEYWORDS, len(source)))})
        out.append(Probe({a, b}, [(x + y) / 2 for x, y in zip(u, v, strict=True)], terms))
    return out


def fuse(dense: Ranked, sparse: Ranked, fusion: Mapping[str, Any], higher_is_better: bool = True) -> list[str]:
    """The top ``K`` ids of ``fusion`` (``services.store.common.ServingMode.fusion``) over the two branches: linear
    as the store fuses; RRF as the engine does (1 / (k + rank), ranks from 1)."""
    if fusion.get("fusion", "rrf") == "linear":
        return [pid for pid, _, _ in linear_fusion([(i, s, {}) for i, s in dense], [(i, s, {}) for i, s in sparse],
                                                   float(fusion.get("linear_weight", 0.5)), K, higher_is_better)]
    k, scores = int(fusion.get("rrf_k", 60)), dict[str, float]()
    for branch in (dense, sparse):
        for rank, (pid, _) in enumerate(branch, 1):
            scores[pid] = scores.get(pid, 0.0) + 1.0 / (k + rank)
    return [pid for pid, _ in sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:K]]


def calibrate(sample: Sequence[Sampled], search: Search, target: float, budget_s: float,
              keywords: Keywords | None = None, fusion: Mapping[str, Any] | None = None,
              higher_is_better: bool = True) -> dict[str, Any]:
    """``{"target", "sample", "ef", "recall", "fused_ef", "fused_recall", "fused_on", "reached", "seconds"}`` for
    the graph ``search`` asks, on the ``probes`` of ``sample``; a hybrid's branch is measured through ``fusion``
    (default: the label-free one) with ``keywords`` asking the BM25 branch, where both are given and the probes
    have terms. ``{"skipped": why, ...}`` when the budget does not buy ``MIN_SAMPLE`` exact scans."""
    started = time.perf_counter()
    deadline = started + budget_s
    fusion = fusion or LABEL_FREE_FUSION
    truth: list[tuple[Probe, set[str], Ranked, set[str]]] = []  # probe, dense top 10, BM25 answer, fused top 10
    for probe in probes(sample):
        if len(truth) >= MIN_SAMPLE and time.perf_counter() > started + budget_s / 3:
            break  # a third of the budget for the exact scans, the rest for the ladder
        exact = _top(search(probe.vector, FUSED_LIMIT + 2, None), probe.skip, FUSED_LIMIT)
        sparse = _top(keywords(probe.terms, FUSED_LIMIT + 2), probe.skip, FUSED_LIMIT) if (
            keywords and probe.terms) else []
        truth.append((probe, {i for i, _ in exact[:K]}, sparse, set(fuse(exact, sparse, fusion, higher_is_better))))
    out: dict[str, Any] = {"target": target, "sample": len(truth)}
    if len(truth) < MIN_SAMPLE:
        return out | {"skipped": f"fewer than {MIN_SAMPLE} probes", "seconds": _since(started)}
    hybrid = keywords is not None and any(sparse for _, _, sparse, _ in truth)
    exact_s = (time.perf_counter() - started) / len(truth)  # one exact scan (and a BM25 one)
    took: dict[tuple[int, int], float] = {}  # (ef, limit) -> seconds per probe

    def recall(ef: int, limit: int, fused: bool) -> float | None:
        """Recall@10 at ``ef`` (``fused``: of the fused top 10); None when the budget ran out before every probe
        was asked."""
        found = wanted = 0
        t0 = time.perf_counter()
        for probe, dense_top, sparse, fused_top in truth:
            if time.perf_counter() > deadline:
                return None
            got = _top(search(probe.vector, limit, ef), probe.skip, FUSED_LIMIT)
            want, have = ((fused_top, set(fuse(got, sparse, fusion, higher_is_better))) if fused
                          else (dense_top, {i for i, _ in got[:K]}))
            found, wanted = found + len(want & have), wanted + len(want)
        took[ef, limit] = (time.perf_counter() - t0) / len(truth)
        return found / max(1, wanted)

    reached = True
    for key, limit, ladder in (("", K + 2, EF_LADDER), ("fused_", FUSED_LIMIT + 2, _fused_ladder())):
        fused = hybrid and key == "fused_"
        places = sum(len(fused_top if fused else dense_top) for _, dense_top, _, fused_top in truth)
        tried: dict[int, float] = {}
        lo, hi = 0, len(ladder) - 1
        while lo <= hi:  # bisection: recall rises with ef
            mid = (lo + hi) // 2
            got = recall(ladder[mid], limit, fused)
            if got is None:
                break
            tried[ladder[mid]] = got
            lo, hi = (lo, mid - 1) if _clears(got, target, places) else (mid + 1, hi)
        if not tried:  # out of time before one ef was measured: that kind of query keeps the engine's default
            out[f"{key}skipped"], reached = "out of time before an ef was measured", False
            continue
        good = [ef for ef, got in tried.items() if _clears(got, target, places)]
        ef = min(good) if good else max(tried)  # out of reach (or of time): the largest ef tried, and say so
        out[f"{key}ef"], out[f"{key}recall"] = ef, round(tried[ef], 4)
        if took[ef, limit] > exact_s * (1 if good else EXACT_SLACK):  # the scan (recall 1) is faster, or the
            out[f"{key}exact"] = True  # graph cannot show the target and the scan costs little more
        else:
            reached = reached and bool(good)
    out["fused_on"] = "hybrid" if hybrid else "dense"
    return out | {"reached": reached, "seconds": _since(started), "exact_ms": round(exact_s * 1e3, 3),
                  **{f"ef{ef}_ms": round(t * 1e3, 3) for (ef, limit), t in took.items() if limit == K + 2}}


def _clears(recall: float, target: float, places: int) -> bool:
    """``recall``, measured on ``places`` top-10 places, reaches ``target`` with one standard error to spare: the
    probes are a sample, and a rung that only just reaches the target on them falls short on real questions as often
    as not (100k passages: 0.9815 on 81 probes, 0.978 on 100 real SciFact questions)."""
    return recall - math.sqrt(recall * (1 - recall) / max(1, places)) >= target


def _top(ranked: Ranked, skip: set[str], n: int) -> Ranked:
    return [hit for hit in ranked if hit[0] not in skip][:n]


def _fused_ladder() -> tuple[int, ...]:
    return (FUSED_LIMIT, *(e for e in EF_LADDER if e > FUSED_LIMIT))


def _since(started: float) -> float:
    return round(time.perf_counter() - started, 3)


def carry_over(new: dict[str, Any], previous: dict[str, Any], previous_points: int | None = None) -> dict[str, Any]:
    """``new`` with the ef of each kind of query it could not measure (out of time, or too few probes) taken from
    ``previous``, the calibration it replaces (made at ``previous_points``), and ``carried``: those points. A
    small build on a large generation buys too little time for even ``MIN_SAMPLE`` exact scans (1M passages: 3.7
    s of scans, 2.8 s of budget after a 28 s build of 20k new points); without this each such build dropped the
    generation to the engine's default ef (recall@10 0.86 at 1M) until a build long enough to measure again."""
    out = dict(new)
    for key in ("", "fused_"):
        if f"{key}ef" in out or not previous.get(f"{key}ef") or not (out.get("skipped") or out.get(f"{key}skipped")):
            continue
        out.update({f"{key}{name}": previous[f"{key}{name}"] for name in ("ef", "recall", "exact")
                    if f"{key}{name}" in previous})
        out[f"{key}carried"] = previous.get(f"{key}carried") or previous_points or previous.get("points") or 0
    return out


def describe(index: dict[str, Any], explicit: dict[str, int | None]) -> dict[str, Any]:
    """What `dpr status` says of a generation's search ef: the measured calibration, the HNSW graphs (segments, the
    engine searching them side by side), the ef each kind of query uses, and why (an explicit ``DPR_EDGE__HNSW_EF`` /
    ``HYBRID_EF`` wins; no graph: the exact scan)."""
    cal = index.get("calibration") or {}
    if not index.get("hnsw_segments"):
        threshold = index.get("index_threshold")
        return {"search": "exact scan", "reason": "no HNSW graph" + (f" (below the index threshold, {threshold:,} "
                                                                      "points)" if threshold else "")}
    out: dict[str, Any] = {"calibration": cal, "graphs": index["hnsw_segments"]}  # searched side by side
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
            what = ("the hybrid's top 10 " if kind == "hybrid" and cal.get("fused_on") == "hybrid" else "")
            carried = cal.get(key.replace("ef", "carried"))
            out[f"{kind}_reason"] = (f"calibrated: {what}recall@10 {cal.get(key.replace('ef', 'recall'))} vs the exact "
                                     f"scan on {'' if carried else str(cal.get('sample')) + ' '}probes from its own "
                                     f"vectors{' and keywords' if what else ''} (target {cal.get('target')})")
            if carried:
                why = cal.get("skipped") or cal.get(key.replace("ef", "skipped"))
                out[f"{kind}_reason"] += (f"; measured at the build of {carried:,} points and kept: the last build "
                                          f"had no time to measure ({why})")
        else:
            why = cal.get("skipped") or cal.get(key.replace("ef", "skipped")) or "not calibrated"
            out[f"{kind}_ef"], out[f"{kind}_reason"] = None, f"engine default ({why})"
    return out
