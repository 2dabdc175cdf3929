"""A question runs on OpenVINO padded to ``SINGLE_WIDTH`` tokens (one shape for every question, so the CPU plugin
prepares its kernels once): its vector is the one it gets at its own width. The real base model, its real export."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from encoders.registry import build_towers
from encoders.runtimes import SINGLE_WIDTH, cpu_flags
from encoders.towers import base_model_path

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif("amx_bf16" not in cpu_flags(), reason="OpenVINO bf16 is chosen only with AMX")]

QUESTIONS = ["What carries oxygen?", "How does hemoglobin bind oxygen in the lungs and release it in the tissues?"]


def test_a_padded_question_gets_its_own_vector(onnx_cache: Path) -> None:
    towers = build_towers(base_model_path(), "base", backend="openvino-bf16", models_dir=onnx_cache / "models",
                          cache_dir=onnx_cache)
    assert all(len(towers.passage_token_offsets(q)) + 2 < SINGLE_WIDTH for q in QUESTIONS)  # each one padded
    for question in QUESTIONS:
        alone = towers.encode_queries([question], batch_size=1)[0]  # one row: padded to SINGLE_WIDTH
        batched = towers.encode_queries([question, question], batch_size=2)[0]  # two rows: at its own width
        assert float(alone @ batched) > 0.9999, question
    a, b = towers.encode_queries(QUESTIONS, batch_size=1)
    assert float(a @ b) < 0.99  # different questions stay different vectors
    assert np.isfinite(towers.encode_queries(["x" * 10], batch_size=1)).all()
