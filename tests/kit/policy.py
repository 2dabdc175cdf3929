"""What every test suite agrees on: each test names its suite, and settings come from the test alone.

- ``SUITE_MARKERS`` / ``refuse_unmarked``: a test with none of ``unit`` / ``integration`` / ``slow`` would never run
  under ``make test``; collection refuses it instead (``tests/conftest.py``).
- ``scrub_settings_env`` (autouse for every test, ``tests/conftest.py``) / ``make_settings``: a developer's shell
  (``DPR_BROKER_URL``, ``DPR_QDRANT_URL``, ...) or a ``.env`` file in the working directory must not change what a
  test exercises. The scrub removes every ``DPR_*`` variable and turns the ``.env`` file off for each ``Settings()``
  built meanwhile, the ones the code under test builds at its composition roots included. ``QDRANT_URL`` (no
  prefix) stays: it opts into the real-server contract run.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import pytest

from services.core.settings import Settings

SUITE_MARKERS = ("unit", "integration", "slow")
ENV_PREFIX = str(Settings.model_config.get("env_prefix") or "DPR_")


def refuse_unmarked(items: Sequence[pytest.Item]) -> None:
    """Raise ``pytest.UsageError`` naming every collected test that carries none of ``SUITE_MARKERS``."""
    unmarked = [item.nodeid for item in items if not any(item.get_closest_marker(m) for m in SUITE_MARKERS)]
    if unmarked:
        raise pytest.UsageError(
            f"{len(unmarked)} test(s) carry none of the markers {', '.join(SUITE_MARKERS)} and would never run: "
            f"{', '.join(unmarked)}; add e.g. `pytestmark = pytest.mark.unit` to the module"
        )


def scrub_settings_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """For the rest of the test: no ``DPR_*`` variable in ``os.environ`` and no ``.env`` file read by ``Settings``."""
    for name in [k for k in os.environ if k.startswith(ENV_PREFIX)]:
        monkeypatch.delenv(name)
    monkeypatch.setitem(Settings.model_config, "env_file", None)


def make_settings(**values: Any) -> Settings:
    """Settings from ``values`` and the defaults (plus variables the test itself set), never from a ``.env`` file."""
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]
