"""Unit-suite fixtures: every unit test runs with the ``DPR_*`` variables scrubbed and no ``.env`` file read, so
what it exercises is what it sets (``kit.policy``)."""

from __future__ import annotations

import pytest
from kit.policy import scrub_settings_env


@pytest.fixture(autouse=True)
def _scrub_settings_env(monkeypatch: pytest.MonkeyPatch) -> None:
    scrub_settings_env(monkeypatch)
