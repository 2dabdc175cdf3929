"""Progress bars the long commands share (`dpr adapt`, `dpr train`): one rich bar per stage on stderr.

Imported only by the commands that train (never on `dpr query`'s path: rich.progress stays out of it)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from entrypoints.cli.common import err_console

if TYPE_CHECKING:
    from services.lab.shared.stages import StageProgress


@contextmanager
def stage_bars(quiet: bool) -> Iterator[StageProgress]:
    """The ``progress`` callback of a staged run (``services.lab.shared.stages.StageProgress``): one bar per stage,
    shown from the stage's first report: done / total (None: not known yet), a note (the loss, the model scored, a dev
    figure), elapsed and ETA. ``quiet`` (``--json``) shows nothing."""
    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.fields[note]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                   console=err_console, disable=quiet, transient=False)
    tasks: dict[str, TaskID] = {}

    def on_progress(stage: str, done: int, total: int | None, note: str) -> None:
        if not tasks:
            bar.start()
        if stage not in tasks:
            tasks[stage] = bar.add_task(stage, total=total, note=note)
        bar.update(tasks[stage], completed=done, total=total, note=note)

    try:
        yield on_progress
    finally:
        bar.stop()
