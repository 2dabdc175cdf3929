"""`dpr`: the command line entry point. Builds the one Settings object and registers every command group."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Annotated

import typer

from entrypoints.cli import core
from entrypoints.cli.common import load_settings

app = typer.Typer(
    name="dpr",
    help="Dense passage retrieval: ingest documents with a DPR passage tower into Qdrant, query with the "
    "question tower.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _root(
    ctx: typer.Context,
    data_dir: Annotated[Path | None, typer.Option("--data-dir", help="Overrides DPR_DATA_DIR.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log progress to stderr.")] = False,
) -> None:
    level = logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    ctx.obj = load_settings(data_dir=data_dir)


core.register(app)


def _register_optional() -> None:
    """Command groups that live in their own modules."""
    import importlib

    for module in (
        "entrypoints.cli.train",
        "entrypoints.cli.evaluate",
        "entrypoints.cli.models",
        "entrypoints.cli.workers",
        "entrypoints.cli.lifecycle",
        "entrypoints.cli.serve",
        "entrypoints.cli.hybrid",
    ):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name == module:
                continue
            raise
        mod.register(app)


_register_optional()


def main() -> None:
    # The model loaders' own progress bars ("Loading weights ...") must not leak into dpr's output.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    app()


if __name__ == "__main__":
    main()
