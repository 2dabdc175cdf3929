"""Hostile input (issue 12): every item read ends as a Document, a DocumentFailure or a Skipped with a reason,
never an exception that stops the others, and reading holds at most the limit in memory."""

from __future__ import annotations

import gzip
import json
import os
import socket
import sys
import tracemalloc
import zlib
from collections.abc import Iterable
from pathlib import Path

import pytest

from services.readers import Document, DocumentFailure, Item, Skipped, iter_documents

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]  # a FIFO opened by mistake would block: fail instead


def _write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return path


def _jsonl(rows: Iterable[object]) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


def _by_name(items: list[Item]) -> dict[str, Item]:
    return {os.path.basename(i.source): i for i in items}


def _strict_json(items: list[Item]) -> None:
    """Every record serialises to strict UTF-8 JSON (what the job record and the store need)."""
    for item in items:
        json.dumps(item.to_json(), ensure_ascii=False).encode("utf-8")


# --- filesystem ------------------------------------------------------------------------------------------------


def test_links_special_files_and_hidden_entries_are_reported_never_followed(tmp_path: Path) -> None:
    outside = _write(tmp_path / "outside" / "secret.txt", "outside text")
    root = tmp_path / "docs"
    _write(root / "a.txt", "alpha")
    (root / "to_file.txt").symlink_to(outside)
    (root / "to_dir").symlink_to(outside.parent, target_is_directory=True)
    (root / "inside.txt").symlink_to(root / "a.txt")
    (root / "dangling.txt").symlink_to(tmp_path / "nowhere.txt")
    (root / "loop1").symlink_to(root / "loop2")
    (root / "loop2").symlink_to(root / "loop1")
    (root / "up").symlink_to(root, target_is_directory=True)
    os.mkfifo(root / "pipe.txt")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(root / "sock.txt"))
    _write(root / ".env", "KEY=1")
    _write(root / ".git" / "config", "x")

    items = list(iter_documents([root]))
    _strict_json(items)
    got = _by_name(items)
    sock.close()
    assert [i.doc_id for i in items if isinstance(i, Document)] == ["docs/a.txt"]
    assert all(isinstance(i, Skipped) for n, i in got.items() if n != "a.txt")
    reasons = {n: i.reason for n, i in got.items() if isinstance(i, Skipped)}
    assert "outside the folder given" in reasons["to_file.txt"] and "pass its target" in reasons["to_file.txt"]
    assert "outside the folder given" in reasons["to_dir"]
    assert "inside the folder given" in reasons["inside.txt"] and "inside the folder given" in reasons["up"]
    assert "dangling" in reasons["dangling.txt"]
    assert "loop" in reasons["loop1"] and "loop" in reasons["loop2"]
    assert reasons["pipe.txt"].startswith("a FIFO") and reasons["sock.txt"].startswith("a socket")
    assert reasons[".env"].startswith("hidden") and reasons[".git"].startswith("hidden")
    assert len(items) == len(os.listdir(root))  # one record per entry: the counts add up
    assert not any("outside text" in i.text for i in items if isinstance(i, Document))


def test_a_fifo_or_a_linked_folder_given_by_name(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    assert [(type(i), i.reason.split(",")[0]) for i in iter_documents([tmp_path / "pipe"])] == [(Skipped, "a FIFO")]
    _write(tmp_path / "elsewhere" / "real" / "a.txt", "alpha")
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "alias").symlink_to(tmp_path / "elsewhere" / "real", target_is_directory=True)
    ids = [i.doc_id for i in iter_documents([tmp_path / "links" / "alias"]) if isinstance(i, Document)]
    assert ids == ["alias/a.txt"]  # ids start at the name given when its target lives elsewhere


def test_unreadable_folders_and_files_fail_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "docs"
    _write(root / "locked" / "x.txt", "x")
    _write(root / "secret.txt", "s")
    _write(root / "z.txt", "zed")
    real_scandir, real_open = os.scandir, open

    def scandir(path: object) -> object:
        if str(path).endswith("locked"):
            raise PermissionError(13, "Permission denied")
        return real_scandir(path)  # type: ignore[arg-type]

    def opener(path: object, *args: object, **kwargs: object) -> object:
        if str(path).endswith("secret.txt"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr("builtins.open", opener)
    got = _by_name(list(iter_documents([root])))
    assert (type(got["locked"]), got["locked"].reason) == (DocumentFailure, "unreadable")
    assert (type(got["secret.txt"]), got["secret.txt"].reason) == (DocumentFailure, "unreadable")
    assert "Permission denied" in got["secret.txt"].error  # type: ignore[union-attr]
    assert isinstance(got["z.txt"], Document)


def test_names_that_are_not_utf8_are_read_under_a_safe_id(tmp_path: Path) -> None:
    root = tmp_path / "docs"
    root.mkdir()
    for name in (b"caf\xe9.txt", b"\xff\xfe-dir"):
        target = os.path.join(os.fsencode(root), name)
        if name.endswith(b".txt"):
            Path(os.fsdecode(target)).write_text("bonjour")
        else:
            os.mkdir(target)
            Path(os.fsdecode(target), "inner.md").write_text("# Inner\n\nbody")
    items = list(iter_documents([root]))
    _strict_json(items)
    ids = sorted(i.doc_id for i in items if isinstance(i, Document))
    assert ids == ["docs/\\xff\\xfe-dir/inner.md", "docs/caf\\xe9.txt"]
    assert all(isinstance(i, Document) for i in items)


def test_deep_folders_do_not_exhaust_the_stack(tmp_path: Path) -> None:
    path = tmp_path / "docs"
    for _ in range(300):
        path = path / "d"
    _write(path / "leaf.txt", "leaf")
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(250)  # a walk that recursed per folder level would hit it (300 levels)
    try:
        items = list(iter_documents([tmp_path / "docs"]))
    finally:
        sys.setrecursionlimit(limit)
    assert len(items) == 1 and isinstance(items[0], Document) and items[0].doc_id.endswith("/d/leaf.txt")


# --- folders ---------------------------------------------------------------------------------------------------


def test_records_files_in_a_folder_are_rows_and_archives_say_extract(tmp_path: Path) -> None:
    root = tmp_path / "mixed"
    _write(root / "a.jsonl", _jsonl([{"id": "a1", "text": "row a1"}]))
    _write(root / "b.ndjson", _jsonl([{"id": "b1", "text": "row b1"}]))
    _write(root / "c.jsonl.gz", gzip.compress(_jsonl([{"id": "c1", "text": "row c1"}]).encode()))
    _write(root / "note.md", "# Note\n\nbody")
    for name in ("x.zip", "x.tar", "x.tar.gz", "x.tgz", "x.7z", "x.rar", "notes.txt.gz"):
        _write(root / name, b"PK\x03\x04 whatever")
    items = list(iter_documents([root]))
    assert sorted(i.doc_id for i in items if isinstance(i, Document)) == ["a1", "b1", "c1", "mixed/note.md"]
    skipped = {os.path.basename(i.source): i.reason for i in items if isinstance(i, Skipped)}
    assert set(skipped) == {"x.zip", "x.tar", "x.tar.gz", "x.tgz", "x.7z", "x.rar", "notes.txt.gz"}
    assert all("extract it first" in r for r in skipped.values())


# --- unicode, content, ids -------------------------------------------------------------------------------------


def test_lone_surrogates_fail_their_row_only(tmp_path: Path) -> None:
    rows = [
        '{"id": "ok1", "text": "fine"}',
        '{"id": "bad\\ud800", "text": "x"}',
        '{"id": "t", "text": "a \\udc00 b"}',
        '{"id": "ti", "title": "\\ud83d", "text": "x"}',
        '{"id": "m", "text": "x", "lang": "\\udfff"}',
        '{"id": "mk", "text": "x", "metadata": {"\\ud800k": "v"}}',
        '{"id": "pair", "text": "emoji \\ud83d\\ude00"}',
    ]
    items = list(iter_documents([_write(tmp_path / "u.jsonl", _jsonl(rows))]))
    _strict_json(items)
    assert [i.doc_id for i in items if isinstance(i, Document)] == ["ok1", "pair"]
    fails = [i for i in items if isinstance(i, DocumentFailure)]
    assert [(os.path.basename(f.source), f.reason) for f in fails] == [
        (f"u.jsonl:{n}", "invalid_unicode") for n in (2, 3, 4, 5, 6)
    ]
    assert [f.doc_id for f in fails][1:] == ["t", "ti", "m", "mk"]  # the id is named once it is valid


def test_title_only_is_its_title_and_neither_is_empty(tmp_path: Path) -> None:
    rows = [{"_id": "t", "title": "Aerodynamic heating", "text": ""}, {"_id": "n", "title": " ", "text": " "}]
    items = list(iter_documents([_write(tmp_path / "c.jsonl", _jsonl(rows))]))
    assert items[0] == Document("t", "Aerodynamic heating", "Aerodynamic heating", str(tmp_path / "c.jsonl"))
    assert isinstance(items[1], DocumentFailure) and items[1].reason == "empty" and items[1].doc_id == "n"
    page = _write(tmp_path / "p" / "t.html", "<html><head><title>Only a title</title></head><body> </body></html>")
    (doc,) = iter_documents([page])
    assert isinstance(doc, Document) and (doc.title, doc.text) == ("Only a title", "Only a title")


def test_duplicate_ids_fail_the_later_row_naming_both(tmp_path: Path) -> None:
    first = _write(tmp_path / "a.jsonl", _jsonl([{"id": 1, "text": "one"}, {"id": "2", "text": "two"},
                                                 {"id": "1", "text": "again"}]))
    second = _write(tmp_path / "b.jsonl", _jsonl([{"_id": 2, "text": "two again"}]))
    items = list(iter_documents([first, second]))
    assert [i.text for i in items if isinstance(i, Document)] == ["one", "two"]  # the first one read is kept
    fails = [i for i in items if isinstance(i, DocumentFailure)]
    assert [(f.reason, f.doc_id) for f in fails] == [("duplicate_id", "1"), ("duplicate_id", "2")]
    assert f"{first}:1" in fails[0].error and fails[0].source == f"{first}:3"
    assert f"{first}:2" in fails[1].error and fails[1].source == f"{second}:1"
    folder = _write(tmp_path / "docs" / "x.txt", "x").parent
    again = list(iter_documents([folder, folder]))  # the same folder twice: the second reading is duplicates
    assert [type(i) for i in again] == [Document, DocumentFailure] and again[1].reason == "duplicate_id"


# --- limits ----------------------------------------------------------------------------------------------------


def test_nul_anywhere_is_binary_and_utf16_is_decoded(tmp_path: Path) -> None:
    root = tmp_path / "docs"
    _write(root / "late_nul.txt", b"a" * 20_000 + b"\x00tail")
    _write(root / "utf16.txt", "caf\u00e9 na\u00efve".encode("utf-16"))
    _write(root / "utf16be.md", b"\xfe\xff" + "# T\n\nbody".encode("utf-16-be"))
    _write(root / "rows.jsonl", "\ufeff" + _jsonl([{"id": "r", "text": "x"}]), )
    _write(root / "wide.jsonl", _jsonl([{"id": "w", "text": "x"}]).encode("utf-16"))
    _write(root / "nul.jsonl", _jsonl([{"id": "n", "text": "a\u0000b"}, {"id": "ok", "text": "fine"}]))
    got = {os.path.basename(i.source): i for i in iter_documents([root])}
    assert got["late_nul.txt"].reason == "binary"  # type: ignore[union-attr]
    assert got["utf16.txt"].text == "caf\u00e9 na\u00efve"  # type: ignore[union-attr]
    assert got["utf16be.md"].title == "T"  # type: ignore[union-attr]
    assert "re-encode it as UTF-8" in got["wide.jsonl"].error  # type: ignore[union-attr]
    assert got["nul.jsonl:1"].reason == "binary" and isinstance(got["nul.jsonl"], Document)  # type: ignore[union-attr]
    assert isinstance(got["rows.jsonl"], Document)  # a UTF-8 BOM is dropped


def test_row_limit_counts_utf8_bytes(tmp_path: Path) -> None:
    rows = [{"id": "wide", "text": "\u00e9" * 60}, {"id": "narrow", "text": "e" * 60}]
    path = _write(tmp_path / "c.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    items = list(iter_documents([path], max_bytes=100))  # 60 characters: 120 bytes + JSON, and 60 bytes + JSON
    assert [(type(i).__name__, getattr(i, "reason", "")) for i in items] == [
        ("DocumentFailure", "oversized"), ("Document", "")
    ]
    assert "bytes" in items[0].error  # type: ignore[union-attr]


# --- compressed ------------------------------------------------------------------------------------------------


GOOD = _jsonl({"id": f"g{i}", "text": f"good row {i}"} for i in range(50)).encode()


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda gz: gz[:-8] + bytes(b ^ 0xFF for b in gz[-8:-4]) + gz[-4:], id="bad-crc"),
        pytest.param(lambda gz: gz[: len(gz) * 2 // 3], id="truncated"),
        pytest.param(lambda gz: gz[:10] + b"\x00garbage" * 200, id="garbage-after-header"),
        pytest.param(lambda gz: gz + b"trailing junk", id="junk-after-stream"),
    ],
)
def test_corrupt_gzip_keeps_the_rows_before_and_names_where_it_broke(tmp_path: Path, damage: object) -> None:
    path = _write(tmp_path / "c.jsonl.gz", damage(gzip.compress(GOOD)))  # type: ignore[operator]
    items = list(iter_documents([path]))
    docs = [i for i in items if isinstance(i, Document)]
    fails = [i for i in items if isinstance(i, DocumentFailure)]
    assert len(fails) == 1 and fails[0].reason == "corrupt" and ":" in os.path.basename(fails[0].source)
    assert f"the {len(docs):,} lines before it were read" in fails[0].error
    assert [d.doc_id for d in docs] == [f"g{i}" for i in range(len(docs))]  # the good prefix, in order


def _gzip_stream(pieces: Iterable[bytes]) -> bytes:
    """A gzip file of the concatenated pieces, compressed as they come (the whole is never held)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    return b"".join(z.compress(p) for p in pieces) + z.flush()


def test_a_decompression_bomb_is_refused_holding_at_most_the_limit(tmp_path: Path) -> None:
    line = b'{"id": "bomb", "text": "' + b"a" * (1 << 20)
    body = _gzip_stream([line[:24], *([b"a" * (1 << 20)] * 64), b'"}\n', b'{"id": "after", "text": "still read"}\n'])
    path = _write(tmp_path / "bomb.jsonl.gz", body)  # ~64 KB of gzip, a 64 MB line
    tracemalloc.start()
    items = list(iter_documents([path], max_bytes=1 << 20))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert [(type(i).__name__, getattr(i, "reason", "")) for i in items] == [
        ("DocumentFailure", "oversized"), ("Document", "")
    ]
    assert "67,108,8" in items[0].error  # type: ignore[union-attr]  # its size is counted, though never held
    assert peak < 8 << 20, f"peak {peak:,} bytes while reading a 64 MB line with a 1 MB limit"


def test_many_malformed_rows_stream_without_accumulating(tmp_path: Path) -> None:
    n = 50_000
    path = _write(tmp_path / "junk.jsonl.gz", _gzip_stream([b"{not json\n"] * n))
    tracemalloc.start()
    count = 0
    for item in iter_documents([path]):
        assert isinstance(item, DocumentFailure) and item.reason == "invalid_json" and len(item.error) < 300
        count += 1
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert count == n
    assert peak < 4 << 20, f"peak {peak:,} bytes over {n:,} malformed rows"
