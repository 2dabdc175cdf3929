"""The thread policy: never more busy encoder threads than the cores this machine gives us (docs/operations.md,
"Threads": how many each command gets).

One number decides how many intra-op threads a process's towers use: ``settings.encoder.threads``.
``resolve_threads`` turns its default (``None``) into a number at the composition roots, so every backend reads a
concrete value. "Usable cores" is what the process may run on (the CPU affinity mask and the cgroup CPU quota),
not ``os.cpu_count()``, which counts the host. An explicit ``DPR_ENCODER__THREADS`` always wins; a value that
oversubscribes the cores is logged as a warning.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

from services.core.settings import Settings

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


def available_cores(cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> int:
    """Cores this process may keep busy: the affinity mask, capped by the cgroup CPU quota (floor, at least 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - macOS / Windows have no affinity call
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_limit(cgroup_root, proc_cgroup)
    if quota is not None:
        cores = min(cores, max(1, math.floor(quota)))
    return max(1, cores)


def threads_per_process(configured: int | None, processes: int = 1, cores: int | None = None) -> int:
    """Intra-op threads for one of ``processes`` encoder processes sharing ``cores``: the configured value if
    set, else ``cores // processes``, at least 1."""
    cores = cores if cores is not None else available_cores()
    processes = max(1, processes)
    if configured is not None:
        if configured * processes > cores:
            log.warning(
                "encoder threads oversubscribe the cores",
                extra={"threads": configured, "processes": processes, "cores": cores,
                       "fix": "lower DPR_ENCODER__THREADS or unset it (default: cores / processes)"},
            )
        return configured
    return max(1, cores // processes)


def resolve_threads(settings: Settings, processes: int = 1, cores: int | None = None) -> Settings:
    """``settings`` with ``encoder.threads`` resolved by ``threads_per_process`` (an explicit value is kept)."""
    threads = threads_per_process(settings.encoder.threads, processes, cores)
    if threads == settings.encoder.threads:
        return settings
    encoder = settings.encoder.model_copy(update={"threads": threads})
    return settings.model_copy(update={"encoder": encoder})


def cgroup_cpu_limit(cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> float | None:
    """CPUs the cgroup quota allows (quota / period; the smallest along the process's cgroup path), or None."""
    limits = [limit for d in _cgroup_dirs(cgroup_root, proc_cgroup) if (limit := _read_limit(d)) is not None]
    return min(limits) if limits else None


def _cgroup_dirs(root: Path, proc_cgroup: Path) -> list[Path]:
    """The cgroup directories (v2 unified, v1 ``cpu`` controller) from the process's own group up to the root."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    dirs: list[Path] = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":
            bases = [root]  # v2: "0::/path"
        elif "cpu" in controllers.split(","):
            bases = [root / controllers, root / "cpu", root / "cpu,cpuacct"]  # v1: "4:cpu,cpuacct:/path"
        else:
            continue
        rel = Path(path.strip().lstrip("/"))
        for base in bases:
            for ancestor in (rel, *rel.parents):
                d = base / ancestor
                if d not in dirs and d.is_dir():
                    dirs.append(d)
    for fallback in (root, root / "cpu", root / "cpu,cpuacct"):
        if fallback not in dirs and fallback.is_dir():
            dirs.append(fallback)
    return dirs


def _read_limit(d: Path) -> float | None:
    try:
        if (d / "cpu.max").is_file():  # v2: "max 100000" or "200000 100000"
            quota, _, period = (d / "cpu.max").read_text().strip().partition(" ")
            if quota == "max":
                return None
            return int(quota) / int(period or "100000")
        if (d / "cpu.cfs_quota_us").is_file():  # v1: -1 means no quota
            quota_us = int((d / "cpu.cfs_quota_us").read_text())
            period_us = int((d / "cpu.cfs_period_us").read_text())
            return quota_us / period_us if quota_us > 0 and period_us > 0 else None
    except (OSError, ValueError):
        return None
    return None
