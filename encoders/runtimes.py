"""Which runtime and precision run each tower on this CPU, and the OpenVINO session that runs one: the one place
that choice is made (ARCHITECTURE.md, fifth wave). The store, the ingest job and the API never branch on it.

``choose`` reads the CPU's features (``cpu_flags``) and picks, with no settings, the fastest path measured on that
class of CPU (figures in docs/capacity.md, ``benchmarks/bench_runtimes.py`` reprints them):

- AMX (``amx_bf16``: Intel Sapphire Rapids and later): OpenVINO bf16 for both towers, faithful to fp32 (cosine
  0.99998, top 10 kept 0.998). On a 2-core Xeon with AMX, 1,518 SciFact passages: 1.5-2.5x ONNX Runtime int8's
  passages/s by the load (1.96x in results/ingest-speed/runtimes.md); `dpr query`'s dense p50 0.58x what it was on
  ONNX Runtime fp32 (the same file, quiet).
- AVX512_BF16 on an AMD CPU (Zen 4 and later), no AMX: OpenVINO bf16 for both towers too. On a 2-core AMD EPYC
  (Zen 5, family 26; Zen 4 not measured), the same 1,518 passages: 1.6x OpenVINO fp32's passages/s (122 against
  75) and 1.3x ONNX Runtime int8's, cosine 0.99998; a question 0.65x ONNX Runtime fp32's CPU (3.0 against 4.6 ms,
  one thread). On an Intel CPU that has AVX512_BF16 without AMX (Cooper Lake, a VM hiding AMX) bf16 was measured
  slower: fp32 there.
- anything else: OpenVINO fp32 passages and ONNX Runtime fp32 questions, both faithful (the fp32 graph; cosine
  1.0). Measured with oneDNN capped at AVX-512 VNNI on the same Xeon (CPU seconds a batch of 16 x 200 tokens, one
  thread): OpenVINO fp32 0.61, ONNX Runtime fp32 0.77, ONNX Runtime int8 0.48; capped at AVX2: 0.79 (ONNX Runtime
  cannot be capped). int8 (the fourth wave's path, ``DPR_ENCODER__BACKEND=onnx-int8``) is faster but not faithful
  by the 0.999 rule (cosine 0.9972; SciFact nDCG@10 -0.0031); OpenVINO bf16 on Intel without AMX is slower than
  fp32 (FACTS.md: 0.97x ONNX fp32 with AVX512_BF16; 25x OpenVINO fp32's CPU capped at AVX-512 VNNI). A single
  question costs OpenVINO fp32 1.3-2.2x ONNX Runtime fp32's CPU (padded to 32 tokens; 9-11 against 5-7 ms, ad-hoc,
  one thread): questions stay on ONNX Runtime.

An explicit ``DPR_ENCODER__BACKEND`` wins and is reported as the reason. The CPU's features can be masked the way
oneDNN is (``ONEDNN_MAX_CPU_ISA=AVX2`` or ``AVX512_CORE_VNNI``): the choice then follows the masked CPU, which is how
the benchmarks emulate an older one. Importing this module imports no runtime.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

log = logging.getLogger(__name__)

Backend = Literal["torch", "onnx", "onnx-int8", "openvino-bf16", "openvino-fp32"]
Setting = Literal["auto", "torch", "onnx", "onnx-int8", "openvino-bf16", "openvino-fp32"]
OPENVINO_PRECISION: dict[str, str] = {"openvino-bf16": "bf16", "openvino-fp32": "f32"}  # OpenVINO's hint, by backend
Role = Literal["query", "document"]
CPUINFO = Path("/proc/cpuinfo")
# ONEDNN_MAX_CPU_ISA values (oneDNN's names) -> the /proc/cpuinfo flags a CPU capped there does not use
_MASKS: dict[str, tuple[str, ...]] = {
    "SSE41": ("avx", "avx2", "fma", "avx512", "amx", "avx_vnni"),
    "AVX": ("avx2", "fma", "avx512", "amx", "avx_vnni"),
    "AVX2": ("avx512", "amx", "avx_vnni"),
    "AVX2_VNNI": ("avx512", "amx"),
    "AVX2_VNNI_2": ("avx512", "amx"),
    "AVX512_CORE": ("avx512_vnni", "avx512_bf16", "avx512_fp16", "amx"),
    "AVX512_CORE_VNNI": ("avx512_bf16", "avx512_fp16", "amx"),
    "AVX512_CORE_BF16": ("avx512_fp16", "amx"),
    "AVX512_CORE_FP16": ("amx",),
}


@dataclass(frozen=True)
class Choice:
    """The runtime and precision of one tower, and why."""

    backend: Backend
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"backend": self.backend, "reason": self.reason}


def cpu_flags(cpuinfo: Path = CPUINFO, env: Mapping[str, str] | None = None) -> frozenset[str]:
    """The CPU's feature flags (``/proc/cpuinfo``), less those ``ONEDNN_MAX_CPU_ISA`` caps (a prefix match: AVX2
    removes every ``avx512*`` and ``amx*`` flag). Empty where there is no cpuinfo (not Linux)."""
    cap = (env if env is not None else os.environ).get("ONEDNN_MAX_CPU_ISA", "")
    return _masked_flags(cpuinfo, cap.strip().upper())


@functools.lru_cache(maxsize=8)
def _masked_flags(cpuinfo: Path, cap: str) -> frozenset[str]:  # once a process: each question asks (choose)
    masked = _MASKS.get(cap, ())
    flags = _cpuinfo(cpuinfo).get("flags", "").split()
    return frozenset(f for f in flags if not any(f.startswith(m) for m in masked))


def cpu_vendor(cpuinfo: Path = CPUINFO) -> str:
    """The CPU's ``vendor_id`` (GenuineIntel, AuthenticAMD; empty where there is no cpuinfo)."""
    return _cpuinfo(cpuinfo).get("vendor_id", "")


@functools.lru_cache(maxsize=4)
def _cpuinfo(cpuinfo: Path) -> dict[str, str]:
    """The first processor's fields in ``cpuinfo``."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def runtime_version(backend: Backend) -> str | None:
    """The installed version of the runtime behind ``backend`` (None: not installed), read without importing it."""
    return _package_version({"torch": "torch", "onnx": "onnxruntime", "onnx-int8": "onnxruntime",
                             "openvino-bf16": "openvino", "openvino-fp32": "openvino"}[backend])


@functools.lru_cache(maxsize=8)
def _package_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def choose(role: Role, configured: Setting = "auto", *, passages: Setting | None = None,
           flags: frozenset[str] | None = None, vendor: str = "") -> Choice:
    """The backend of the ``role`` tower. ``configured``: the setting for that tower (``DPR_ENCODER__BACKEND``, or
    ``DPR_ENCODER__QUESTION_BACKEND`` for questions); ``passages``: for a question tower left unset, the passage
    setting, which it follows (beside explicit onnx-int8 passages, fp32 questions: int8's rounding off one side of
    every score for a few milliseconds a question). ``flags`` and ``vendor`` describe a CPU (default: this one)."""
    if configured != "auto":
        return Choice(configured, "set by DPR_ENCODER__QUESTION_BACKEND" if role == "query"
                      else "set by DPR_ENCODER__BACKEND")
    if role == "query" and passages not in (None, "auto"):
        backend: Backend = "onnx" if passages == "onnx-int8" else passages  # type: ignore[assignment]
        return Choice(backend, f"follows DPR_ENCODER__BACKEND={passages}")
    if flags is None:
        flags, vendor = cpu_flags(), cpu_vendor()
    bf16 = _bf16_measured_faster(flags, vendor)
    if bf16 is not None:
        if runtime_version("openvino-bf16") is not None:
            return Choice("openvino-bf16", f"{bf16[0]} on this CPU: OpenVINO bf16, {bf16[1]}")
        log.warning("this CPU has %s but openvino is not installed; the towers run on ONNX Runtime fp32 "
                    "(pip install openvino for ~2-3x)", bf16[0])
    if role == "query":
        return Choice("onnx", "no bf16 unit measured faster on this CPU: ONNX Runtime fp32 questions, 0.45-0.75x "
                      "OpenVINO fp32's CPU at a question's width (docs/capacity.md)")
    if runtime_version("openvino-fp32") is not None:
        return Choice("openvino-fp32", "no bf16 unit measured faster on this CPU: OpenVINO fp32 passages, faithful "
                      "to fp32 and 1.26x ONNX Runtime fp32's CPU a passage; int8 is faster but not faithful "
                      "(docs/capacity.md)")
    return Choice("onnx", "no bf16 unit measured faster on this CPU and no openvino: ONNX Runtime fp32 "
                  "(docs/capacity.md)")


def _bf16_measured_faster(flags: frozenset[str], vendor: str) -> tuple[str, str] | None:
    """(the unit, what it measured) where bf16 was measured the fastest faithful path on this class of CPU; None
    elsewhere. Measured: AMX (Intel Sapphire Rapids and later) and AVX512_BF16 on AMD (a Zen 5 EPYC; Zen 4 has the
    same instructions, whose bf16 dot products double the fp32 FMA rate there too). On an Intel CPU without AMX (a
    VM that hides it, Cooper Lake) AVX512_BF16 alone was measured slower than fp32 (FACTS.md; oneDNN capped at
    AVX512_CORE_BF16 on a Xeon)."""
    if "amx_bf16" in flags:
        return "AMX bf16", ("measured 1.5-2.5x ONNX Runtime int8's passages/s at cosine 0.99998 to fp32 "
                            "(docs/capacity.md)")
    if "avx512_bf16" in flags and vendor == "AuthenticAMD":
        return "AVX512_BF16 (AMD)", ("measured 1.6x OpenVINO fp32's passages/s and 0.65x ONNX Runtime fp32's CPU a "
                                     "question at cosine 0.99998 to fp32 (AMD EPYC Zen 5; docs/capacity.md)")
    return None


Precision = Literal["auto", "fp32", "bf16"]


def training_precision(configured: str = "auto", *, flags: frozenset[str] | None = None,
                       vendor: str = "") -> tuple[str, str]:
    """(precision, why) of a training run on the CPU: bf16 autocast (weights and optimizer state stay fp32; the
    matrix multiplies run in bf16) where bf16 was measured faster on this class of CPU (``_bf16_measured_faster``),
    fp32 elsewhere; ``configured`` other than auto wins. Measured with the default recipe on SciFact (MNRL on MiniLM,
    batch 32, 128-token passages, 2 quiet cores, ``benchmarks/bench_train_precision.py``): with AMX, bf16 autocast
    took 0.52x fp32's trainer seconds over 30 steps with eager attention (``services.lab.shared.dropout``), the
    whole recipe 0.58x stage for stage; on an AMD EPYC (Zen 5) with AVX512_BF16, 0.39-0.41x over 30 steps and
    the whole recipe 0.44x the wall at dev nDCG@10 -0.0002. Intel without AMX runs bf16 on converted fp32
    kernels: not chosen."""
    if configured in ("fp32", "bf16"):
        return configured, "set by the recipe (precision)"
    if flags is None:
        flags, vendor = cpu_flags(), cpu_vendor()
    bf16 = _bf16_measured_faster(flags, vendor)
    if bf16 is not None:
        return "bf16", f"{bf16[0]} on this CPU: bf16 autocast"
    return "fp32", "no bf16 unit measured faster on this CPU: fp32"


# Input shapes whose kernels OpenVINO keeps: 0 made every question rebuild them (16 ms -> 76 ms a question, 1,000 of
# 3-30 words); 16 keeps the questions' (1.6-2.4 s a hundred, as the default) and bounds the passages'.
RUNTIME_CACHE_SHAPES = 16
# oneDNN primitives (the JIT kernels under those shapes) the process keeps: oneDNN's default, 1,024, is what grew a
# `dpr serve` syncing a source (a sync's few passages are new batch shapes): +1.8 MB of live memory a sync, 70 MB in
# 40 syncs; 256: +19 MB in 40 syncs, the allocator's free lists, none live. Passages and questions cost the same CPU
# at 256 as at 1,024 (64: questions +40% CPU; 0: passages 40% slower). Since questions run at a few padded widths
# (``padded_width``) they need fewer: 128 plateaus 22 MB lower than 256 (60 syncs of 1-17 passages of 64-256 tokens,
# 20 questions between syncs, one process: 333 against 355 MB) for the same CPU a question (4.7-4.8 against 4.3-4.8
# ms; 64: 4.8-5.4 ms, 323 MB). Read by oneDNN once, at its first kernel; a value in the environment wins.
ONEDNN_PRIMITIVES = 128
# A single row (a question) shorter than this many tokens runs padded to it, its attention mask 0 past its tokens
# (the vectors are the same: pooling reads only the real tokens): every question then has one shape, and the CPU
# plugin, which re-prepares every kernel of the graph when an input's width changes (~2 ms on this model), prepares
# them once. Measured on one infer request, 300 single rows of 10-41 tokens (2-core Xeon with AMX, ad-hoc): 1.5-1.6x
# faster than at each row's own width; a 32-token row cost no more than a 20-token one at this size.
SINGLE_WIDTH = 32
# Batches narrower than this (questions batched by `dpr serve`) run at the next multiple of 8 tokens: a few widths
# instead of one per batch; 1.3-1.5x the tower's questions a second in batches of 1-8 rows of 12-39 tokens (ad-hoc,
# one thread, same machine). Passages (wider) keep their width: a batch's compute dwarfs the re-preparation.
SHORT_WIDTH = 64


class OpenVinoSession:
    """An OpenVINO model compiled for the CPU in bf16 or fp32 (``precision``), behind the slice of onnxruntime's
    ``InferenceSession`` that ``encoders.onnx_towers.OnnxTower`` uses (``get_inputs``, ``run``). It reads the
    export's fp32 ``model.onnx``: no second conversion. The compiled blob is cached in ``cache_dir`` (OpenVINO keys
    it by its own version, the graph and the configuration): a second process compiles in ~0.1 s instead of ~0.3 s.

    One infer request, one call at a time (``dpr serve`` encodes on two threads): with two threads each running its
    own request of one compiled model, OpenVINO 2026.4 hung in 14 of 100 stress runs (two processes at once, two
    threads each, 20 new input shapes a thread; 0 of 60 with the calls taken in turn). Taking them in turn costs no
    speed: the model's one stream ran the two threads' requests one after the other anyway (CPU / wall 0.97, one
    thread a request, ad-hoc).

    The CPU plugin keeps what it builds for each input shape (batch x width) it has run, up to
    ``RUNTIME_CACHE_SHAPES`` of them (OpenVINO's default, 5,000, let a long-lived `dpr serve` grow: 2-3 MB of RSS
    for each new passage batch shape), and oneDNN the kernels it built, up to ``ONEDNN_PRIMITIVES`` (issue 70: a
    30-minute soak syncing a source every minute grew `dpr serve` 19-20% with both defaults)."""

    def __init__(self, model_file: Path, threads: int | None, cache_dir: Path | None,
                 precision: str = "bf16") -> None:  # OpenVINO's INFERENCE_PRECISION_HINT (OPENVINO_PRECISION)
        os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(ONEDNN_PRIMITIVES))  # before the first kernel
        import openvino as ov

        config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": precision, "PERFORMANCE_HINT": "LATENCY",
                                  "CPU_RUNTIME_CACHE_CAPACITY": RUNTIME_CACHE_SHAPES}
        if threads:
            config["INFERENCE_NUM_THREADS"] = threads
        if cache_dir is not None:
            cache_dir.mkdir(parents=True, exist_ok=True)
            config["CACHE_DIR"] = str(cache_dir)
        self._model = ov.Core().compile_model(str(model_file), "CPU", config)
        got = str(self._model.get_property("INFERENCE_PRECISION_HINT"))
        if precision == "bf16" and "bf16" not in got and "bfloat16" not in got:
            raise RuntimeError(f"OpenVINO runs this CPU in {got}, not bf16")
        self._names = [i.get_any_name() for i in self._model.inputs]
        self._output = self._model.outputs[0]
        self._request = self._model.create_infer_request()
        self._turn = threading.Lock()

    def get_inputs(self) -> list[Any]:
        return [_Input(n) for n in self._names]

    def run(self, _outputs: Any, feeds: dict[str, Any]) -> list[Any]:
        rows, width = feeds[self._names[0]].shape
        padded = padded_width(rows, width) if "attention_mask" in self._names else width
        inputs = {n: _pad(feeds[n], padded) if padded > width else feeds[n] for n in self._names}  # mask 0 past
        with self._turn:
            out = self._request.infer(inputs)[self._output].copy()
        return [out[:, :width] if padded > width and out.ndim == 3 else out]  # tokens (rows, seq, hidden), or a score


def padded_width(rows: int, width: int) -> int:
    """The width OpenVINO runs ``rows`` inputs of ``width`` tokens at: a single row shorter than ``SINGLE_WIDTH``
    at that width, a batch shorter than ``SHORT_WIDTH`` at the next multiple of 8, anything else as it is."""
    if rows == 1 and width < SINGLE_WIDTH:
        return SINGLE_WIDTH
    if width < SHORT_WIDTH:
        return -(-width // 8) * 8
    return width


def _pad(array: Any, width: int) -> Any:
    import numpy as np

    out = np.zeros((array.shape[0], width), dtype=array.dtype)
    out[:, :array.shape[1]] = array
    return out


@dataclass(frozen=True)
class _Input:
    name: str
