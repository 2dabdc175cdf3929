"""Keeping a collection in step with a folder: stale documents reported, removed with prune; the document count
behind the ingest ETA."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from kit.fakes import FakeRuntime, ingest_items

from services.core.errors import ConfigError
from services.ingest.sync import SeenDocuments, SyncScope, stale_documents, sync
from services.readers import iter_documents
from services.readers.sources import count_documents

pytestmark = pytest.mark.unit


def _folder(root: Path) -> Path:
    docs = root / "docs"
    (docs / "sub").mkdir(parents=True)
    for name in ("a.txt", "b.md", "sub/c.txt"):
        (docs / name).write_text(f"The text of {name}, about rivers and tides.")
    (docs / "rows.jsonl").write_text('{"id": "r1", "text": "a row about the moon"}\n'
                                     '{"id": "r2", "text": "a row about the sun"}\n')
    return docs


def _ingest(runtime: FakeRuntime, paths: list[Path]) -> SeenDocuments:
    seen = SeenDocuments()
    ingest_items(runtime.pipeline, seen.watch(iter_documents(paths)))
    assert seen.complete
    return seen


def test_files_and_rows_gone_from_the_folder_are_stale_and_pruned(tmp_path: Path) -> None:
    docs = _folder(tmp_path)
    other = tmp_path / "other.jsonl"
    other.write_text('{"id": "elsewhere", "text": "not from the folder"}\n')
    with FakeRuntime() as runtime:
        _ingest(runtime, [docs, other])
        assert sorted(runtime.store.documents()) == ["docs/a.txt", "docs/b.md", "docs/sub/c.txt", "elsewhere",
                                                     "r1", "r2"]
        (docs / "b.md").unlink()
        (docs / "rows.jsonl").write_text('{"id": "r1", "text": "a row about the moon"}\n')
        scope = SyncScope.of_paths([docs])
        seen = _ingest(runtime, [docs])
        assert stale_documents(runtime.store, scope, seen) == ["docs/b.md", "r2"]  # never "elsewhere"
        report = sync(runtime, scope, seen, prune=False)
        assert (report["stale_total"], report["pruned"]) == (2, 0) and "docs/b.md" in runtime.store.documents()
        report = sync(runtime, scope, seen, prune=True)
        assert (report["stale"], report["pruned"], report["points_pruned"]) == (["docs/b.md", "r2"], 2, 2)
        assert sorted(runtime.store.documents()) == ["docs/a.txt", "docs/sub/c.txt", "elsewhere", "r1"]
        assert sync(runtime, scope, _ingest(runtime, [docs]), prune=True)["stale_total"] == 0


def test_a_file_that_fails_to_read_now_is_not_stale(tmp_path: Path) -> None:
    docs = _folder(tmp_path)
    with FakeRuntime() as runtime:
        _ingest(runtime, [docs])
        (docs / "a.txt").write_bytes(b"\x00\x01 binary now")  # still there, unreadable: kept, not pruned
        seen = _ingest(runtime, [docs])
        assert stale_documents(runtime.store, SyncScope.of_paths([docs]), seen) == []


def test_nothing_is_judged_from_an_unfinished_read_or_an_empty_collection(tmp_path: Path) -> None:
    docs = _folder(tmp_path)
    seen = SeenDocuments()
    next(seen.watch(iter_documents([docs])))
    with FakeRuntime() as runtime:
        with pytest.raises(RuntimeError, match="did not finish"):
            stale_documents(runtime.store, SyncScope.of_paths([docs]), seen)
        list(seen.watch(iter_documents([docs])))
        assert stale_documents(runtime.store, SyncScope.of_paths([docs]), seen) == []  # no collection yet
    stopped = SeenDocuments(aborted=OSError("the source stopped answering"))  # said by the input, part-way
    list(stopped.watch(iter_documents([docs])))
    assert not stopped.complete


def test_prune_refuses_what_is_not_a_folder_and_an_empty_prefix(tmp_path: Path) -> None:
    docs = _folder(tmp_path)
    with pytest.raises(ConfigError, match="--prune keeps a folder in sync"):
        SyncScope.of_paths([docs / "a.txt"])
    with pytest.raises(ConfigError, match="--prune"):
        SyncScope.of_paths([docs / "rows.jsonl"])
    with pytest.raises(ConfigError, match="sync_prefix is empty"):
        SyncScope.of_prefix("  ")
    assert SyncScope.of_prefix("docs/").covers("docs/x", "") and not SyncScope.of_prefix("docs/").covers("doc", "")
    house = SyncScope(source="house")  # a source's documents: its name exactly
    assert house.covers("house/a", "house") and not house.covers("house/a", "house2") and not house.covers("x", "")


def test_count_documents_is_an_estimate_that_reads_no_document(tmp_path: Path) -> None:
    docs = _folder(tmp_path)
    (docs / ".hidden.txt").write_text("skipped")
    (docs / "image.png").write_bytes(b"\x89PNG")
    assert count_documents([docs]) == 5  # 3 text files + 2 rows
    assert count_documents([docs / "rows.jsonl", docs / "a.txt"]) == 3
    packed = tmp_path / "rows.jsonl.gz"
    packed.write_bytes(gzip.compress(b'{"id": 1, "text": "x"}\n'))
    assert count_documents([packed]) is None  # unknown without decompressing
    assert count_documents([docs], budget_s=-1) is None  # over its time budget
