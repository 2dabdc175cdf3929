"""The thread policy (services.core.threads): usable cores from affinity and the cgroup quota, split between
processes."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

from encoders import towers
from services.core.settings import EncoderSettings, Settings
from services.core.threads import available_cores, cgroup_cpu_limit, resolve_threads, threads_per_process

pytestmark = pytest.mark.unit


def cgroup_v2(tmp_path: Path, limits: dict[str, str], own: str = "/") -> tuple[Path, Path]:
    """A fake unified hierarchy: ``limits`` maps a group path ('' = root) to its cpu.max text."""
    root = tmp_path / "cgroup"
    for group, text in limits.items():
        d = root / group.strip("/")
        d.mkdir(parents=True, exist_ok=True)
        (d / "cpu.max").write_text(text)
    (root / own.strip("/")).mkdir(parents=True, exist_ok=True)
    proc = tmp_path / "proc_cgroup"
    proc.write_text(f"0::{own}\n")
    return root, proc


def cgroup_v1(tmp_path: Path, quota: int, period: int = 100_000) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    d = root / "cpu,cpuacct" / "docker" / "abc"
    d.mkdir(parents=True)
    (d / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (d / "cpu.cfs_period_us").write_text(f"{period}\n")
    proc = tmp_path / "proc_cgroup"
    proc.write_text("4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n")
    return root, proc


def test_no_quota_means_the_affinity_mask(tmp_path: Path) -> None:
    root, proc = cgroup_v2(tmp_path, {"": "max 100000"})
    assert cgroup_cpu_limit(root, proc) is None
    assert available_cores(root, proc) == len(os.sched_getaffinity(0))


def test_v2_quota_caps_the_cores_rounding_down(tmp_path: Path) -> None:
    root, proc = cgroup_v2(tmp_path, {"": "max 100000", "/kubepods/pod1": "150000 100000"}, own="/kubepods/pod1")
    assert cgroup_cpu_limit(root, proc) == 1.5
    assert available_cores(root, proc) == 1  # 2 busy threads on 1.5 CPUs would be throttled


def test_v2_smallest_limit_along_the_path_wins(tmp_path: Path) -> None:
    root, proc = cgroup_v2(tmp_path, {"/a": "100000 100000", "/a/b": "400000 100000"}, own="/a/b")
    assert cgroup_cpu_limit(root, proc) == 1.0


def test_v1_quota(tmp_path: Path) -> None:
    root, proc = cgroup_v1(tmp_path, quota=200_000)
    assert cgroup_cpu_limit(root, proc) == 2.0
    root, proc = cgroup_v1(tmp_path / "none", quota=-1)
    assert cgroup_cpu_limit(root, proc) is None


def test_unreadable_cgroup_files_mean_no_limit(tmp_path: Path) -> None:
    root, proc = cgroup_v2(tmp_path, {"": "garbage"})
    assert cgroup_cpu_limit(root, proc) is None
    assert cgroup_cpu_limit(tmp_path / "missing", tmp_path / "missing_proc") is None


def test_quota_never_gives_zero_threads(tmp_path: Path) -> None:
    root, proc = cgroup_v2(tmp_path, {"": "50000 100000"})
    assert available_cores(root, proc) == 1


def test_threads_split_cores_between_processes() -> None:
    assert threads_per_process(None, 1, cores=8) == 8  # in-process ingest: every core
    assert threads_per_process(None, 2, cores=8) == 4
    assert threads_per_process(None, 3, cores=8) == 2  # never more busy threads than cores
    assert threads_per_process(None, 4, cores=2) == 1  # at least one
    assert threads_per_process(None, 0, cores=2) == 2


def test_explicit_threads_win_and_oversubscription_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="services.core.threads"):
        assert threads_per_process(1, 2, cores=2) == 1
        assert not caplog.records
        assert threads_per_process(3, 2, cores=2) == 3
    assert "oversubscribe" in caplog.records[0].getMessage()


def test_resolve_threads_gives_every_backend_a_number(tmp_path: Path) -> None:
    s = Settings(data_dir=tmp_path)
    assert s.encoder.threads is None
    assert resolve_threads(s, processes=2, cores=4).encoder.threads == 2
    assert s.encoder.threads is None  # the caller's object is unchanged
    pinned = s.model_copy(update={"encoder": EncoderSettings(threads=3)})
    assert resolve_threads(pinned, processes=2, cores=8) is pinned


def test_configure_threads_records_the_number_without_importing_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(towers, "_intra_op_threads", None)
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # as in a process whose towers run on onnxruntime
    towers.configure_threads(None)
    assert towers.intra_op_threads() is None
    towers.configure_threads(3)
    assert towers.intra_op_threads() == 3
    assert "torch" not in sys.modules
