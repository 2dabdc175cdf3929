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
COMMANDS = {  # every command and command group ("module:object"), in the order `dpr --help` lists them
    "ingest": "entrypoints.cli.ingest:ingest",
    "sources": "entrypoints.cli.sources:sources_app",
    "query": "entrypoints.cli.core:query",
    "status": "entrypoints.cli.core:status",
    "delete": "entrypoints.cli.core:delete",
    "train": "entrypoints.cli.train:train",
    "train-reranker": "entrypoints.cli.train:train_reranker",
    "adapt": "entrypoints.cli.adapt:adapt",
    "eval": "entrypoints.cli.evaluate:evaluate",
    "models": "entrypoints.cli.models:models_app",
    "worker": "entrypoints.cli.workers:worker",
    "jobs": "entrypoints.cli.workers:jobs",
    "reembed": "entrypoints.cli.lifecycle:reembed",
    "rollback": "entrypoints.cli.lifecycle:rollback",
    "gc": "entrypoints.cli.lifecycle:gc",
    "beat": "entrypoints.cli.lifecycle:beat",
    "optimize": "entrypoints.cli.lifecycle:optimize",
    "serve": "entrypoints.cli.serve:serve",
    "keys": "entrypoints.cli.keys:keys_app",
    "audit": "entrypoints.cli.keys:audit",
    "tune-hybrid": "entrypoints.cli.hybrid:tune_hybrid_command",
    "snapshot": "entrypoints.cli.snapshot:snapshot_app",
    "migrate": "entrypoints.cli.snapshot:migrate",
    "feedback": "entrypoints.cli.feedback:feedback_app",
    "mcp": "entrypoints.cli.mcp:mcp",  # an agent starts it for each session: no other module
}
CORE = ("ingest", "query", "status", "delete", "mcp")  # one of them builds only itself


def _root(
    ctx: typer.Context,
    data_dir: Annotated[Path | None, typer.Option("--data-dir", help="Overrides DPR_DATA_DIR.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log progress to stderr.")] = False,
) -> None:
    level = logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    ctx.obj = load_settings(data_dir=data_dir)


def build_app(names: Sequence[str] = tuple(COMMANDS)) -> typer.Typer:
    """The ``dpr`` command with the commands and groups ``names`` (of ``COMMANDS``)."""
    import importlib

    app = typer.Typer(name="dpr", help=HELP, no_args_is_help=True, pretty_exceptions_enable=False,
                      add_completion=False)
    app.callback()(_root)
    for name in names:
        module, _, attr = COMMANDS[name].partition(":")
        try:
            command = getattr(importlib.import_module(module), attr)
        except ModuleNotFoundError as e:
            if e.name == module:
                continue
            raise
        if isinstance(command, typer.Typer):
            app.add_typer(command, name=name)
        else:
            app.command(name)(command)
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
    # A core command (`dpr query` above all: the thin client) builds only itself: the other modules are not
    # imported (for `dpr query`: no reader, chunker, job executor or progress bar) and typer turns 1 function into a
    # command, not 20.
    command = _command(sys.argv[1:])
    build_app((command,) if command in CORE else tuple(COMMANDS))()


if __name__ == "__main__":
    main()
