"""`dpr serve` wiring: settings for a long-running process, option checks."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from entrypoints.api.app import SERVE_IDLE_RELEASE, SERVE_TORCH_THREADS, serving_settings
from entrypoints.cli.main import app
from services.core.settings import Settings

pytestmark = pytest.mark.unit


def test_serving_defaults(tmp_path: Path) -> None:
    default = Settings(data_dir=tmp_path)
    served = serving_settings(default)
    assert served.edge.idle_release == SERVE_IDLE_RELEASE and default.edge.idle_release == 10.0  # open between
    # questions, however far apart: another process gets the lease ~10 ms after one and the shard when it waits for it
    assert served.encoder.threads == SERVE_TORCH_THREADS  # parallel requests, not intra-op threads
    assert default.encoder.threads is None  # the CLI's object is unchanged


def test_serving_respects_explicit_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPR_ENCODER__THREADS", "2")
    assert serving_settings(Settings(data_dir=tmp_path)).encoder.threads == 2


def test_serving_respects_an_explicit_idle_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPR_EDGE__IDLE_RELEASE", "5")
    assert serving_settings(Settings(data_dir=tmp_path)).edge.idle_release == 5.0


def test_serving_leaves_the_server_store_alone(tmp_path: Path) -> None:
    server = Settings(data_dir=tmp_path, qdrant_url="http://qdrant:6333")
    assert serving_settings(server).edge == server.edge


def test_serve_rejects_a_bad_port() -> None:
    result = CliRunner().invoke(app, ["serve", "--port", "70000"])
    assert result.exit_code == 2
    assert "out of range" in result.output
