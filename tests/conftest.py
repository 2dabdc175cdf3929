"""Session-wide fixtures and guards.

- Every test names its suite (``unit`` / ``integration`` / ``slow``): collection refuses a test with none.
- Settings come from the test alone: every test runs with the ``DPR_*`` variables removed and no ``.env`` file
  read (``kit.policy.scrub_settings_env``), so a developer's ``DPR_BROKER_URL`` changes nothing it exercises;
  only ``DPR_ONNX_CACHE`` is set, to one export cache for the session (``onnx_cache``).
- ``unit`` tests may not open network connections (loopback included): a guard replaces socket.connect; nor
  export a real model to ONNX (``encoders.spawned.call_in_child`` raises for one).
- ``shared_data``: the ``../shared/data`` folder beside the repo (present on developer machines and CI, not on a
  user's machine); tests that need it skip with a reason when it is missing.
- ``base_towers``: the real all-MiniLM-L6-v2 towers from the wheel, loaded once per session.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings as hypothesis_settings
from kit.policy import refuse_unmarked, scrub_settings_env

# Property tests run the same examples every time (`derandomize`), so a CI run cannot fail on an example no earlier
# run met; HYPOTHESIS_PROFILE=explore draws new ones (run it now and then, and keep what it finds as a test).
hypothesis_settings.register_profile("deterministic", derandomize=True, database=None)
hypothesis_settings.register_profile("explore", derandomize=False)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


class NetworkBlocked(RuntimeError):
    pass


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects: an unmarked test is an error whatever the selection
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    refuse_unmarked(items)


@pytest.fixture(scope="session")
def onnx_cache(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Path:
    """One ONNX export cache for the session: the default question backend (onnx) exports the base model once
    (~20 s), not once per test's data dir (exports are keyed by the model's fingerprint, so sharing is safe).
    Under pytest-xdist the workers of one run share it too (beside their own temp dirs: one export, made under
    the export's file lock by whichever worker asks first), never a later run's."""
    if not hasattr(pytestconfig, "workerinput"):  # not an xdist worker
        return tmp_path_factory.mktemp("onnx-cache")
    shared = tmp_path_factory.getbasetemp().parent / "onnx-cache"
    shared.mkdir(exist_ok=True)
    return shared


@pytest.fixture(autouse=True)
def _settings_from_the_test_alone(monkeypatch: pytest.MonkeyPatch, onnx_cache: Path) -> None:
    scrub_settings_env(monkeypatch)
    monkeypatch.setenv("DPR_ONNX_CACHE", str(onnx_cache))


@pytest.fixture(autouse=True)
def _block_network_in_unit_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("unit") is None:
        return
    real_connect = socket.socket.connect

    def guarded(self: socket.socket, address: object) -> None:
        if self.family == socket.AF_UNIX:
            return real_connect(self, address)  # type: ignore[arg-type]
        raise NetworkBlocked(f"unit tests may not open network connections (tried {address!r})")

    monkeypatch.setattr(socket.socket, "connect", guarded)


class RealModelInUnitTest(BaseException):  # not an Exception: the export's own fallback must not swallow it
    pass


@pytest.fixture(autouse=True)
def _no_model_export_in_unit_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A unit test that reaches the ONNX export of a real model (20-50 s: a torch load in the export's child) fails
    here: it should have been refused earlier, or use ``kit.fakes``."""
    if request.node.get_closest_marker("unit") is None:
        return
    import encoders.spawned

    def guarded(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: object, **kwargs: object) -> Any:
            for model in (a for a in args if isinstance(a, Path)):
                if any((model / weights).exists() for weights in ("model.safetensors", "pytorch_model.bin")):
                    raise RealModelInUnitTest(f"a unit test asked for the ONNX export of the model at {model}")
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(encoders.spawned, "call_in_child", guarded(encoders.spawned.call_in_child))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"needs ../shared/data beside the repo ({SHARED_DATA} is missing)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def base_towers() -> Iterator[object]:
    from encoders.towers import SentenceTransformerTowers, base_model_path

    towers = SentenceTransformerTowers(base_model_path(), name="base")
    _ = towers.model  # load once, here
    yield towers
