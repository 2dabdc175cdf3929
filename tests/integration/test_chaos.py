"""The chaos suite (benchmarks/chaos.py) in both broker modes: real Valkey, real `dpr worker`s SIGKILLed at
random, broker restarts, `dpr ingest --wait`; every expected passage stored exactly once and a true report.
Marked slow (minutes): `make test-slow`, or run the script itself for the full-size figures."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "chaos.py"


def _chaos():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("dpr_chaos", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("broker", ["aof", "ephemeral"])
def test_no_passage_lost_or_duplicated_through_kills_and_broker_restarts(broker: str) -> None:
    outcome = _chaos().run(broker, docs=300, kills=15, restarts=2, workers=2)
    assert outcome.ok, outcome.problems
    assert (outcome.kills, outcome.restarts) == (15, 2)
    assert outcome.stored == outcome.expected > 300 and outcome.cli_documents == 300
