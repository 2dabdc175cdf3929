"""Free space before writing (services/core/diskspace.py): the embedded store refuses a write below DPR_MIN_FREE_MB
and writes nothing, ENOSPC anywhere becomes one line naming the disk (exit 3), `dpr status` shows free space.

The real full disk (a small loop-mounted filesystem) is in tests/integration/test_disk_full.py; here the threshold
is set above the disk's actual free space, which exercises the same check."""

from __future__ import annotations

import errno
from pathlib import Path

import numpy as np
import pytest
import typer

from entrypoints.cli.common import EXIT_UNAVAILABLE, cli_errors
from entrypoints.status import disk_status
from services.core import diskspace
from services.core.errors import DiskFull
from services.core.settings import Settings
from services.store import Store
from services.store.edge.engine import EdgeEngine
from services.store.points import CollectionSpec, Passage, PassagePoint

pytestmark = pytest.mark.unit

SPEC = CollectionSpec(dim=4, distance="cosine", model="m@1", sparse=False)
HUGE = 10**9  # MB: more than any disk has free


def _points(n: int) -> list[PassagePoint]:
    rng = np.random.default_rng(0)
    return [PassagePoint(Passage(doc_id=f"d{i}", chunk_index=0, text=f"t {i}"), dense=list(map(float, v)))
            for i, v in enumerate(rng.normal(size=(n, SPEC.dim)))]  # (n, dim)


def test_require_names_the_disk_its_free_space_and_the_fix(tmp_path: Path) -> None:
    diskspace.require(tmp_path, 0, "nothing")  # off
    diskspace.require(tmp_path / "not" / "yet", 1, "a write")  # the nearest existing parent is asked
    with pytest.raises(DiskFull) as e:
        diskspace.require(tmp_path / "store", HUGE, "writing 3 points")
    message = str(e.value)
    assert str(tmp_path) in message and "MB free of" in message and "DPR_MIN_FREE_MB" in message
    assert "nothing was written" in message and "free space there" in message and "\n" not in message


def test_the_edge_store_refuses_a_write_below_the_minimum_and_keeps_what_it_had(tmp_path: Path) -> None:
    engine = EdgeEngine(tmp_path, "c", idle_release=0)
    store = Store(engine)
    store.ensure_collection(SPEC)
    store.upsert(_points(5))
    engine.min_free_mb = HUGE
    with pytest.raises(DiskFull, match="writing 7 points into the embedded store"):
        store.upsert(_points(7))
    assert store.count() == 5, "reads go on, and nothing of the refused batch was written"
    engine.min_free_mb = 0
    store.upsert(_points(7))
    assert store.count() == 7
    store.close()


def test_a_new_generation_is_refused_before_the_engine_creates_files(tmp_path: Path) -> None:
    store = Store(EdgeEngine(tmp_path, "c", idle_release=0, min_free_mb=HUGE))
    with pytest.raises(DiskFull, match="creating a generation"):
        store.ensure_collection(SPEC)
    assert not list((tmp_path / "c").glob("generations/*/shard"))
    store.close()


def test_enospc_anywhere_becomes_one_line_and_exit_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    full = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "jobs" / "x"))
    with pytest.raises(typer.Exit) as e, cli_errors():
        raise full
    assert e.value.exit_code == EXIT_UNAVAILABLE
    err = capsys.readouterr().err
    assert "disk full" in err and str(tmp_path) in err and "Traceback" not in err
    with pytest.raises(typer.Exit) as e, cli_errors():  # the engine's own text of it
        raise RuntimeError("Service internal error: No space left on device (os error 28)")
    assert e.value.exit_code == EXIT_UNAVAILABLE
    with pytest.raises(ZeroDivisionError), cli_errors():  # anything else is still a bug
        raise ZeroDivisionError
    with pytest.raises(DiskFull), diskspace.translate(tmp_path, "a snapshot"):
        raise OSError(errno.ENOSPC, "No space left on device")


def test_status_shows_free_space_and_warns_when_low(tmp_path: Path) -> None:
    ok = disk_status(Settings(data_dir=tmp_path, min_free_mb=0))
    assert ok["free_mb"] > 0 and not ok["low"] and "warning" not in ok
    low = disk_status(Settings(data_dir=tmp_path, min_free_mb=HUGE))
    assert low["writes_refused"] and "writes are refused" in low["warning"]
