"""The search-ef calibration of a Qdrant server's generations (``services.store.calibrate`` on the server's own
points once it has indexed them): kept in the collection's metadata, so every process reads the same, and cached
here for ``TTL_S``. ``ServerEngine`` asks it at ``dpr optimize``, for `dpr status` and for each query's ef."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from qdrant_client import QdrantClient, models

from services.core.store_settings import QdrantSettings
from services.store.points import DENSE, SPARSE, CollectionSpec

CALIBRATION_KEY = "dpr_calibration"  # the search-ef calibration in a collection's metadata
TTL_S = 60.0  # a serving process re-reads it this often (another process's `dpr optimize`)

Guard = Callable[[str, str], AbstractContextManager[None]]  # the engine's error translation: (what, collection)


def ef_params(options: QdrantSettings, ef: int) -> models.SearchParams:
    """A dense search at ``ef``, re-scored with the fp32 vectors where the collection is int8."""
    rescore = models.QuantizationSearchParams(rescore=True) if options.quantization != "none" else None
    return models.SearchParams(hnsw_ef=ef, quantization=rescore)


class Calibrations:
    """Each generation's calibration, through the engine's ``client`` and error ``guard``."""

    def __init__(self, client: QdrantClient, options: QdrantSettings, guard: Guard) -> None:
        self.client, self.options, self._guard = client, options, guard
        self._cached: dict[str, tuple[float, dict[str, Any]]] = {}  # generation -> (read at, calibration)

    def indexed(self, generation: str) -> tuple[int, int]:
        """(points, indexed vectors) of the generation."""
        with self._guard("read the collection", generation):
            info = self.client.get_collection(generation)
        return info.points_count or 0, info.indexed_vectors_count or 0

    def current(self, generation: str, fresh: bool = False) -> dict[str, Any]:
        """The generation's calibration (collection metadata), re-read at most every ``TTL_S``."""
        cached = self._cached.get(generation)
        if fresh or cached is None or time.monotonic() - cached[0] > TTL_S:
            with self._guard("read the collection", generation):
                metadata = self.client.get_collection(generation).config.metadata or {}
            cached = (time.monotonic(), dict(metadata.get(CALIBRATION_KEY) or {}))
            self._cached[generation] = cached
        return cached[1]

    def due(self, generation: str) -> bool:
        """A generation whose indexed vectors were never calibrated, or grew 10x since."""
        points, indexed = self.indexed(generation)
        done = int(self.current(generation, fresh=True).get("points") or 0)
        return self.options.recall_target > 0 and indexed > 0 and (not done or points >= 10 * done)

    def measure(self, generation: str, spec: CollectionSpec) -> dict[str, Any]:
        """Calibrate the generation's dense ef (and a hybrid's dense branch) on a sample of its own points, each ef
        tried as queries send it (``ef_params``), and keep it in the collection's metadata."""
        from services.store.calibrate import SAMPLE, SERVER_BUDGET_S, Ranked, calibrate, carry_over
        from services.store.common import serving_mode

        with self._guard("read points to calibrate the search ef", generation):
            records, _ = self.client.scroll(generation, limit=SAMPLE, with_payload=False,
                                            with_vectors=[DENSE, SPARSE] if spec.sparse else [DENSE])
        sample = [(str(r.id), [float(x) for x in r.vector[DENSE]],  # type: ignore[union-attr,arg-type,index]
                   list(getattr(r.vector.get(SPARSE), "indices", None) or []))  # type: ignore[union-attr]
                  for r in records if isinstance(r.vector, dict)]

        def search(vector: list[float], limit: int, ef: int | None) -> Ranked:
            params = models.SearchParams(exact=True) if ef is None else ef_params(self.options, ef)
            with self._guard("search", generation):
                found = self.client.query_points(generation, query=vector, using=DENSE, search_params=params,
                                                 limit=limit, with_payload=False)
            return [(str(p.id), float(p.score)) for p in found.points]

        def keywords(terms: list[int], limit: int) -> Ranked:
            query = models.SparseVector(indices=terms, values=[1.0] * len(terms))
            with self._guard("search", generation):
                found = self.client.query_points(generation, query=query, using=SPARSE, limit=limit,
                                                 with_payload=False)
            return [(str(p.id), float(p.score)) for p in found.points]

        cal = calibrate(sample, search, self.options.recall_target, SERVER_BUDGET_S,
                        keywords if spec.sparse else None, serving_mode(spec).fusion if spec.sparse else None,
                        spec.distance != "euclid")
        cal = carry_over(cal, self.current(generation, fresh=True))  # what it had no time for: the last one's
        cal["points"] = self.indexed(generation)[0]
        with self._guard("update collection metadata", generation):
            self.client.update_collection(generation, metadata={CALIBRATION_KEY: cal})
        self._cached[generation] = (time.monotonic(), cal)
        return cal

    def describe(self, generation: str) -> dict[str, Any]:
        """What `dpr status` says of the generation's search ef (``calibrate.describe``)."""
        from services.store.calibrate import describe

        cal = self.current(generation)
        explicit = {"hnsw_ef": self.options.hnsw_ef, "hybrid_ef": self.options.hybrid_ef}
        return describe({"hnsw_segments": int(bool(cal) or self.indexed(generation)[1] > 0),
                         "index_threshold": None, "calibration": cal}, explicit)
