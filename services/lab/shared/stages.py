"""A run made of stages that each write their output into one run directory, so a killed run started again with
the same options skips every finished stage and goes on at the first unfinished one. `dpr adapt`
(``services.lab.adaptation.recipe``) and `dpr train`'s recipe (``services.lab.towers.rounds``) run their stages
through it.

A stage is finished when its output exists (the caller says how to tell); ``write_json`` writes beside and renames
into place, so a stage's file exists only once the stage has finished. Each stage's wall time joins
``timings.json`` in the run directory as soon as it ends (a stopped run keeps the times it measured).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from services.core.fsutil import write_atomic

# stage, done, total (None: not known yet), a short note (the latest loss, the model scored, "done earlier")
StageProgress = Callable[[str, int, int | None, str], None]



def step_progress(notify: StageProgress, label: str) -> Callable[[int, int, float | None], None]:
    """A trainer's ``progress`` (step, total steps, the latest loss) reported as stage ``label``'s."""
    return lambda step, total, loss: notify(label, step, total, f"loss {loss:.4f}" if loss is not None else "")


class StagedRun:
    """The stages of one run directory: ``stage`` runs one unless it finished before; ``stages`` says which ran
    and which were skipped (done earlier), ``timings`` the wall seconds of each stage that ran (this or an earlier
    process)."""

    def __init__(self, run_dir: Path, notify: StageProgress | None = None) -> None:
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self.notify: StageProgress = notify or (lambda *a: None)
        self.stages: dict[str, str] = {}
        self.timings: dict[str, float] = read_json(run_dir / "timings.json") or {}

    def stage(self, name: str, done: bool, work: Callable[[], object]) -> bool:
        """Run ``work`` unless ``done`` (its output exists); its wall time joins timings.json. Returns whether it
        ran."""
        self.stages[name] = "skipped" if done else "ran"
        if done:
            self.notify(name, 1, 1, "done earlier")
            return False
        t = time.perf_counter()
        work()
        self.timings[name] = round(time.perf_counter() - t, 1)
        write_json(self.run_dir / "timings.json", self.timings)
        return True


def write_json(path: Path, data: Any) -> None:
    """Written beside and renamed into place: a stage's file exists only once the stage finished."""
    write_atomic(path, json.dumps(data, ensure_ascii=False) + "\n")


def read_json(path: Path) -> Any:
    if not path.is_file():
        return None
    return json.loads(path.read_text())
