"""The search ef calibrated after each HNSW build (``services.store.calibrate``): the smallest ef of the ladder that
reaches the recall target against the exact scan, measured in the build's child on the generation's own vectors,
recorded with the build, used by queries that name no ef; an explicit ef wins; no graph, no calibration."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest
from test_edge_index import DIM, SPEC, unit_vectors

from services.store import Store
from services.store.calibrate import EF_LADDER, FUSED_LIMIT, Probe, calibrate, carry_over, describe, fuse, probes
from services.store.edge import index as edge_index
from services.store.edge.engine import EdgeEngine
from services.store.edge.search import DenseSearch
from services.store.points import DENSE, Passage, PassagePoint, SearchRequest, SparseVector

pytestmark = pytest.mark.unit


def ranked(ids: list[str]) -> list[tuple[str, float]]:
    return [(pid, 1.0 - n / 1000) for n, pid in enumerate(ids)]


def points(n: int, terms: tuple[int, ...] = ()) -> list[tuple[str, list[float], tuple[int, ...]]]:
    return [(f"p{i}", [float(i)], terms) for i in range(n)]


def test_calibrate_keeps_the_smallest_ef_that_reaches_the_target() -> None:
    sample = points(40)  # 20 probes: the midpoints of pairs

    def search(vector: list[float], limit: int, ef: int | None) -> list[tuple[str, float]]:
        truth = [f"n{j}" for j in range(limit)]
        return ranked(truth if ef is None or ef >= 192 else truth[:8] + [f"x{j}" for j in range(limit - 8)])  # 8/10

    cal = calibrate(sample, search, target=0.98, budget_s=60)
    assert (cal["ef"], cal["recall"], cal["fused_ef"], cal["fused_recall"]) == (192, 1.0, 192, 1.0)  # a branch too
    assert cal["reached"] and cal["sample"] == 20 and cal["fused_on"] == "dense"
    low = calibrate(sample, search, target=0.5, budget_s=60)
    assert (low["ef"], low["recall"]) == (EF_LADDER[0], 0.8)


def test_a_rung_must_reach_the_target_with_a_standard_error_to_spare() -> None:
    """Below ef 384 one probe in five loses its 10th neighbour: recall 0.98 on 20 probes (200 places), exactly the
    target, whose standard error (0.0099) it does not clear; 384 finds all. With 0.97 the lower rung clears it."""

    def search(vector: list[float], limit: int, ef: int | None) -> list[tuple[str, float]]:
        truth = [f"n{j}" for j in range(limit)]
        short = ef is not None and ef < 384 and round(vector[0] * 2) % 5 == 1  # midpoints of (2i, 2i+1): i = 0, 5..
        return ranked(truth[:9] + [f"x{j}" for j in range(limit - 9)] if short else truth)

    cal = calibrate(points(40), search, target=0.98, budget_s=60)
    assert (cal["ef"], cal["recall"], cal["reached"]) == (384, 1.0, True)
    assert calibrate(points(40), search, target=0.97, budget_s=60)["ef"] == EF_LADDER[0]


def test_a_hybrids_branch_is_held_to_the_fused_top_10_not_the_dense_one() -> None:
    """The graph misses the dense 9th and 10th below ef 384: a dense query needs 384; a hybrid, whose top 10 the
    keywords' own passages share, keeps its answers at the branch's first rung. Without keywords (no BM25 vectors)
    the branch is held to the dense top 10 as before."""

    def search(vector: list[float], limit: int, ef: int | None) -> list[tuple[str, float]]:
        truth = [f"n{j}" for j in range(limit)]
        if ef is None:
            time.sleep(0.002)  # the scan: slower than the graph, which is kept
        return ranked(truth if ef is None or ef >= 384 else truth[:8] + [f"x{j}" for j in range(limit - 8)])

    asked: list[list[int]] = []

    def keywords(terms: list[int], limit: int) -> list[tuple[str, float]]:
        asked.append(terms)
        return ranked([f"k{j}" for j in range(limit)])

    cal = calibrate(points(40, (5, 6, 7)), search, 0.98, 60, keywords)
    assert (cal["ef"], cal["fused_ef"], cal["fused_recall"], cal["fused_on"]) == (384, FUSED_LIMIT, 1.0, "hybrid")
    assert asked and all(terms == [5, 6, 7] for terms in asked)  # both sources' terms, once each
    dense_only = calibrate(points(40), search, 0.98, 60, keywords)  # no terms: no BM25 branch to fuse
    assert (dense_only["fused_ef"], dense_only["fused_on"]) == (384, "dense")
    said = describe({"hnsw_segments": 1, "calibration": cal}, {})
    assert said["hybrid_ef"] == FUSED_LIMIT and said["hybrid_reason"].startswith("calibrated: the hybrid's top 10")
    assert "keywords" in said["hybrid_reason"] and "keywords" not in said["dense_reason"]


def test_fuse_is_the_stores_linear_fusion_or_the_engines_rrf() -> None:
    dense, sparse = [("a", 0.9), ("b", 0.5), ("c", 0.1)], [("c", 9.0), ("d", 1.0)]
    assert fuse(dense, sparse, {"fusion": "linear", "linear_weight": 0.5}) == ["a", "c", "b", "d"]
    assert fuse(dense, sparse, {"fusion": "linear", "linear_weight": 1.0})[:3] == ["a", "b", "c"]
    assert fuse(dense, sparse, {"fusion": "rrf", "rrf_k": 60}) == ["c", "a", "b", "d"]  # c: 1/63 + 1/61


def test_probes_are_not_points_and_leave_their_sources_out() -> None:
    assert probes([("a", [1.0, 0.0], ()), ("b", [0.0, 1.0], ()), ("c", [1.0, 1.0], ())]) == [
        Probe({"a", "b"}, [0.5, 0.5], [])]
    many = [("a", [1.0], tuple(range(10))), ("b", [0.0], tuple(range(100, 110)))]
    terms = probes(many)[0].terms
    assert len(terms) == 8 and len([t for t in terms if t < 100]) == 4 and terms == probes(many)[0].terms


def test_calibrate_says_so_when_the_target_is_out_of_reach_or_the_budget_is_spent() -> None:
    sample = points(40)
    never = calibrate(sample, lambda v, limit, ef: ranked([f"n{j}" for j in range(limit)] if ef is None
                                                          else ["x"] * limit), target=0.9, budget_s=60)
    assert never["ef"] == EF_LADDER[-1] and never["recall"] == 0.0 and never["reached"] is False
    skipped = calibrate(sample[:5], lambda v, limit, ef: [], target=0.9, budget_s=60)
    assert "skipped" in skipped and "ef" not in skipped
    late = calibrate(sample, lambda v, limit, ef: ranked([f"n{j}" for j in range(limit)]), target=0.9, budget_s=0)
    assert {"skipped", "fused_skipped"} <= set(late) and "ef" not in late and late["reached"] is False
    said = describe({"hnsw_segments": 1, "calibration": late}, {})
    assert said["dense_ef"] is None and said["dense_reason"] == "engine default (out of time before an ef was measured)"


def test_what_a_build_had_no_time_to_measure_is_kept_from_the_last_calibration(tmp_path: Path) -> None:
    """A small build on a large generation cannot afford the exact scans: it keeps the last build's ef (was: the
    engine's default, recall@10 0.86 at 1M), and status says where the figure comes from."""
    measured = {"target": 0.98, "sample": 200, "ef": 2048, "recall": 0.986, "fused_ef": 1536, "fused_recall": 0.984,
                "fused_on": "hybrid", "reached": True}
    late = calibrate(points(40), lambda v, limit, ef: ranked([f"n{j}" for j in range(limit)]), target=0.98,
                     budget_s=0)
    kept = carry_over(late, measured, 1_000_000)
    assert (kept["ef"], kept["recall"], kept["fused_ef"], kept["fused_recall"]) == (2048, 0.986, 1536, 0.984)
    assert kept["carried"] == kept["fused_carried"] == 1_000_000 and kept["sample"] == late["sample"]
    assert carry_over(kept, {"ef": 64, "fused_ef": 128}, 1_040_000)["carried"] == 1_000_000  # where it was measured
    fresh = calibrate(points(40), lambda v, limit, ef: ranked([f"n{j}" for j in range(limit)]), target=0.9,
                      budget_s=60)
    assert carry_over(fresh, measured, 1_000_000) == fresh  # measured now: nothing carried
    assert carry_over(late, {}, 5) == late  # nothing to keep: the engine's default, as before
    said = describe({"hnsw_segments": 1, "calibration": kept}, {})
    assert said["dense_ef"] == 2048 and "measured at the build of 1,000,000 points and kept" in said["dense_reason"]
    assert said["hybrid_ef"] == 1536 and "out of time before an ef was measured" in said["hybrid_reason"]
    # through the index record of an edge generation: the build's own record keeps the last one's ef
    generation = tmp_path / "g"
    generation.mkdir()
    edge_index.record_build(generation, 1_000_000, measured)
    edge_index.record_build(generation, 1_020_000, late)
    record = edge_index.index_record(generation)
    assert record["points"] == 1_020_000 and record["calibration"]["ef"] == 2048
    assert record["calibration"]["carried"] == 1_000_000


def test_a_build_calibrates_the_ef_and_queries_use_it_unless_one_is_set(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    engine = EdgeEngine(tmp_path, "c", idle_release=5, index_threshold=1000, recall_target=0.99)
    store = Store(engine)
    store.ensure_collection(dataclasses.replace(SPEC, sparse=True))  # BM25 vectors: the hybrid's own ladder
    corpus = unit_vectors(3000, seed=1)
    store.upsert([PassagePoint(Passage(doc_id=f"d{i}", chunk_index=0, text=f"p {i}"), dense=v.tolist(),
                               sparse=SparseVector([i % 50, 50 + i % 7, 60 + i % 11], [1.0, 1.0, 1.0]))
                  for i, v in enumerate(corpus)])
    assert engine.index_info("c__g0001")["calibration"] == {}  # no graph yet: exact scan, nothing to calibrate
    assert store.optimize() is True
    cal = engine.index_info("c__g0001")["calibration"]
    assert {"sample", "seconds", "build_seconds", "target"} <= set(cal) and cal["target"] == 0.99
    # within a tenth of a small build's time the ladder may not finish: each kind of query has its ef or says why
    assert ("ef" in cal) != ("skipped" in cal) and ("fused_ef" in cal) != ("fused_skipped" in cal)
    assert cal.get("ef", EF_LADDER[0]) in EF_LADDER and cal.get("fused_ef", FUSED_LIMIT) >= FUSED_LIMIT
    assert cal.get("recall", 0.0) >= 0.99 or not cal["reached"]
    assert "skipped" in cal or cal["fused_on"] == "hybrid"  # measured through the fusion, with the probes' keywords

    asked: list[Any] = []
    params_of = DenseSearch.params
    monkeypatch.setattr(DenseSearch, "params", lambda self, g, b, fused=False: asked.append(
        params_of(self, g, b, fused)) or asked[-1])
    query = unit_vectors(1, seed=2)[0].tolist()
    assert len(store.search(SearchRequest(dense=query, k=10))) == 10
    sent = asked[-1]
    if cal.get("exact"):  # the scan timed faster than the graph (3,000 points)
        assert sent.exact and sent.hnsw_ef is None
    else:
        assert (None if sent is None else sent.hnsw_ef) == cal.get("ef")  # no ef measured: the engine's
    explicit = EdgeEngine(tmp_path, "c", idle_release=5, index_threshold=1000,
                          search_params=edge_params(hnsw_ef=77))
    assert explicit.dense.params("c__g0001", (DENSE, query)).hnsw_ef == 77  # an explicit ef wins
    store.close()
    explicit.close()
    info = {"hnsw_segments": 1} | engine_index(tmp_path)
    said = describe(info, {"hnsw_ef": None, "hybrid_ef": 300})
    if cal.get("exact"):
        assert said["dense_ef"] == "exact" and said["dense_reason"].startswith("exact scan: faster")
    else:
        assert said["dense_ef"] == cal.get("ef")
        assert said["dense_reason"].startswith("calibrated: recall@10" if "ef" in cal else "engine default (out of")
    assert (said["hybrid_ef"], said["hybrid_reason"]) == (300, "set by DPR_EDGE__HYBRID_EF")
    assert describe({"hnsw_segments": 0, "index_threshold": 5000}, {})["search"] == "exact scan"


def edge_params(hnsw_ef: int) -> Any:
    from qdrant_edge import SearchParams

    return SearchParams(hnsw_ef=hnsw_ef)


def engine_index(root: Path) -> dict[str, Any]:
    return edge_index.index_record(root / "c" / "generations" / "c__g0001")


@pytest.mark.filterwarnings("ignore:Local mode performs exact")  # in-process engine: exact whatever the ef
def test_a_server_generation_is_calibrated_into_its_metadata_and_the_ef_is_sent() -> None:
    from qdrant_client import QdrantClient

    from services.core.store_settings import QdrantSettings
    from services.store.server.engine import ServerEngine

    engine = ServerEngine(QdrantClient(":memory:"), "c")
    store = Store(engine)
    store.ensure_collection(dataclasses.replace(SPEC, sparse=True))
    store.upsert([PassagePoint(Passage(doc_id=f"d{i}", chunk_index=0, text=f"p {i}"), dense=v.tolist(),
                               sparse=SparseVector([i % 50, 50 + i % 7], [1.0, 1.0]))
                  for i, v in enumerate(unit_vectors(300, seed=3))])
    generation = store.active().name  # type: ignore[union-attr]
    assert engine._search_params([0.0] * DIM, generation=generation) is None  # not calibrated: server defaults
    cal = engine.calibrations.measure(generation, store.active().spec)  # type: ignore[union-attr]
    assert (cal["ef"], cal["recall"], cal["points"]) == (EF_LADDER[0], 1.0, 300)  # exact engine: the first rung
    assert (cal["fused_ef"], cal["fused_recall"], cal["fused_on"]) == (FUSED_LIMIT, 1.0, "hybrid")  # and BM25
    reader = ServerEngine(engine.client, "c")  # another process reads it from the collection's metadata
    for fused, key, ef in ((False, "", cal["ef"]), (True, "fused_", FUSED_LIMIT)):
        sent = reader._search_params([0.0] * DIM, fused=fused, generation=generation)
        assert sent is not None
        # the in-process engine scans exactly at every ef: the scan may have timed faster than the "graph"
        assert (sent.exact, sent.hnsw_ef) == ((True, None) if cal.get(f"{key}exact") else (False, ef))
    assert reader.search_ef(generation)["dense_reason"].startswith(("calibrated", "exact scan: faster"))
    pinned = ServerEngine(engine.client, "c", QdrantSettings(hnsw_ef=64))
    assert pinned._search_params([0.0] * DIM, generation=generation).hnsw_ef == 64  # type: ignore[union-attr]


def test_a_graph_slower_than_the_scan_is_replaced_by_the_scan() -> None:
    sample = points(40)

    def search(vector: list[float], limit: int, ef: int | None) -> list[tuple[str, float]]:
        if ef is not None:
            time.sleep(0.002)  # the graph: slower than the (instant) scan at every ef
        return ranked([f"n{j}" for j in range(limit)])

    cal = calibrate(sample, search, target=0.98, budget_s=60)
    assert cal["exact"] and cal["fused_exact"] and cal["reached"]
    said = describe({"hnsw_segments": 1, "calibration": cal}, {})
    assert said["dense_ef"] == "exact" and said["dense_reason"].startswith("exact scan: faster than the graph")
    assert describe({"hnsw_segments": 1, "calibration": cal}, {"hnsw_ef": 64})["dense_ef"] == 64  # set: it wins


def test_a_graph_short_of_the_target_loses_to_a_scan_at_most_twice_its_time() -> None:
    sample = points(40)

    def search(vector: list[float], limit: int, ef: int | None) -> list[tuple[str, float]]:
        time.sleep(0.003 if ef is None else 0.002)  # the scan 1.5x the graph's time; the graph finds 8 of 10
        return ranked([f"n{j}" for j in range(limit)] if ef is None else [f"n{j}" for j in range(8)] + [
            f"x{j}" for j in range(limit - 8)])

    cal = calibrate(sample, search, target=0.98, budget_s=60)
    assert cal["exact"] and cal["ef"] == EF_LADDER[-1] and cal["recall"] == 0.8
