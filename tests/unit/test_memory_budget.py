"""The memory budget (issue 56 item 3, docs/capacity.md "memory budget"): the embedded engine chooses int8 with
re-scoring and vectors on disk from the expected size of a generation's dense vectors and graph, when the generation
is created and at each HNSW build; levers the user set win; `dpr status`, /v1/status and the console say what was
chosen and why. The rule is checked on its own (``budget_levers``), then on real small collections: a budget of 1 MB
makes a build of 8,000 32-dim points go int8 with both copies on disk while queries keep the exact scan's answers."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from kit.fakes import FakeRuntime
from test_memory_levers import GEN, SPEC, dense_segments, exact_top10, points, top10, unit_vectors
from typer.testing import CliRunner

from entrypoints.api.app import create_app
from entrypoints.status import collection_status
from services.core.settings import Settings
from services.core.store_settings import EdgeSettings
from services.store import Store
from services.store.edge.config import (
    LEVERS_FILE,
    SPEED_COPY_POINTS,
    EdgeLevers,
    budget_levers,
    fixed_levers,
    machine_budget_mb,
    search_params_from,
)
from services.store.edge.engine import EdgeEngine

pytestmark = pytest.mark.unit

M = 2**20  # bytes a MB
SEARCH = search_params_from(EdgeSettings(hnsw_ef=512))  # int8: re-scored, oversampling 2 (dense_params' default)


# -- the rule ----------------------------------------------------------------------------------------------------


def test_the_rule_steps_from_ram_to_int8_on_disk_as_the_vectors_outgrow_the_budget() -> None:
    """1M 384-dim passages: fp32 1,465 MB + graph 244 MB (m 32, the default), the int8 copy 366 MB."""
    fits, why = budget_levers(EdgeLevers(), 1_000_000, 384, budget_mb=2048)
    assert (fits.quantization, fits.vectors_on_disk, fits.int8_on_disk) == ("none", False, False)
    assert why["choice"] == "fp32 vectors in RAM" and "within the budget of 2,048 MB" in why["reason"]
    assert (why["fp32_mb"], why["graph_mb"], why["set"]) == (1464.8, 244.1, [])
    over, why = budget_levers(EdgeLevers(), 1_000_000, 384, budget_mb=1024)
    assert (over.quantization, over.vectors_on_disk, over.int8_on_disk) == ("int8", True, False)
    assert why["choice"] == "int8 + re-scoring, fp32 vectors on disk"
    assert "over the budget of 1,024 MB, int8 copy 366 MB + graph within" in why["reason"]
    tight, why = budget_levers(EdgeLevers(), 1_000_000, 384, budget_mb=400)
    assert (tight.quantization, tight.vectors_on_disk, tight.int8_on_disk) == ("int8", True, True)
    assert why["choice"] == "int8 + re-scoring, int8 copy and fp32 vectors on disk" and "over too" in why["reason"]
    edge = 1_000_000 * 384 * 4 + 1_000_000 * 8 * 32  # fp32 + graph exactly at the budget: still in RAM
    assert budget_levers(EdgeLevers(), 1_000_000, 384, budget_mb=edge // M + 1)[0].quantization == "none"
    assert budget_levers(EdgeLevers(), 1_000_000, 384, budget_mb=edge // M)[0].quantization == "int8"
    m16 = budget_levers(EdgeLevers(hnsw_m=16), 1_000_000, 384, budget_mb=1600)[1]  # a sparser graph counts
    assert m16["graph_mb"] == 122.1 and m16["choice"] == "fp32 vectors in RAM"
    assert budget_levers(EdgeLevers(), 0, 384, budget_mb=1)[0] == EdgeLevers()  # a new collection: RAM


def test_a_large_generation_in_ram_gets_an_int8_copy_for_speed_where_it_fits() -> None:
    """From SPEED_COPY_POINTS up, fp32 vectors that stay in RAM get an int8 copy beside them (faster graph search
    and build) when fp32 + int8 + graph fit; below it, or where the copy would not fit, none."""
    fast, why = budget_levers(EdgeLevers(), 100_000, 384, budget_mb=1207)
    assert (fast.quantization, fast.vectors_on_disk, fast.int8_on_disk) == ("int8", False, False)
    assert why["choice"] == "int8 + re-scoring, fp32 vectors in RAM"
    assert why["reason"].endswith(f"an int8 copy (37 MB) beside them for speed (from {SPEED_COPY_POINTS:,} points)")
    small = budget_levers(EdgeLevers(), SPEED_COPY_POINTS - 1, 384, budget_mb=1207)[0]
    assert small.quantization == "none" and budget_levers(EdgeLevers(), SPEED_COPY_POINTS, 384, 1207)[0] == fast
    fp32_and_graph = 100_000 * (384 * 4 + 8 * 32)  # fits, but not with the copy: fp32 in RAM alone, as before
    assert budget_levers(EdgeLevers(), 100_000, 384, budget_mb=fp32_and_graph // M + 1)[0].quantization == "none"
    # the user's own levers still win
    assert budget_levers(EdgeLevers(), 100_000, 384, 1207, fixed=["quantization"])[0].quantization == "none"


def test_levers_the_user_set_win_and_are_named_as_the_reason() -> None:
    set_none, why = budget_levers(EdgeLevers(quantization="none"), 1_000_000, 384, 400, fixed=["quantization"])
    assert (set_none.quantization, set_none.vectors_on_disk, set_none.int8_on_disk) == ("none", True, False)
    assert why["choice"] == "fp32 vectors on disk" and why["set"] == ["quantization"]
    assert why["reason"].endswith("; quantization set by DPR_EDGE__QUANTIZATION")
    # vectors kept in RAM by the user: an int8 copy beside them would only add memory, so none is made
    in_ram, why = budget_levers(EdgeLevers(), 1_000_000, 384, 400, fixed=["vectors_on_disk"])
    assert (in_ram.quantization, in_ram.vectors_on_disk) == ("none", False) and why["choice"] == "fp32 vectors in RAM"
    both = EdgeLevers(quantization="int8", vectors_on_disk=False)
    assert budget_levers(both, 10, 384, 4096, fixed=["quantization", "vectors_on_disk"])[0] == both
    on_disk = budget_levers(EdgeLevers(vectors_on_disk=True), 10, 384, 4096, fixed=["vectors_on_disk"])[0]
    assert (on_disk.quantization, on_disk.vectors_on_disk) == ("none", True)  # fits: no int8


def test_a_generation_keeps_the_levers_it_was_created_with_when_the_user_set_them() -> None:
    assert fixed_levers({"quantization": "int8", "memory": {"set": ["vectors_on_disk"]}}) == ["vectors_on_disk"]
    # recorded before the budget existed: a lever away from its default was set by the user
    assert fixed_levers({"quantization": "int8", "vectors_on_disk": False}) == ["quantization"]
    assert fixed_levers({}) == []


def test_the_settings_say_the_budget_and_which_levers_were_set(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    ram_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // M
    assert 1 <= machine_budget_mb() <= ram_mb // 20 + 1 and machine_budget_mb(0.5) > machine_budget_mb()
    plain = EdgeEngine.from_settings(Settings(data_dir=tmp_path))
    assert plain.memory_budget_mb == machine_budget_mb() and plain.fixed_levers == []
    monkeypatch.setenv("DPR_EDGE__VECTORS_ON_DISK", "false")  # set, even to its default value
    monkeypatch.setenv("DPR_EDGE__MEMORY_BUDGET_MB", "64")
    engine = EdgeEngine.from_settings(Settings(data_dir=tmp_path))
    assert engine.memory_budget_mb == 64 and engine.fixed_levers == ["vectors_on_disk"]
    assert EdgeEngine(tmp_path, "c").memory_budget_mb is None  # built by hand: the levers it is given


# -- real collections --------------------------------------------------------------------------------------------


def budget_store(root: Path, budget_mb: int, levers: EdgeLevers | None = None, fixed: tuple[str, ...] = ()) -> Store:
    return Store(EdgeEngine(root, "c", idle_release=5, index_threshold=1000, levers=levers, search_params=SEARCH,
                            memory_budget_mb=budget_mb, fixed_levers=fixed))


def placements(root: Path) -> list[tuple[str, str, str | None]]:
    """Each HNSW segment's dense storage and its int8 copy's memory (None: no int8 copy)."""
    return [(s["index"]["type"], s["storage_type"], ((s.get("quantization_config") or {}).get("scalar") or {}).get(
        "memory")) for s in dense_segments(root) if s["index"]["type"] == "hnsw"]


def test_a_collection_that_outgrows_a_tiny_budget_is_rebuilt_int8_on_disk_with_the_same_answers(
    tmp_path: Path,
) -> None:
    corpus, queries = unit_vectors(8000, seed=21), unit_vectors(20, seed=22)
    store = budget_store(tmp_path, budget_mb=1)
    store.ensure_collection(SPEC)
    store.upsert(points(corpus[:2000]))  # fp32 0.24 MB + graph 0.49 MB: within 1 MB
    assert store.optimize() is True
    assert placements(tmp_path) == [("hnsw", "InRamMmap", None)]
    assert store.memory(GEN)["choice"] == "fp32 vectors in RAM"
    store.upsert(points(corpus)[2000:])  # 4x: fp32 0.98 + graph 1.95 MB, int8 0.24 + graph over 1 MB too
    assert store.optimize() is True
    [(_, storage, int8_memory)] = placements(tmp_path)
    assert "InRam" not in storage and int8_memory == "cold"
    memory = store.memory(GEN)
    assert memory["choice"] == "int8 + re-scoring, int8 copy and fp32 vectors on disk" and memory["points"] == 8000
    assert top10(store, queries) == exact_top10(corpus, queries)  # re-scored with the fp32 vectors
    store.close()
    reopened = Store(EdgeEngine(tmp_path, "c", idle_release=5, search_params=SEARCH))  # no budget: as built
    assert top10(reopened, queries) == exact_top10(corpus, queries)
    reopened.close()


def test_a_lever_the_user_set_wins_over_the_budget_at_creation_and_at_each_build(tmp_path: Path) -> None:
    corpus, queries = unit_vectors(6000, seed=23), unit_vectors(10, seed=24)
    store = budget_store(tmp_path, budget_mb=1, levers=EdgeLevers(quantization="none"), fixed=("quantization",))
    store.ensure_collection(SPEC)
    store.upsert(points(corpus))
    assert store.optimize() is True
    [(_, storage, int8_memory)] = placements(tmp_path)
    assert "InRam" not in storage and int8_memory is None  # over the budget: on disk, but no int8 copy
    recorded = json.loads((tmp_path / "c" / "generations" / GEN / LEVERS_FILE).read_text(encoding="utf-8"))
    assert recorded["memory"]["set"] == ["quantization"]
    store.close()
    later = budget_store(tmp_path, budget_mb=1)  # a process that sets nothing: the recorded choice stays
    grown = np.vstack([corpus, unit_vectors(1000, seed=25)])  # (7000, dim)
    later.upsert(points(grown)[6000:])
    assert later.optimize() is True
    assert [p[2] for p in placements(tmp_path)] == [None]
    assert top10(later, queries) == exact_top10(grown, queries)
    later.close()


def test_status_says_where_the_vectors_live_and_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`dpr status --json` and text, and /v1/status (the console's source), over a collection whose last build went
    int8 + on disk."""
    settings = Settings(data_dir=tmp_path / "dpr", edge=EdgeSettings(memory_budget_mb=1))
    store = Store(EdgeEngine.from_settings(settings))
    store.ensure_collection(SPEC)
    store.upsert(points(unit_vectors(3000, seed=26)))  # fp32 0.37 + graph 0.73 MB: over; int8 0.09 + graph within
    assert store.optimize() is True
    want = store.memory(store.info().active.name)  # type: ignore[union-attr]
    assert want["choice"] == "int8 + re-scoring, fp32 vectors on disk" and "budget of 1 MB" in want["reason"]
    assert collection_status(settings, store.info(), store)["memory"] == want
    runtime = FakeRuntime(store=store)
    with TestClient(create_app(settings, runtime=runtime, warm_model=False)) as client:
        assert client.get("/v1/status").json()["memory"] == want
    runtime.close()
    from entrypoints.cli.main import app

    monkeypatch.setenv("DPR_DATA_DIR", str(tmp_path / "dpr"))
    res = CliRunner().invoke(app, ["status"])
    assert res.exit_code == 0, res.output
    # the table wraps a long cell onto rows whose first column is empty, at whatever width the console has here:
    # read the text with the borders and line breaks taken out
    text = " ".join(re.sub(r"[│┃|]", " ", res.stdout).split())
    assert f"memory {want['choice']} ({want['reason']}) other generations" in text, res.stdout
    res = CliRunner().invoke(app, ["status", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["memory"] == want
