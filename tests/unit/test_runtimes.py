"""The runtime and precision of each tower, chosen from the CPU's features (``encoders.runtimes``): OpenVINO bf16
where the CPU has AMX or is an AMD one with AVX512_BF16, OpenVINO fp32 passages and ONNX Runtime fp32 questions
elsewhere, an explicit setting always first, and ``ONEDNN_MAX_CPU_ISA`` masking the newer paths the way oneDNN
does."""

from __future__ import annotations

from pathlib import Path

import pytest

from encoders import runtimes
from encoders.runtimes import choose, cpu_flags

pytestmark = pytest.mark.unit

SAPPHIRE = frozenset({"avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"})
EPYC = frozenset({"avx2", "fma"})
ZEN5 = frozenset({"avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16"})  # AMD EPYC, family 26


def test_amx_gets_openvino_bf16_for_both_towers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtimes, "runtime_version", lambda backend: "2026.4.1")
    assert choose("document", flags=SAPPHIRE).backend == "openvino-bf16"
    assert choose("query", flags=SAPPHIRE).backend == "openvino-bf16"
    assert "AMX" in choose("document", flags=SAPPHIRE).reason


def test_without_amx_faithful_fp32_openvino_passages_and_onnx_questions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtimes, "runtime_version", lambda backend: "2026.4.1")
    assert choose("document", flags=EPYC).backend == "openvino-fp32"
    assert choose("query", flags=EPYC).backend == "onnx"
    no_amx = SAPPHIRE - {"amx_tile", "amx_bf16", "amx_int8"}  # Intel's AVX512_BF16 alone: measured slower than fp32
    assert choose("document", flags=no_amx, vendor="GenuineIntel").backend == "openvino-fp32"
    assert choose("query", flags=no_amx, vendor="GenuineIntel").backend == "onnx"
    assert "faithful" in choose("document", flags=no_amx, vendor="GenuineIntel").reason
    assert choose("document", flags=ZEN5 - {"avx512_bf16"}, vendor="AuthenticAMD").backend == "openvino-fp32"


def test_amd_with_avx512_bf16_gets_openvino_bf16_for_both_towers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtimes, "runtime_version", lambda backend: "2026.4.1")
    for role in ("document", "query"):
        chosen = choose(role, flags=ZEN5, vendor="AuthenticAMD")  # type: ignore[arg-type]
        assert chosen.backend == "openvino-bf16" and "AVX512_BF16 (AMD)" in chosen.reason
    assert choose("document", flags=ZEN5, vendor="GenuineIntel").backend == "openvino-fp32"


def test_without_openvino_installed_onnx_fp32_with_one_line(monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(runtimes, "runtime_version", lambda backend: None if "openvino" in backend else "1")
    assert choose("document", flags=SAPPHIRE).backend == "onnx"  # never int8 unless asked: not faithful
    assert any("openvino is not installed" in r.getMessage() for r in caplog.records)
    assert choose("document", flags=EPYC).backend == "onnx"


@pytest.mark.parametrize(("configured", "question", "passages_backend", "questions_backend"), [
    ("onnx-int8", None, "onnx-int8", "onnx"),  # explicit int8 passages: fp32 questions, as before
    ("torch", None, "torch", "torch"),
    ("openvino-bf16", None, "openvino-bf16", "openvino-bf16"),
    ("auto", "onnx", "openvino-bf16", "onnx"),  # an explicit question backend wins over the CPU's choice
    ("onnx", "torch", "onnx", "torch"),
    ("openvino-fp32", None, "openvino-fp32", "openvino-fp32"),
])
def test_an_explicit_setting_wins_and_says_so(monkeypatch: pytest.MonkeyPatch, configured: str,
                                              question: str | None, passages_backend: str,
                                              questions_backend: str) -> None:
    monkeypatch.setattr(runtimes, "runtime_version", lambda backend: "1")
    monkeypatch.setattr(runtimes, "cpu_flags", lambda: SAPPHIRE)
    from services.core.settings import EncoderSettings

    encoder = EncoderSettings(backend=configured, question_backend=question)  # type: ignore[arg-type]
    assert (encoder.passages, encoder.questions) == (passages_backend, questions_backend)
    if configured != "auto":
        assert "DPR_ENCODER__BACKEND" in encoder.choice("document").reason


def test_cpu_flags_masked_like_onednn(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 fma avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile\n\n"
                    "processor\t: 1\nflags\t\t: fpu avx2\n")
    assert "amx_bf16" in cpu_flags(info, env={})
    assert cpu_flags(info, env={"ONEDNN_MAX_CPU_ISA": "AVX2"}) == {"fpu", "avx2", "fma"}
    assert cpu_flags(info, env={"ONEDNN_MAX_CPU_ISA": "avx512_core_vnni"}) == {
        "fpu", "avx2", "fma", "avx512f", "avx512_vnni"}
    assert cpu_flags(tmp_path / "none", env={}) == frozenset()


def test_cpu_vendor_read_from_cpuinfo(tmp_path: Path) -> None:
    from encoders.runtimes import cpu_vendor

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: avx2 avx512_bf16\n\n"
                    "processor\t: 1\nvendor_id\t: GenuineIntel\n")
    assert cpu_vendor(info) == "AuthenticAMD"
    assert cpu_vendor(tmp_path / "none") == ""


def test_training_runs_in_bf16_autocast_where_bf16_was_measured_faster() -> None:
    from encoders.runtimes import training_precision

    assert training_precision(flags=SAPPHIRE)[0] == "bf16"
    assert training_precision(flags=SAPPHIRE - {"amx_bf16", "amx_tile", "amx_int8"}, vendor="GenuineIntel")[0] == "fp32"
    assert training_precision(flags=ZEN5, vendor="AuthenticAMD") == (
        "bf16", "AVX512_BF16 (AMD) on this CPU: bf16 autocast")
    assert training_precision(flags=ZEN5 - {"avx512_bf16"}, vendor="AuthenticAMD")[0] == "fp32"
    assert training_precision(flags=EPYC)[0] == "fp32"
    assert training_precision("fp32", flags=SAPPHIRE) == ("fp32", "set by the recipe (precision)")
    assert training_precision("bf16", flags=EPYC)[0] == "bf16"


def test_the_trainer_arguments_carry_the_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    from sentence_transformers import SentenceTransformerTrainingArguments

    from services.lab.shared import training_run
    from services.lab.towers.trainer import TrainConfig

    monkeypatch.setattr(runtimes, "cpu_flags", lambda: SAPPHIRE)
    args = training_run.training_arguments(SentenceTransformerTrainingArguments, TrainConfig(), Path("/nonexistent"))
    assert args.bf16 is True and training_run.precision_of(TrainConfig()) == "bf16"
    monkeypatch.setattr(runtimes, "cpu_flags", lambda: EPYC)
    args = training_run.training_arguments(SentenceTransformerTrainingArguments, TrainConfig(), Path("/nonexistent"))
    assert args.bf16 is False
    fp32 = TrainConfig(precision="fp32")
    monkeypatch.setattr(runtimes, "cpu_flags", lambda: SAPPHIRE)
    assert training_run.training_arguments(SentenceTransformerTrainingArguments, fp32, Path("/x")).bf16 is False


@pytest.mark.parametrize("chosen", ["openvino-bf16", "openvino-fp32"])
def test_an_openvino_that_cannot_run_falls_back_to_faithful_fp32_with_one_line(
        chosen: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from encoders import registry
    from encoders.onnx_towers import RuntimeUnavailable

    built: list[str] = []

    class Towers:  # stands in for OnnxTowers: OpenVINO refuses this CPU, onnxruntime loads
        def __init__(self, export_dir: Path, path: Path, backend: str, **_: object) -> None:
            built.append(backend)
            if backend.startswith("openvino"):
                raise RuntimeUnavailable("not on this CPU")
            self.backend = backend

        def load(self, role: str) -> Towers:
            return self

    monkeypatch.setattr(registry, "OnnxTowers", Towers)
    towers = registry.build_towers(tmp_path / "m", "m", backend=chosen, models_dir=tmp_path)  # type: ignore[arg-type]
    assert built == [chosen, "onnx"] and towers.backend == "onnx"  # type: ignore[attr-defined]
    assert [r.getMessage() for r in caplog.records if "falling back" in r.getMessage()] == [
        "the chosen runtime cannot run here; falling back to onnx (fp32)"]
