"""Configuration and usage mistakes (issue 12) end in one message naming the variable or option and exit 2, never a
traceback; the exit-code table maps every error class in one place."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from entrypoints.cli.common import (
    EXIT_CODES,
    EXIT_ERROR,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    exit_code_for,
)
from entrypoints.cli.main import COMMANDS, CORE, app, build_app
from services.core.errors import (
    CollectionNotFound,
    ConfigError,
    DataError,
    DocumentError,
    ModelMismatch,
    StoreUnavailable,
)
from services.core.settings import Settings

pytestmark = pytest.mark.unit


def _run(args: list[str], env: dict[str, str], tmp_path: Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, args, env={"DPR_DATA_DIR": str(tmp_path / "dpr"), **env})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"DPR_BROKER_URL": "redis://localhost:abc/0"}, ["DPR_BROKER_URL", "redis://host:6379/0"]),
        ({"DPR_BROKER_URL": "redis://localhost:99999/0"}, ["DPR_BROKER_URL", "out of range"]),
        ({"DPR_BROKER_URL": "amqp://localhost"}, ["DPR_BROKER_URL", "not a Redis URL"]),
        ({"DPR_QDRANT_URL": "http://qdrant:port"}, ["DPR_QDRANT_URL", "http://host:6333"]),
        ({"DPR_QDRANT_URL": "http://qdrant:70000"}, ["DPR_QDRANT_URL", "out of range"]),
        ({"DPR_QDRANT_URL": "http://:6333"}, ["DPR_QDRANT_URL", "no host"]),
        ({"DPR_ENCODER": "{"}, ["DPR_ENCODER", "JSON object", "DPR_ENCODER__NAME=VALUE"]),
        ({"DPR_API": '{"port": '}, ["DPR_API", "JSON object"]),
        ({"DPR_ENCODER__DEVICE": "quantum"}, ["DPR_ENCODER__DEVICE", "cuda:N"]),
        ({"DPR_ENCODER__DEVICE": "cuda:x"}, ["DPR_ENCODER__DEVICE"]),
        ({"DPR_API__PORT": "eighty"}, ["DPR_API__PORT"]),
    ],
)
@pytest.mark.parametrize("command", [["status"], ["serve"]])
def test_bad_settings_are_one_message_and_exit_2(
    tmp_path: Path, env: dict[str, str], names: list[str], command: list[str]
) -> None:
    code, output = _run(command, env, tmp_path)
    assert code == EXIT_USAGE, output
    assert "invalid settings" in output and all(name in output for name in names), output


def test_a_model_directory_that_is_not_a_model(tmp_path: Path) -> None:
    not_a_model = tmp_path / "photos"
    not_a_model.mkdir()
    code, output = _run(["serve"], {"DPR_ENCODER__MODEL": str(not_a_model)}, tmp_path)
    assert code == EXIT_USAGE and "DPR_ENCODER__MODEL" in output and "not a model" in output, output
    (not_a_model / "modules.json").write_text("[]")
    Settings(data_dir=tmp_path, encoder={"model": str(not_a_model)})  # type: ignore[arg-type]  # now accepted


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:1", "mps", "xpu:0"])
def test_known_devices_are_accepted(tmp_path: Path, device: str) -> None:
    assert Settings(data_dir=tmp_path, encoder={"device": device}).encoder.device == device  # type: ignore[arg-type]


@pytest.mark.parametrize("url", ["redis://localhost:6379/0", "rediss://u:p@cache.internal:6380/1", "redis://"])
def test_good_broker_urls(tmp_path: Path, url: str) -> None:
    assert Settings(data_dir=tmp_path, broker_url=url).broker_url == url


@pytest.mark.parametrize("key", ["a..b", "a.", ".a", "a b"])
def test_a_bad_filter_key_is_a_usage_error(tmp_path: Path, key: str) -> None:
    code, output = _run(["query", "anything", "--filter", f"{key}=x"], {}, tmp_path)
    assert code == EXIT_USAGE, output
    assert repr(key) in output and "dots only between names" in output, output


def test_exit_code_table() -> None:
    assert set(EXIT_CODES) == {0, 1, 2, 3}
    assert exit_code_for(StoreUnavailable("store down")) == EXIT_UNAVAILABLE
    assert exit_code_for(ConfigError("bad option")) == EXIT_USAGE
    for error in (CollectionNotFound("none"), ModelMismatch("towers"), DataError("bad file"),
                  DocumentError("x", "empty", "empty"), FileNotFoundError("x")):
        assert exit_code_for(error) == EXIT_ERROR
    assert exit_code_for(RuntimeError("a bug")) is None  # bugs are not dressed up as user errors


def test_every_command_is_built_and_a_core_command_alone() -> None:
    """``COMMANDS`` names objects that exist (a typo would drop a command silently), and main() builds a core
    command alone (the thin `dpr query`)."""
    built = [c.name for c in app.registered_commands] + [g.name for g in app.registered_groups]
    assert sorted(built) == sorted(COMMANDS)
    for name in CORE:
        assert [c.name for c in build_app((name,)).registered_commands] == [name]
