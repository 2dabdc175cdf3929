"""The index build's child process (``index.BuildChild`` starts it, ``python -c``): loads the shard's copy, builds
its HNSW graph (a first build written anew a segment at a time), calibrates the search ef on it, then replays the
build journal's writes onto it on request and closes it. Nothing here runs in the process that serves the shard.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from qdrant_edge import CountRequest

from services.store.edge.index import PARTS, segment_kinds

_PAGE = 1000  # points a page while ``split_copy`` writes them


def child_main() -> None:
    """The build process: ``argv`` = shard copy, spec JSON, indexing threshold (KB), levers JSON, journal, the
    builder's pid, the recall target, the memory budget (MB, 0: none). Builds (and calibrates the search ef on what
    it built), then answers ``replay`` and ``close`` on stdin (EOF: the builder gave up)."""
    from qdrant_edge import EdgeShard

    from services.store.edge import journal as edge_journal
    from services.store.edge.config import (
        EdgeLevers,
        budget_levers,
        build_segments,
        delete_operation,
        edge_config,
        fixed_levers,
        move_payload_indexes,
        record_levers,
        upsert_operation,
    )
    from services.store.points import CollectionSpec

    _die_with(int(sys.argv[6]))
    os.nice(10)  # the serving process's queries come first
    path, spec, kb = sys.argv[1], CollectionSpec.from_json(json.loads(sys.argv[2])), int(sys.argv[3])
    recorded, journal = json.loads(sys.argv[4]), Path(sys.argv[5])
    levers = EdgeLevers.from_json(recorded)
    shard = EdgeShard.load(path, edge_config(spec, indexing_threshold_kb=kb, levers=levers))
    points = shard.count(CountRequest(exact=True))
    budget_mb = int(sys.argv[8]) if len(sys.argv) > 8 else 0
    if budget_mb:
        chosen, memory = budget_levers(levers, points, spec.dim, budget_mb, fixed_levers(recorded))
        record_levers(Path(path).parent, chosen, memory)
        if chosen != levers:
            shard.close()
            levers = chosen
            shard = EdgeShard.load(path, edge_config(spec, indexing_threshold_kb=kb, levers=levers))
    started = time.perf_counter()
    parts = build_segments(points, kb, spec.dim, levers.segments)
    split = parts > 1 and "hnsw" not in segment_kinds(Path(path))  # a first build: all in one appendable segment
    if parts > 1:  # the optimizer's segment bounds for this many points
        config = edge_config(spec, indexing_threshold_kb=kb, levers=levers, points=points)
        if split:  # the open copy is only read, then replaced: no reload
            shard = split_copy(shard, Path(path), config, levers, points, parts)
        else:
            shard.close()
            shard = EdgeShard.load(path, config)
    moved = move_payload_indexes(shard, levers)  # one made before they followed payload_on_disk: once
    changed = shard.optimize() or bool(moved) or split
    shard.flush()
    target = float(sys.argv[7]) if len(sys.argv) > 7 else 0.0
    calibration = (calibrate_built(shard, Path(path), levers, target, time.perf_counter() - started, spec) if changed
                   else None)
    print("built", int(changed), points, *([json.dumps(calibration, separators=(",", ":"))] if calibration else []),
          flush=True)
    offset = 0
    for line in sys.stdin:
        if line.strip() == "close":
            shard.flush()
            shard.close()
            print("closed", flush=True)
            return
        try:
            records, offset = edge_journal.read(journal, offset)
        except edge_journal.JournalBroken as e:
            print("broken", e, flush=True)
            continue
        for operation, argument in records:
            shard.update(upsert_operation(argument) if operation == "upsert" else delete_operation(argument))
        print("replayed", len(records), shard.count(CountRequest(exact=True)), flush=True)
    shard.close()


def split_copy(shard: Any, path: Path, config: Any, levers: Any, points: int, parts: int) -> Any:
    """``parts`` segments (``build_segments``) of the copy's ``points`` at ``path``: qdrant-edge writes into one
    appendable segment and its optimizer never splits one, so the points are written anew into a fresh shard
    (``PARTS``, with the same payload indexes), its optimizer run after each even share (which builds that share's
    graph and opens the next segment), and the fresh shard takes the copy's place. Returns it, open; ``shard`` is
    closed."""
    from qdrant_edge import EdgeShard, Point, ScrollRequest, UpdateOperation

    from services.store.edge.config import payload_indexes

    fresh = path.with_name(PARTS)
    shutil.rmtree(fresh, ignore_errors=True)
    out = EdgeShard.create(str(fresh), config)
    for creation in payload_indexes(levers):
        out.update(creation)
    share, written, offset, cut = -(-points // parts), 0, None, 1
    while True:
        records, offset = shard.scroll(ScrollRequest(offset=offset, limit=_PAGE, with_vector=True,
                                                     with_payload=True))
        out.update(UpdateOperation.upsert_points([Point(r.id, r.vector, r.payload) for r in records]))
        written += len(records)
        if written >= cut * share and offset is not None:
            out.optimize()  # this share's graph; the next points go to a new appendable segment
            cut += 1
        if offset is None:
            break
    out.optimize()
    out.flush()
    out.close()
    shard.close()
    shutil.rmtree(path)  # a crash from here leaves no copy and ``PARTS``: the next build starts again
    os.replace(fresh, path)
    return EdgeShard.load(str(path), config)


def calibrate_built(shard: Any, shard_dir: Path, levers: Any, target: float, build_s: float,
                    spec: Any = None) -> dict[str, Any] | None:
    """The search ef the built graph needs for ``target`` recall@10 (``services.store.calibrate``), measured on the
    shard's first ``SAMPLE`` points in id order (uuid5 ids: no relation to their content) within a tenth of the
    build's time, a hybrid's branch through ``spec``'s serving fusion where it has BM25 vectors; None without a
    graph (every search exact) or with no target."""
    from qdrant_edge import QuantizationSearchParams, ScrollRequest, SearchParams

    from services.store.calibrate import CALIBRATION_SHARE, SAMPLE, Ranked, calibrate
    from services.store.common import scored, serving_mode
    from services.store.edge.config import dense_params, query_request
    from services.store.points import DENSE, SPARSE, SparseVector

    if target <= 0 or "hnsw" not in segment_kinds(shard_dir):
        return None
    quantized = levers.quantization != "none"
    records, _ = shard.scroll(ScrollRequest(limit=SAMPLE, with_vector=True, with_payload=False))
    sample = [(str(r.id), list(r.vector[DENSE]), list(getattr(r.vector.get(SPARSE), "indices", None) or []))
              for r in records if isinstance(r.vector, dict) and DENSE in r.vector]

    def ask(branch: Any, limit: int, params: SearchParams | None = None) -> Ranked:
        return [(pid, score) for pid, score, _ in scored(shard.query(query_request(branch, limit, None, False,
                                                                                     params)))]

    def search(vector: list[float], limit: int, ef: int | None) -> Ranked:
        exact = SearchParams(exact=True, quantization=QuantizationSearchParams(ignore=True) if quantized else None)
        return ask((DENSE, vector), limit, exact if ef is None else dense_params(SearchParams(hnsw_ef=ef), quantized))

    def keywords(terms: list[int], limit: int) -> Ranked:
        return ask((SPARSE, SparseVector(terms, [1.0] * len(terms))), limit)

    hybrid = spec is not None and spec.sparse
    return calibrate(sample, search, target, CALIBRATION_SHARE * build_s, keywords if hybrid else None,
                     serving_mode(spec).fusion if hybrid else None,
                     spec is None or spec.distance != "euclid") | {"build_seconds": round(build_s, 3)}


def _die_with(builder: int) -> None:
    """End when the builder does (Linux): a builder killed mid-build must not leave a child writing into
    ``shard.build`` while the next build copies the shard there anew."""
    if sys.platform == "linux":
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != builder:
        sys.exit(1)  # it died before the line above
