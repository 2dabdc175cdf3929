"""Questions run on OpenVINO padded (``padded_width``: one shape for every single question, a multiple of 8 tokens
for a short batch, so the CPU plugin does not prepare its kernels again for each new width): their vectors are the
ones they get unpadded. The real base model, its real export."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from encoders.registry import build_towers
from encoders.runtimes import SINGLE_WIDTH, cpu_flags, padded_width
from encoders.towers import DualEncoder, base_model_path

pytestmark = pytest.mark.integration

QUESTIONS = ["What carries oxygen?", "How does hemoglobin bind oxygen in the lungs and release it in the tissues?"]


def test_the_widths_padded_to() -> None:
    assert [padded_width(1, w) for w in (3, 31, 32, 40)] == [SINGLE_WIDTH, SINGLE_WIDTH, 32, 40]
    assert [padded_width(5, w) for w in (3, 8, 9, 17, 63, 64, 201)] == [8, 8, 16, 24, 64, 64, 201]


@pytest.mark.skipif("amx_bf16" not in cpu_flags(), reason="OpenVINO bf16 is chosen only with AMX")
def test_a_padded_question_gets_its_own_vector(onnx_cache: Path) -> None:
    def towers(backend: str) -> DualEncoder:
        return build_towers(base_model_path(), "base", backend=backend,  # type: ignore[arg-type]
                            models_dir=onnx_cache / "models", cache_dir=onnx_cache)

    ov, fp32 = towers("openvino-bf16"), towers("onnx")
    widths = [len(ov.passage_token_offsets(q)) + 2 for q in QUESTIONS]
    assert all(padded_width(1, w) > w and padded_width(2, w) > w for w in widths), widths  # each one padded
    for question in QUESTIONS:
        alone = ov.encode_queries([question], batch_size=1)[0]
        batched = ov.encode_queries([question, question], batch_size=2)[0]
        unpadded = fp32.encode_queries([question], batch_size=1)[0]
        assert float(alone @ batched) > 0.9999, question
        assert float(alone @ unpadded) > 0.999, question  # bf16 against fp32 at its own width
    a, b = ov.encode_queries(QUESTIONS, batch_size=1)
    assert float(a @ b) < 0.99  # different questions stay different vectors
    assert np.isfinite(a).all() and np.isfinite(b).all()
