"""Shared CLI plumbing: settings from the context, JSON vs human output, errors to stderr with exit codes.

Exit codes: ``EXIT_CODES`` (the README's table is this one), the same for in-process and broker runs;
``exit_code_for`` is the one place that maps an error class to its code.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, NoReturn

import typer
from pydantic import ValidationError
from pydantic_settings import SettingsError
from rich.console import Console

from services.core.errors import ConfigError, DiskFull, DprError, TransientError
from services.core.settings import Settings

console = Console(stderr=False)
err_console = Console(stderr=True)

# The options most commands share
Collection = Annotated[str | None, typer.Option(help="Collection (alias) name.")]
AsJson = Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_INTERRUPTED = 130
EXIT_CODES: dict[int, str] = {
    EXIT_OK: "ok",
    EXIT_ERROR: "the request cannot work as given (no such collection or model, towers that do not match, bad "
    "data, every document failed, a job that ended failed)",
    EXIT_USAGE: "usage or configuration (a bad option or argument, an invalid DPR_* setting)",
    EXIT_UNAVAILABLE: "a service (broker, store) is unavailable for now; try again",
}
# Error class -> exit code, most specific first; ``exit_code_for`` reads it.
ERROR_EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (TransientError, EXIT_UNAVAILABLE),
    (ConfigError, EXIT_USAGE),
    (DprError, EXIT_ERROR),
    (FileNotFoundError, EXIT_ERROR),
    (KeyboardInterrupt, EXIT_INTERRUPTED),
)
_HINTS = {EXIT_UNAVAILABLE: " (temporary: try again once the service is reachable)"}


def exit_code_for(error: BaseException) -> int | None:
    """The exit code of an error a user can cause; None for anything else (a bug: let it raise)."""
    return next((code for cls, code in ERROR_EXIT_CODES if isinstance(error, cls)), None)


def load_settings(**overrides: Any) -> Settings:
    """The one Settings, or a message naming each bad DPR_* variable and exit 2 (never a traceback)."""
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as e:
        fail("invalid settings:\n" + "\n".join(_validation_lines(e)), code=EXIT_USAGE)
    except SettingsError as e:  # a value pydantic-settings could not even parse (bad JSON in a nested group)
        fail(f"invalid settings: {_settings_error_line(e)}", code=EXIT_USAGE)


def _validation_lines(error: ValidationError) -> list[str]:
    lines = []
    for err in error.errors():
        loc = [str(p) for p in err["loc"] if isinstance(p, str)]
        message = str(err["msg"]).removeprefix("Value error, ")
        if not loc:  # a check across fields: its message names the variables
            lines.append(f"  {message}")
            continue
        lines.append(f"  {'.'.join(loc)} (DPR_{'__'.join(loc).upper()}): {message}")
    return lines


def _settings_error_line(error: SettingsError) -> str:
    match = re.search(r'field "([A-Za-z_]+)"', str(error))
    field = match.group(1) if match else ""
    variable = f"DPR_{field.upper()}" if field else "a DPR_* variable"
    cause = f" ({error.__cause__})" if error.__cause__ is not None else ""
    example = f"{variable}__NAME=VALUE" if field else "DPR_GROUP__NAME=VALUE"
    return (
        f"{variable} cannot be parsed{cause}; a settings group takes a JSON object (e.g. "
        f"{variable}='{{\"name\": \"value\"}}'), or set its fields one by one as {example}"
    )


def settings_for(ctx: typer.Context, collection: str | None) -> Settings:
    """The command's settings, for ``--collection`` when given (a bad name is a usage error, exit 2)."""
    try:
        return get_settings(ctx).for_collection(collection)
    except DprError as e:
        fail(f"--{e}", code=EXIT_USAGE)


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
    except (DprError, FileNotFoundError, KeyboardInterrupt) as e:
        code = exit_code_for(e)
        if code is None:  # pragma: no cover - every class caught here is in the table
            raise
        notes = getattr(e, "__notes__", [])  # e.g. "... left DIR as it was" (services.core.fsutil.built_beside)
        message = "interrupted" if isinstance(e, KeyboardInterrupt) else "; ".join([str(e), *notes])
        fail(message + ("" if isinstance(e, DiskFull) else _HINTS.get(code, "")), code=code)
    except Exception as e:  # a write that met a full disk anywhere (a job file, an export): one line, exit 3
        from services.core.diskspace import full_disk_error
        from services.jobs.backends import write_refused

        refused = write_refused("DPR_BROKER_URL", e)  # Redis refusing a write (its disk is full), not the data dir's
        if refused is not None:
            fail(str(refused), code=EXIT_UNAVAILABLE)
        full = full_disk_error(e)
        if full is None:
            raise
        fail(str(full), code=EXIT_UNAVAILABLE)
