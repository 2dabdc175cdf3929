"""The one machine / commit probe of the benchmarks: CPU model and SIMD flags, cores, load, Python, commit; and the
scripts' one preamble (``script``) and their streaming upsert (``upsert_stream``).

Scripts run as ``python benchmarks/X.py`` (the benchmarks folder is then ``sys.path[0]``) and import it as
``from machine import ...``, then call ``REPO = script()`` before importing the product.
"""

from __future__ import annotations

import itertools
import os
import platform
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
# the ones that matter to the encoders
FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else ``platform.processor()``."""
    for line in _cpuinfo():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def cpu_flags() -> str:
    """The relevant SIMD flags the CPU has, space-separated (empty when none or unknown)."""
    for line in _cpuinfo():
        if line.startswith("flags"):
            have = set(line.split(":", 1)[1].split())
            return " ".join(f for f in FLAGS if f in have)
    return ""


def commit() -> str:
    """Short HEAD, with ``+dirty`` when tracked files have uncommitted changes; ``unknown`` on failure."""
    try:
        sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "")


def machine() -> dict[str, Any]:
    """CPU model, flags, cores visible to this process, load average, Python version and commit."""
    return {"cpu": cpu_model(), "flags": cpu_flags(), "cores": len(os.sched_getaffinity(0)),
            "load": os.getloadavg(), "python": platform.python_version(), "commit": commit()}


def machine_line() -> str:
    """:func:`machine` as one printable line."""
    m = machine()
    load = " / ".join(f"{x:.1f}" for x in m["load"])
    return (f"CPU: {m['cpu']} ({m['flags'] or 'no avx2'}), {m['cores']} cores visible; load average {load}; "
            f"Python {m['python']}; commit {m['commit']}")


def script(*folders: str) -> Path:
    """A benchmark script's preamble: the repository (and ``folders`` of it, e.g. ``tests`` for ``kit``) first on
    ``sys.path`` so the product imports, and the model hub off (``OFFLINE``: the models come from their wheels).
    Returns the repository's root."""
    for path in reversed([str(REPO), *(str(REPO / f) for f in folders)]):
        if path not in sys.path:
            sys.path.insert(0, path)
    for key, value in OFFLINE.items():
        os.environ.setdefault(key, value)
    return REPO


def upsert_stream(store: Any, points: Iterable[Any], size: int = 1000) -> None:
    """Upsert a stream of points into ``store`` ``size`` at a time, never holding them all (the synthetic bulks)."""
    stream = iter(points)
    while batch := list(itertools.islice(stream, size)):
        store.upsert(batch)
