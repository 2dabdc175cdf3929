"""`dpr train`'s run key: the same data resumes its stages after a copy or remount, edited data starts afresh."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from services.lab.towers.recipe import TrainingData
from services.lab.towers.rounds import RoundConfig, _run_key
from services.lab.towers.trainer import TrainConfig

pytestmark = pytest.mark.unit


def _key(folder: Path, **rounds: int) -> str:
    return _run_key(TrainingData(data=folder), TrainConfig(name="x"), RoundConfig(**rounds), folder)


def test_the_key_follows_the_bytes_not_the_modification_times(tmp_path: Path) -> None:
    folder = tmp_path / "beir"
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text('{"_id": "1", "text": "a passage"}\n')
    (folder / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq1\t1\t1\n")
    first = _key(folder)
    for p in folder.rglob("*"):
        os.utime(p, (1, 1))  # a remount or a restore from backup: new times, the same bytes
    assert _key(folder) == first
    assert _key(folder, rounds=4) == first  # asking for more rounds goes on from the stages there are
    (folder / "corpus.jsonl").write_text('{"_id": "1", "text": "a passage, edited"}\n')
    assert _key(folder) != first
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    assert _key(copy) != _key(folder)  # the path is part of the key: another folder is another run
