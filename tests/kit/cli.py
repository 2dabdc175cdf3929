"""``dpr_json``: one `dpr` command through the CLI in this process, its exit code checked, its JSON answer."""

from __future__ import annotations

import json
from typing import Any

from typer.testing import CliRunner


def dpr_json(runner: CliRunner, *args: str) -> Any:
    """``dpr ARGS --json``'s answer; the command must exit 0 (its output is the assertion's message)."""
    from entrypoints.cli.main import app  # lazily: the slow suites import the CLI only when a test runs

    res = runner.invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)
