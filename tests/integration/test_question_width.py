"""Questions run on OpenVINO padded (``padded_width``: one shape for every single question, a multiple of 8 tokens
for a short batch, so the CPU plugin does not prepare its kernels again for each new width): their vectors are the
ones they get unpadded. The real base model, its real export."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from encoders.registry import build_towers
from encoders.runtimes import SINGLE_WIDTH, choose, padded_width
from encoders.towers import DualEncoder, base_model_path

pytestmark = pytest.mark.integration

QUESTIONS = ["What carries oxygen?", "How does hemoglobin bind oxygen in the lungs and release it in the tissues?"]


def test_the_widths_padded_to() -> None:
    assert [padded_width(1, w) for w in (3, 31, 32, 40)] == [SINGLE_WIDTH, SINGLE_WIDTH, 32, 40]
    assert [padded_width(5, w) for w in (3, 8, 9, 17, 63, 64, 201)] == [8, 8, 16, 24, 64, 64, 201]


@pytest.mark.skipif(choose("query").backend != "openvino-bf16",
                    reason="OpenVINO bf16 questions are chosen only where bf16 runs fast (AMX, AMD AVX512_BF16)")
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


def test_openvino_takes_concurrent_calls_in_turn(onnx_cache: Path) -> None:
    """Two threads encoding at once (`dpr serve`'s two encoder threads) never run OpenVINO at the same time: two
    requests of one compiled model run at once hung OpenVINO in stress runs (encoders/runtimes.py). Each thread
    still gets its own questions' vectors."""
    import threading
    import time

    towers = build_towers(base_model_path(), "base", backend="openvino-fp32", models_dir=onnx_cache / "models",
                          cache_dir=onnx_cache)
    questions = [" ".join(["oxygen"] * n) + "?" for n in range(1, 25)]  # new widths and batch shapes
    alone = {q: towers.encode_queries([q], batch_size=1)[0] for q in questions}
    session = towers._tower("query").session  # type: ignore[attr-defined]
    real, inside, most, count = session._request, [0], [0], threading.Lock()

    class Watched:  # the real request, counting the calls inside it at once
        def infer(self, inputs: dict[str, np.ndarray]) -> object:
            with count:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            try:
                time.sleep(0.002)  # widen the window two unserialised calls would share
                return real.infer(inputs)
            finally:
                with count:
                    inside[0] -= 1

    session._request = Watched()
    got: dict[str, np.ndarray] = {}

    def ask(chunk: list[str]) -> None:
        for i in range(0, len(chunk), 3):
            batch = chunk[i:i + 3]
            got.update(zip(batch, towers.encode_queries(batch, batch_size=3), strict=True))

    threads = [threading.Thread(target=ask, args=(questions[k::2],)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert most[0] == 1
    assert all(float(got[q] @ alone[q]) > 0.9999 for q in questions)
