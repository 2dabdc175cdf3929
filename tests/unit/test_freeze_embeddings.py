"""Word embeddings frozen for a large vocabulary (multilingual), trained otherwise, or as the flag says."""

from __future__ import annotations

import pytest

from services.lab.towers.trainer import LARGE_VOCABULARY, freeze_word_embeddings

pytestmark = pytest.mark.unit


def _towers(vocabulary: int) -> object:
    import torch

    class Embeddings(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.word_embeddings = torch.nn.Embedding(vocabulary, 4)
            self.position_embeddings = torch.nn.Embedding(8, 4)

    class Towers(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.query, self.document = Embeddings(), Embeddings()

    return Towers()


def test_auto_freezes_only_a_large_vocabulary_and_the_flag_wins() -> None:
    small, large = _towers(100), _towers(LARGE_VOCABULARY)
    assert freeze_word_embeddings(small, None) == 0
    assert all(p.requires_grad for p in small.parameters())  # type: ignore[attr-defined]
    assert freeze_word_embeddings(large, None) == 2 * LARGE_VOCABULARY * 4  # both towers
    trainable = {n for n, p in large.named_parameters() if p.requires_grad}  # type: ignore[attr-defined]
    assert trainable == {"query.position_embeddings.weight", "document.position_embeddings.weight"}
    assert freeze_word_embeddings(small, True) == 2 * 100 * 4
    assert freeze_word_embeddings(_towers(LARGE_VOCABULARY), False) == 0
