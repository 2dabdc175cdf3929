"""Data dir format versions (services/core/datadir.py) and `dpr migrate`: new, legacy, current, older, newer,
corrupt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from entrypoints.cli.main import app
from services.core import datadir
from services.core.errors import DataDirFormatError
from services.core.settings import Settings
from services.store.edge.engine import EdgeEngine

pytestmark = pytest.mark.unit


def _write_format(data: Path, number: int, by: str = "dpr-ingest 9.9.9") -> None:
    data.mkdir(parents=True, exist_ok=True)
    (data / "FORMAT").write_text(json.dumps({"format": number, "written_by": by}))


def test_a_new_dir_has_no_format_and_is_stamped_on_first_write(tmp_path: Path) -> None:
    data = tmp_path / "new"
    assert datadir.check(data).format is None
    datadir.ensure_writable(data)
    recorded = json.loads((data / "FORMAT").read_text())
    assert recorded["format"] == datadir.CURRENT and recorded["written_by"].startswith("dpr-ingest")


def test_a_used_dir_without_format_is_format_1_and_is_not_written_by_reading(tmp_path: Path) -> None:
    data = tmp_path / "old"
    (data / "store").mkdir(parents=True)
    state = datadir.check(data)
    assert (state.format, state.recorded) == (1, False)
    assert not (data / "FORMAT").exists(), "reading must not write"


def test_a_newer_dir_is_refused_naming_the_version_and_the_fix(tmp_path: Path) -> None:
    data = tmp_path / "newer"
    _write_format(data, datadir.CURRENT + 1, "dpr-ingest 7.0.0")
    with pytest.raises(DataDirFormatError) as e:
        datadir.check(data)
    message = str(e.value)
    assert f"format {datadir.CURRENT + 1}" in message and "dpr-ingest 7.0.0" in message and "upgrade dpr" in message
    with pytest.raises(DataDirFormatError):  # the store refuses it before reading anything
        EdgeEngine.from_settings(Settings(data_dir=data))
    result = CliRunner().invoke(app, ["--data-dir", str(data), "status", "--json"])
    assert result.exit_code == 1
    assert "upgrade dpr" in result.stderr and "Traceback" not in result.output + result.stderr


def test_an_older_dir_is_refused_naming_migrate_then_migrate_upgrades_it(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "older"
    _write_format(data, 1)
    (data / "store").mkdir()
    steps: list[Path] = []

    def step(path: Path) -> None:
        steps.append(path)
        (path / "store" / "migrated").write_text("2")

    monkeypatch.setattr(datadir, "CURRENT", 2)
    monkeypatch.setattr(datadir, "OPENS_AS_IS", frozenset({2}))
    monkeypatch.setattr(datadir, "MIGRATIONS", {1: step})
    with pytest.raises(DataDirFormatError, match="dpr --data-dir .* migrate"):
        datadir.check(data)
    result = CliRunner().invoke(app, ["--data-dir", str(data), "migrate", "--json"])
    assert result.exit_code == 0, result.output + result.stderr
    report = json.loads(result.stdout)
    assert (report["from"], report["to"], report["steps"]) == (1, 2, ["1 -> 2"])
    assert len(steps) == 1 and steps[0] != data, "the step runs on a copy beside the data dir"
    assert (data / "store" / "migrated").read_text() == "2" and sorted(tmp_path.iterdir()) == [data]
    assert json.loads((data / "FORMAT").read_text())["format"] == 2
    assert datadir.check(data).format == 2
    again = CliRunner().invoke(app, ["--data-dir", str(data), "migrate", "--json"])
    assert json.loads(again.stdout)["steps"] == [] and len(steps) == 1, "a second migrate does nothing"


def _tree(root: Path) -> dict[str, bytes | None]:
    return {p.relative_to(root).as_posix(): p.read_bytes() if p.is_file() else None for p in root.rglob("*")}


def test_a_migration_that_fails_leaves_the_data_dir_as_it_was_and_says_so(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "older"
    _write_format(data, 1)
    (data / "store" / "passages").mkdir(parents=True)
    (data / "store" / "passages" / "CURRENT").write_text("g1\n")
    before = _tree(data)

    def half_done(path: Path) -> None:
        (path / "store" / "passages" / "CURRENT").write_text("g2\n")
        (path / "store" / "new").mkdir()
        raise DataDirFormatError("step 1 -> 2 met a passage it cannot convert")

    monkeypatch.setattr(datadir, "CURRENT", 2)
    monkeypatch.setattr(datadir, "MIGRATIONS", {1: half_done})
    result = CliRunner().invoke(app, ["--data-dir", str(data), "migrate"])
    assert result.exit_code == 1 and "cannot convert" in result.stderr and "as it was" in result.stderr
    assert _tree(data) == before and sorted(tmp_path.iterdir()) == [data], "nothing changed, nothing left beside"


def test_migrate_stamps_a_legacy_dir_and_refuses_what_is_not_a_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "legacy"
    (data / "jobs").mkdir(parents=True)
    result = CliRunner().invoke(app, ["--data-dir", str(data), "migrate", "--json"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["steps"] == ["stamped"]
    assert datadir.read_format(data).recorded
    empty = CliRunner().invoke(app, ["--data-dir", str(tmp_path / "nothing"), "migrate"])
    assert empty.exit_code == 1 and "not a data dir" in empty.stderr


def test_a_corrupt_format_file_is_refused_with_the_fix(tmp_path: Path) -> None:
    data = tmp_path / "corrupt"
    data.mkdir()
    (data / "FORMAT").write_text("{not json")
    with pytest.raises(DataDirFormatError, match="cannot be read"):
        datadir.check(data)
    (data / "FORMAT").write_text('{"format": "one"}')
    with pytest.raises(DataDirFormatError, match="positive integer"):
        datadir.check(data)
