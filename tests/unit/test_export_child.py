"""A process that serves ONNX towers makes a missing export in a spawned child (encoders.registry.export_model), so
it never imports torch itself; a child's failure comes back as the usual "no ONNX export" (None)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from encoders import registry, spawned

pytestmark = pytest.mark.unit


def pid_exporter(model_path: Path, export_dir: Path) -> dict:
    """Stands in for the real exporter: records which process ran it (module level, so a spawned child can import
    it)."""
    export_dir.mkdir(parents=True, exist_ok=True)
    manifest = {"exported_by": os.getpid(), "model_path": str(model_path)}
    (export_dir / "made.json").write_text(json.dumps(manifest))
    return manifest


def failing_exporter(model_path: Path, export_dir: Path) -> dict:
    raise RuntimeError(f"cannot export {model_path}")


def test_the_export_runs_in_a_child_process(tmp_path: Path) -> None:
    model = tmp_path / "models" / "m"
    model.mkdir(parents=True)
    from encoders.onnx_export import ensure_export

    manifest = spawned.call_in_child(ensure_export, model, tmp_path / "export", pid_exporter)
    assert manifest["model_path"] == str(model)
    assert manifest["exported_by"] != os.getpid()
    assert json.loads((tmp_path / "export" / "made.json").read_text())["exported_by"] == manifest["exported_by"]


def test_a_failed_export_in_the_child_is_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "models" / "m"
    model.mkdir(parents=True)
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # so export_model takes the child path
    assert registry.export_model(model, tmp_path / "models", tmp_path / "cache", failing_exporter) is None


def test_a_process_without_torch_does_not_import_it_to_export(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from encoders import registry\n"
        "from tests.unit.test_export_child import pid_exporter\n"
        f"m = registry.export_model(Path({str(tmp_path / 'm')!r}), Path({str(tmp_path)!r}),"
        f" Path({str(tmp_path / 'c')!r}), pid_exporter)\n"
        "print(m['exported_by'] != __import__('os').getpid(), 'torch' in sys.modules)\n"
    )
    (tmp_path / "m").mkdir()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.split() == ["True", "False"], out.stderr


def slow_exporter(model_path: Path, export_dir: Path) -> dict:
    """Records its pid, then takes a while (the parent is killed meanwhile)."""
    import time

    export_dir.mkdir(parents=True, exist_ok=True)
    (export_dir / "pid").write_text(str(os.getpid()))
    time.sleep(1.5)
    (export_dir / "made.json").write_text("{}")
    return {"exported_by": os.getpid()}


def _running(pid: int) -> bool:
    """The process exists and has not exited (a zombie, exited but not yet reaped by init, counts as gone)."""
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def test_a_parent_killed_mid_export_leaves_no_process_behind(tmp_path: Path) -> None:
    """A `dpr serve` killed while its export child works: the child finishes the export and exits (a process pool's
    worker used to wait for the next call for ever, holding ~1 GB)."""
    import signal
    import time

    root = Path(__file__).resolve().parents[2]
    (tmp_path / "m").mkdir()
    code = (
        "from pathlib import Path\n"
        "from encoders import spawned\n"
        "from encoders.onnx_export import ensure_export\n"
        "from tests.unit.test_export_child import slow_exporter\n"
        f"spawned.call_in_child(ensure_export, Path({str(tmp_path / 'm')!r}), Path({str(tmp_path / 'e')!r}),"
        " slow_exporter)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    pid_file = tmp_path / "e" / "pid"
    deadline = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pid_file.exists(), "the export child never started"
    child = int(pid_file.read_text())
    parent.send_signal(signal.SIGKILL)
    parent.wait(10)
    deadline = time.monotonic() + 30
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(child), "the export child outlived its killed parent"
    assert (tmp_path / "e" / "made.json").exists()  # it finished the export, for the next start to find


def _export_from_a_daemon(model: str, export_dir: str, answers: object) -> None:
    from encoders.onnx_export import ensure_export

    try:
        answers.put(spawned.call_in_child(ensure_export, Path(model), Path(export_dir), pid_exporter))  # type: ignore[attr-defined]
    except BaseException as e:
        answers.put(repr(e))  # type: ignore[attr-defined]


def test_a_daemonic_process_exports_too(tmp_path: Path) -> None:
    """A Celery worker's pool process is daemonic, and a daemonic process may not start multiprocessing children:
    every worker fell back to torch for a new model. The child is a plain process now."""
    import multiprocessing

    (tmp_path / "m").mkdir()
    context = multiprocessing.get_context("fork")
    answers = context.Queue()
    daemon = context.Process(target=_export_from_a_daemon, daemon=True,
                             args=(str(tmp_path / "m"), str(tmp_path / "e"), answers))
    daemon.start()
    answer = answers.get(timeout=120)
    daemon.join(30)
    assert isinstance(answer, dict), answer
    assert answer["exported_by"] not in (os.getpid(), daemon.pid)
