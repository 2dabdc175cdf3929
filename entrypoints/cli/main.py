"""`dpr`: the command line entry point. Builds the one Settings object and registers every command group."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

from entrypoints.cli.common import load_settings

HELP = "Dense passage retrieval: ingest documents with a DPR passage tower into Qdrant, query with the question tower."
CORE = {  # the core commands and the module of each: one of them builds only its own module
    "ingest": "entrypoints.cli.ingest",
    "query": "entrypoints.cli.core",
    "status": "entrypoints.cli.core",
    "delete": "entrypoints.cli.core",
    "mcp": "entrypoints.cli.mcp",  # an agent starts it for each session: no other module
}
GROUPS = (  # every module with commands, each with register(app), in the order `dpr --help` lists them
    "entrypoints.cli.ingest",
    "entrypoints.cli.sources",
    "entrypoints.cli.core",
    "entrypoints.cli.train",
    "entrypoints.cli.adapt",
    "entrypoints.cli.evaluate",
    "entrypoints.cli.models",
    "entrypoints.cli.workers",
    "entrypoints.cli.lifecycle",
    "entrypoints.cli.serve",
    "entrypoints.cli.keys",
    "entrypoints.cli.hybrid",
    "entrypoints.cli.snapshot",
    "entrypoints.cli.feedback",
    "entrypoints.cli.mcp",
)


def _root(
    ctx: typer.Context,
    data_dir: Annotated[Path | None, typer.Option("--data-dir", help="Overrides DPR_DATA_DIR.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log progress to stderr.")] = False,
) -> None:
    level = logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    ctx.obj = load_settings(data_dir=data_dir)


def build_app(groups: Sequence[str] = GROUPS) -> typer.Typer:
    """The ``dpr`` command with the commands of the modules ``groups``."""
    import importlib

    app = typer.Typer(name="dpr", help=HELP, no_args_is_help=True, pretty_exceptions_enable=False,
                      add_completion=False)
    app.callback()(_root)
    for module in groups:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name == module:
                continue
            raise
        mod.register(app)
    return app


def _command(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names (the first word that is not a root option or its value)."""
    words = iter(argv)
    for word in words:
        if word == "--data-dir":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def __getattr__(name: str) -> typer.Typer:
    """``app``: every command, built on first use (``from entrypoints.cli.main import app``)."""
    if name == "app":
        globals()["app"] = built = build_app()
        return built
    raise AttributeError(name)


def main() -> None:
    # The model loaders' own progress bars ("Loading weights ...") must not leak into dpr's output.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    # A core command (`dpr query` above all: the thin client) builds only the module it lives in: the others are
    # not imported (for `dpr query`: no reader, chunker, job executor or progress bar) and typer turns 3 functions
    # into commands, not 20.
    command = _command(sys.argv[1:])
    build_app((CORE[command],) if command in CORE else GROUPS)()


if __name__ == "__main__":
    main()
