"""The latest evaluation report of a data dir: ``dpr eval --report DIR`` writes DIR and keeps a copy under
``DATA_DIR/reports/latest`` (``keep_latest``), which ``dpr serve``'s console shows (``read_latest``).

The copy is whole or absent: it is assembled in a staging folder and renamed into place, so a reader never sees
half of one report and half of another.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from services.core.settings import Settings

log = logging.getLogger(__name__)

RESULTS = "results.json"
MARKDOWN = "report.md"
META = "meta.json"
PLOT_NAME = re.compile(r"[a-z0-9_]{1,64}\.png")
PLOT_LABELS = {"recall_at_k.png": "recall@k", "answer_at_k.png": "top-k answer accuracy"}


def latest_dir(settings: Settings) -> Path:
    return settings.data_dir / "reports" / "latest"


@dataclass(frozen=True)
class LatestReport:
    folder: Path
    results: dict[str, Any]
    meta: dict[str, Any]
    plots: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            **self.results,
            "written_at": self.meta.get("written_at"),
            "source": self.meta.get("source"),
            "plots": [{"name": p, "label": PLOT_LABELS.get(p, p.removesuffix(".png"))} for p in self.plots],
        }

    def plot(self, name: str) -> Path | None:
        """The plot file called ``name`` (one of ``plots``), or None."""
        return self.folder / name if name in self.plots else None


def keep_latest(settings: Settings, written: Path) -> Path:
    """Copy the report ``write_report`` put in ``written`` (results, Markdown, plots) to ``latest_dir``."""
    target = latest_dir(settings)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".incoming-{os.getpid()}"
    old = target.parent / f".replaced-{os.getpid()}"
    for leftover in (staging, old):
        shutil.rmtree(leftover, ignore_errors=True)
    staging.mkdir()
    for path in sorted(written.iterdir()):
        if path.name in (RESULTS, MARKDOWN) or PLOT_NAME.fullmatch(path.name):
            shutil.copy2(path, staging / path.name)
    meta = {"written_at": datetime.now(UTC).isoformat(timespec="seconds"), "source": str(written.resolve())}
    (staging / META).write_text(json.dumps(meta) + "\n")
    if target.exists():
        target.rename(old)
    staging.rename(target)
    shutil.rmtree(old, ignore_errors=True)
    log.info("kept the evaluation report", extra={"folder": str(target)})
    return target


def read_latest(settings: Settings) -> LatestReport | None:
    """The report ``keep_latest`` kept, or None when there is none (or it cannot be read)."""
    folder = latest_dir(settings)
    try:
        results = json.loads((folder / RESULTS).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(results, dict):
        return None
    try:
        meta = json.loads((folder / META).read_text())
    except (OSError, ValueError):
        meta = {}
    meta = meta if isinstance(meta, dict) else {}
    plots = sorted(p.name for p in folder.iterdir() if PLOT_NAME.fullmatch(p.name)) if folder.is_dir() else []
    return LatestReport(folder=folder, results=results, meta=meta, plots=plots)
