"""A source's sync is an adapter over one ingest job (``services.ingest.job.IngestJob``), here on a folder source,
the in-process executor and the fakes: an item that cannot be read now keeps the documents it gave before (a
records file's rows too), which go only once it is read whole again; a sync with nothing to read hands no job over
and still removes what the source no longer has."""

from __future__ import annotations

from pathlib import Path

import pytest
from kit.fakes import FakeRuntime

from entrypoints.compose import executor_for
from services.sources.registry import Registry, new_spec
from services.sources.sync import SyncReport, sync_source

pytestmark = pytest.mark.unit

ROWS = '{"id": "r1", "text": "a row about the moon"}\n{"id": "r2", "text": "a row about the sun"}\n'


def test_an_item_unreadable_now_keeps_its_documents(tmp_path: Path) -> None:
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "a.txt").write_text("The tide tables are pinned inside the boathouse door.\n")
    (folder / "rows.jsonl").write_text(ROWS)
    with FakeRuntime() as runtime:
        registry = Registry(runtime.settings.data_dir)
        registry.add(new_spec("notes", str(folder)))

        def sync() -> SyncReport:
            return sync_source(runtime, registry, "notes", executor_for(runtime))

        def stored() -> list[str]:
            return sorted(runtime.store.documents())

        first = sync()
        assert (first.outcome, first.added, first.documents) == ("ok", 2, 3)
        assert stored() == ["notes/a.txt", "r1", "r2"]

        (folder / "rows.jsonl").write_text('{"id": "r1", "text": "a row about the moon"}\n{not json\n')
        second = sync()  # r2 is no longer in the file, but the file fails to read: nothing of it goes
        assert (second.failed, second.removed, second.read) == (1, 0, ["rows.jsonl"])
        assert stored() == ["notes/a.txt", "r1", "r2"]

        (folder / "rows.jsonl").write_text('{"id": "r1", "text": "a row about the moon"}\n')
        third = sync()  # read whole again: the row it no longer gives goes
        assert (third.outcome, third.removed, third.gone) == ("ok", 1, ["r2"])
        assert stored() == ["notes/a.txt", "r1"]

        (folder / "a.txt").unlink()
        fourth = sync()  # nothing to read: no job, the gone file's document removed
        assert (fourth.job, fourth.read, fourth.removed, fourth.gone) == (None, [], 1, ["notes/a.txt"])
        assert stored() == ["r1"]
