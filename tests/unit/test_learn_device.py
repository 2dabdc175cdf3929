"""Where training runs: the CPU unless ``DPR_ENCODER__DEVICE`` names another torch device (the product needs no GPU;
one only makes `dpr adapt` faster). The trainer's arguments follow the configured device."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from services.lab.shared import training_run
from services.lab.towers.trainer import TrainConfig

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    before = training_run.learn_device()
    yield
    training_run.configure_device(before)


def test_training_runs_on_the_cpu_unless_a_device_is_configured(tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformerTrainingArguments

    assert training_run.learn_device() == "cpu"
    on_cpu = training_run.training_arguments(SentenceTransformerTrainingArguments, TrainConfig(), tmp_path)
    assert on_cpu.use_cpu is True
    training_run.configure_device("cuda:1")
    assert training_run.learn_device() == "cuda:1"
    assert training_run.training_arguments(SentenceTransformerTrainingArguments, TrainConfig(), tmp_path).use_cpu \
        is False
