"""Training memory stays bounded when rows carry several hard negatives (feedback's judged negatives,
--hard-negatives N)."""

from __future__ import annotations

import pytest

from services.lab.towers.trainer import AUTO_MINI_BATCH, TrainConfig, bounded_memory

pytestmark = pytest.mark.unit


def test_several_negatives_switch_to_the_cached_loss_unless_told_otherwise() -> None:
    plain = TrainConfig(batch_size=32)
    assert bounded_memory(plain, 1) == plain and not plain.cached  # the fine-tune's one BM25 negative: plain MNRL
    assert bounded_memory(plain, 0) == plain
    many = bounded_memory(plain, 5)
    assert many.cached and many.mini_batch_size == AUTO_MINI_BATCH and many.batch_size == 32
    told = TrainConfig(batch_size=32, mini_batch_size=8)
    assert bounded_memory(told, 5) == told  # an explicit mini-batch is kept
    small = TrainConfig(batch_size=8)
    assert bounded_memory(small, 5) == small  # a batch no larger than the mini-batch has nothing to split
