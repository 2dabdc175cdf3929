"""services.readers.filesig: what a worker gets for a binary file (inline bytes or a path, mapped), the
signature that says a file is unchanged, and how a folder walk defers binary files."""

from __future__ import annotations

from pathlib import Path

import pytest
from kit.documents import make_pdf

from services.core.fsutil import sha256_of
from services.ingest.batches import batched_items
from services.readers import Document, DocumentFailure, iter_documents
from services.readers.filesig import (
    FileRef,
    chunk_key,
    is_file_task,
    local_file,
    mapped_path,
    parse_path_map,
    signature,
)

pytestmark = pytest.mark.unit


def test_a_folder_walk_defers_binary_files_and_reads_the_rest(tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    make_pdf(folder / "a.pdf", ["first page", "second page"])
    (folder / "b.md").write_text("# B\n\nText.\n", encoding="utf-8")
    items = list(iter_documents([folder], defer_binary=True))
    refs = [i for i in items if isinstance(i, FileRef)]
    assert [r.doc_id for r in refs] == ["docs/a.pdf"]
    assert refs[0].kind == "pdf" and refs[0].text == "" and refs[0].size == (folder / "a.pdf").stat().st_size
    assert Path(refs[0].path).is_absolute()
    assert [i.doc_id for i in items if isinstance(i, Document) and not isinstance(i, FileRef)] == ["docs/b.md"]
    # without the flag the PDF is parsed as before
    parsed = [i for i in iter_documents([folder]) if isinstance(i, Document)]
    assert not any(isinstance(i, FileRef) for i in parsed) and "second page" in parsed[0].text


def test_a_file_reference_travels_as_json_inline_or_by_path(tmp_path: Path) -> None:
    path = make_pdf(tmp_path / "a.pdf", ["some words"])
    ref = FileRef.of(path, "pdf", "docs/a.pdf")
    by_path = ref.with_bytes(limit=ref.size - 1)
    assert by_path.inline is None and "inline_b64" not in by_path.to_json()["file"]
    inline = ref.with_bytes(limit=ref.size)
    data = inline.to_json()
    assert is_file_task(data) and not is_file_task(Document("x", "t").to_json())
    back = FileRef.from_json(data)
    assert back.inline == path.read_bytes() and (back.doc_id, back.kind, back.path) == ("docs/a.pdf", "pdf", ref.path)
    assert FileRef.from_json(by_path.to_json()).inline is None
    assert ref.with_bytes(limit=0).inline is None  # 0: always by path


def test_inline_bytes_are_read_from_a_temporary_copy_that_keeps_the_name(tmp_path: Path) -> None:
    path = make_pdf(tmp_path / "manual.pdf", ["words"])
    ref = FileRef.of(path, "pdf", "manual.pdf").with_bytes(limit=1 << 20)
    path.unlink()  # the worker's machine does not have it
    local = local_file(ref, [], "worker")
    assert not isinstance(local, DocumentFailure)
    assert local.path.name == "manual.pdf" and local.path != path and local.path.read_bytes() == ref.inline
    local.close()
    assert not local.path.exists()


def test_a_path_the_worker_cannot_read_fails_naming_both_settings(tmp_path: Path) -> None:
    path = make_pdf(tmp_path / "a.pdf", ["words"])
    ref = FileRef.of(path, "pdf", "a.pdf")
    failure = local_file(ref, parse_path_map(f"{tmp_path}=/nowhere/shared"), "host-1:42")
    assert isinstance(failure, DocumentFailure) and failure.reason == "unreachable"
    assert "/nowhere/shared/a.pdf" in failure.error and "host-1:42" in failure.error
    assert "DPR_CELERY__PATH_MAP" in failure.error and "DPR_CELERY__INLINE_FILE_BYTES" in failure.error
    mapped = local_file(ref, parse_path_map(f"/elsewhere={tmp_path}"), "w")  # no prefix matches: read as is
    assert not isinstance(mapped, DocumentFailure) and mapped.path == path


def test_path_maps_rewrite_whole_components_longest_prefix_first() -> None:
    pairs = parse_path_map("/home/me=/mnt/me; /home/me/docs=/srv/docs")
    assert mapped_path("/home/me/docs/a.pdf", pairs) == "/srv/docs/a.pdf"
    assert mapped_path("/home/me/b.pdf", pairs) == "/mnt/me/b.pdf"
    assert mapped_path("/home/meg/c.pdf", pairs) == "/home/meg/c.pdf"  # not a component boundary
    with pytest.raises(ValueError, match="PREFIX=PREFIX"):
        parse_path_map("/only/one/side")


def test_the_signature_changes_with_the_bytes_and_the_chunking(tmp_path: Path) -> None:
    a = make_pdf(tmp_path / "a.pdf", ["one"])
    b = make_pdf(tmp_path / "b.pdf", ["two"])
    key = chunk_key(256, 32, 48, 512)
    sig_a = signature(sha256_of(a), a.stat().st_size, key)
    assert sig_a == signature(sha256_of(a), a.stat().st_size, chunk_key(256, 32, 48, 512))
    assert sig_a != signature(sha256_of(b), b.stat().st_size, key)
    assert sig_a != signature(sha256_of(a), a.stat().st_size, chunk_key(128, 32, 48, 512))
    assert sig_a.split(":")[1] == str(a.stat().st_size)  # the size is part of the signature


def test_a_large_file_goes_in_a_batch_of_its_own() -> None:
    small = [FileRef(doc_id=f"s{i}", text="", path=f"/s{i}", kind="pdf", size=100) for i in range(3)]
    big = FileRef(doc_id="big", text="", path="/big", kind="pdf", size=5_000_000)
    batches = list(batched_items([*small, big, *small], max_docs=64, max_bytes=1_000_000))
    assert [[d.doc_id for d in b] for b in batches] == [["s0", "s1", "s2"], ["big"], ["s0", "s1", "s2"]]


def test_a_worker_task_reads_file_references_and_documents_alike(tmp_path: Path) -> None:
    from workers.tasks import parse_documents

    path = make_pdf(tmp_path / "a.pdf", ["words"])
    ref = FileRef.of(path, "pdf", "docs/a.pdf").with_bytes(limit=1 << 20)
    items = parse_documents([ref.to_json(), Document("docs/b.md", "text").to_json(), {"file": {"doc_id": "x"}}])
    assert isinstance(items[0], FileRef) and items[0].inline == path.read_bytes()
    assert type(items[1]) is Document
    assert isinstance(items[2], DocumentFailure) and items[2].reason == "invalid_task"


def test_a_file_that_killed_two_deliveries_fails_alone_and_the_rest_is_written(tmp_path: Path) -> None:
    from kit.fakes import FakeRuntime

    from services.ingest.batches import run_batch

    folder = tmp_path / "docs"
    folder.mkdir()
    make_pdf(folder / "a.pdf", ["The boiler is serviced once a year."])
    make_pdf(folder / "b.pdf", ["This one killed the worker last time."])
    items = list(iter_documents([folder], defer_binary=True))
    with FakeRuntime() as runtime:
        jobs = runtime.jobs
        jobs.create("j1", collection="passages", executor="broker")
        jobs.mark_started("j1", 0, worker="w1", attempt=0)  # the first delivery...
        jobs.mark_parsing("j1", 0, "docs/b.pdf")  # ...died while parsing b.pdf (nothing recorded)
        once = run_batch(jobs, runtime.pipeline, "j1", 0, items[1:], worker="w2")  # one death: parsed again
        assert once is not None and once.failed == [] and once.parsed == 1
        assert jobs.parse_died("j1", 0, "docs/b.pdf") == 2  # as if that delivery had died in b.pdf too...
        jobs.mark_parsing("j1", 0, "docs/b.pdf")

        store_before = {p.doc_id for batch in runtime.store.scroll() for p in batch}
        assert store_before == {"docs/b.pdf"}
        runtime.store.delete_documents(["docs/b.pdf"])
        report = run_batch(jobs, runtime.pipeline, "j1", 0, items, worker="w3")  # ...so the next skips it

        assert report is not None and report.documents == 1 and report.parsed == 1
        assert [(f["doc_id"], f["reason"]) for f in report.failed] == [("docs/b.pdf", "parser_crashed")]
        assert "died twice while parsing it" in report.failed[0]["error"]
        assert jobs.parsing("j1", 0) == ""  # a.pdf parsed to the end: no mark left
        assert {p.doc_id for batch in runtime.store.scroll() for p in batch} == {"docs/a.pdf"}

        jobs.create("j2", collection="passages", executor="broker")  # a first delivery never poisons a file
        fresh = run_batch(jobs, runtime.pipeline, "j2", 0, items, worker="w2")
        assert fresh is not None and fresh.failed == [] and (fresh.documents, fresh.unchanged) == (1, 1)
        single = tmp_path / "single"
        single.mkdir()
        make_pdf(single / "c.pdf", ["Another page."])
        jobs.create("j3", collection="passages", executor="broker")
        jobs.mark_started("j3", 0, worker="w1")
        jobs.mark_parsing("j3", 0, "single/c.pdf")  # died once in c.pdf, then a delivery died before parsing
        jobs.mark_started("j3", 0, worker="w2")
        assert jobs.parse_died("j3", 0, "single/c.pdf") == 1 and jobs.parsing("j3", 0) == ""
        later = run_batch(jobs, runtime.pipeline, "j3", 0, list(iter_documents([single], defer_binary=True)))
        assert later is not None and later.failed == [] and later.documents == 1
