"""Shared CLI plumbing: settings from the context, JSON vs human output, errors to stderr with exit codes."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import typer
from pydantic import ValidationError
from rich.console import Console

from services.errors import DprError, TransientError
from services.settings import Settings

console = Console(stderr=False)
err_console = Console(stderr=True)

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3


def load_settings(**overrides: Any) -> Settings:
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = ".".join(str(p) for p in err["loc"]) or "settings"
            env = "DPR_" + "__".join(str(p) for p in err["loc"]).upper() if err["loc"] else "DPR_*"
            lines.append(f"  {loc} ({env}): {err['msg']}")
        fail("invalid settings:\n" + "\n".join(lines), code=EXIT_USAGE)


def get_settings(ctx: typer.Context) -> Settings:
    """The Settings built by the main callback (or a fresh one when a command runs on its own)."""
    obj = ctx.find_root().obj if ctx is not None else None
    if isinstance(obj, Settings):
        return obj
    return load_settings()


def fail(message: str, code: int = EXIT_ERROR) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


@contextmanager
def cli_errors() -> Iterator[None]:
    """Turn the service's errors into one clear line on stderr and a non-zero exit."""
    try:
        yield
    except TransientError as e:
        fail(f"{e} (temporary: try again once the service is reachable)", code=EXIT_UNAVAILABLE)
    except DprError as e:
        fail(str(e))
    except FileNotFoundError as e:
        fail(str(e))
    except KeyboardInterrupt:
        fail("interrupted", code=130)
