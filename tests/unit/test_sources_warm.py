"""A server that syncs sources runs the passage tower once on its largest batch before the first tick
(``warm_passage_tower``), so its working memory is reached at start; a failure there is logged, never raised."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from services.core.settings import EncoderSettings, Settings
from services.sources.schedule import warm_passage_tower

pytestmark = pytest.mark.unit


class RecordingTowers:
    max_passage_tokens = 40

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], int]] = []

    def encode_documents(self, passages: list[str], batch_size: int = 32) -> np.ndarray:
        self.calls.append((passages, batch_size))
        return np.zeros((len(passages), 4), dtype=np.float32)


def test_the_largest_batch_runs_once(tmp_path: Any) -> None:
    towers = RecordingTowers()
    settings = Settings(data_dir=tmp_path, encoder=EncoderSettings(batch_size=7))
    warm_passage_tower(SimpleNamespace(towers=towers, settings=settings))  # type: ignore[arg-type]
    [(passages, batch_size)] = towers.calls
    assert batch_size == 7 and len(passages) == 7
    assert all(len(p.split()) > towers.max_passage_tokens for p in passages)  # truncated to the longest passage


def test_a_failure_is_logged_not_raised(tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        @property
        def towers(self) -> Any:
            raise RuntimeError("no model")

        settings = Settings(data_dir=tmp_path)

    with caplog.at_level(logging.ERROR):
        warm_passage_tower(Broken())  # type: ignore[arg-type]
    assert "warming the passage tower failed" in caplog.text
