"""Progress bars the long commands share on stderr: one rich bar per stage (`dpr adapt`, `dpr train`), or one bar
of done / total (`counted_bar`: `dpr ingest --wait`, `dpr reembed`, `dpr tune-hybrid`).

Never on `dpr query`'s path: rich.progress stays out of it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

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


def counted_bar(label: str, *, unit: str | None = None, **options: Any) -> Progress:
    """One bar on stderr: ``label``, done of total, ``unit`` (a text column, if any), the time elapsed."""
    return Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), *([TextColumn(unit)] if unit else []),
                    TimeElapsedColumn(), console=err_console, **options)


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
