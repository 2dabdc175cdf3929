"""One sync of one source: list it, diff the listing against what the collection recorded from it, hand the items
that changed to one ingest job, and remove the documents of the items it no longer has.

The steps, under the source's sync lock (``state.sync_lock``: a second sync of the same source is refused):

1. List the whole source (``kinds``). A listing that fails changes nothing: the sync ends failed (exit 3 when the
   source is unreachable) and nothing is read, written or deleted.
2. Diff: an item is read again when its version differs from the one recorded (``state.json``), when it has none,
   or when a document it gave is no longer in the store; every other item costs nothing.
3. The changed items are fetched one at a time and read by the product's own readers (a PDF or Office file is
   handed over unparsed, as ``dpr ingest`` does) as the input of ONE ingest job (``services.ingest.job.IngestJob``:
   it submits them to the executor the entry point chose, this process or the workers, follows the job and
   prunes). Their documents carry ``source = NAME`` in their payload (``--filter source=NAME``) and the id
   ``NAME/key``. One item that cannot be fetched or read is a failure in the job's report and blocks nothing. If
   the source stops answering mid-way, the items fetched so far still complete, the sync ends failed and nothing
   is deleted.
4. Prune (the job's, scope ``source = NAME``), only after a whole listing and no abort: the store's documents of
   the source that no item gave (this time, or before for an item unchanged or unreadable now) are removed: the
   collection then holds exactly what a fresh ingest of the source would.
5. Record the versions of the items whose documents all arrived (the rest are read again next time; an unchanged
   document costs no encoder work), and the sync's outcome (``last.json``).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from services.core.errors import CollectionNotFound
from services.core.fsutil import now_iso
from services.ingest.batches import Submitted
from services.ingest.follow import follow_job
from services.ingest.job import IngestJob
from services.ingest.sync import SeenDocuments, SyncScope, sync
from services.jobs.store import KEEP_RECORDS
from services.readers import Document, DocumentFailure, IdLedger, Item, Skipped
from services.readers.folders import iter_files
from services.readers.jsonl import RECORD_SUFFIXES
from services.sources.kinds import (
    Entry,
    FolderSource,
    ItemFailed,
    SourceError,
    SourceKind,
    SourceUnreachable,
    fetch_ahead,
)
from services.sources.registry import Registry, SourceSpec
from services.sources.state import Recorded, SourceState, save_last, sync_lock

if TYPE_CHECKING:
    from services.core.settings import Settings
    from services.ingest.executor import Executor
    from services.runtime import Runtime

log = logging.getLogger(__name__)


@dataclass
class SyncReport:
    source: str
    collection: str
    outcome: str = "running"  # ok | failed
    started: str = field(default_factory=now_iso)
    seconds: float = 0.0
    listed: int = 0  # items in the source (after include/exclude)
    added: int = 0  # items read for the first time
    changed: int = 0  # items read again (a new version, or a document missing from the store)
    unchanged: int = 0  # items not read at all
    removed: int = 0  # documents removed: their item is gone from the source
    failed: int = 0  # items that could not be fetched or read (reported in ``failures``)
    skipped: int = 0  # items that are not documents (an unsupported type), as ``dpr ingest`` skips them
    documents: int = 0  # documents the job wrote (re-encoded)
    passages: int = 0  # passages the job wrote
    points_removed: int = 0
    job: str | None = None
    mark: str = ""  # git: the commit synced
    read: list[str] = field(default_factory=list)  # keys fetched and read this time (the first KEEP_RECORDS)
    gone: list[str] = field(default_factory=list)  # documents removed (the first KEEP_RECORDS)
    failures: list[dict[str, str]] = field(default_factory=list)
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class _Fetching(SeenDocuments):
    """The job's record of what the source gives (``ids``, ``aborted``) and the stream's: ids per key, keys failed."""

    state: SourceState = field(default_factory=SourceState)
    by_key: dict[str, list[str]] = field(default_factory=dict)
    failed: dict[str, dict[str, str]] = field(default_factory=dict)


def open_kind(spec: SourceSpec, settings: Settings, workdir: Path) -> SourceKind:
    """The implementation for ``spec.kind``; ``workdir``: the source's own folder (a git mirror lives there)."""
    if spec.kind == "s3":
        from services.sources.s3 import S3Source

        return S3Source(spec, settings)
    if spec.kind == "git":
        from services.sources.git import GitSource

        return GitSource(spec, workdir)
    if spec.kind == "web":
        from services.sources.web import WebSource

        return WebSource(spec, settings, workdir / "fetch")
    return FolderSource(spec)


def stored_from(runtime: Runtime, name: str) -> set[str]:
    """Ids of the documents the collection holds from source ``name`` (payload ``source`` = name)."""
    try:
        return {doc_id for doc_id, source in runtime.store.documents().items() if source == name}
    except CollectionNotFound:
        return set()


def sync_source(runtime: Runtime, registry: Registry, name: str, executor: Executor, *,
                wait_s: float = 0.0) -> SyncReport:
    """Sync source ``name`` into its collection (see the module). Returns the report; raises, after recording the
    failed outcome, ``SourceUnreachable`` (exit 3), ``SourceError`` / ``ConfigError`` for the source's own trouble,
    or ``state.SyncRunning`` when another sync of it still runs after ``wait_s`` seconds."""
    spec = registry.get(name)
    folder = registry.folder(name)
    runtime = runtime.for_collection(spec.collection)
    report = SyncReport(source=name, collection=runtime.settings.collection)
    t0 = time.monotonic()
    with sync_lock(folder, name, wait_s):
        try:
            _sync(runtime, spec, folder, executor, report)
        except Exception as e:
            report.outcome, report.error = "failed", str(e) or type(e).__name__
            raise
        finally:
            report.seconds = round(time.monotonic() - t0, 3)
            if report.outcome == "running":
                report.outcome = "failed"
            save_last(folder, report.to_json() | {"finished": now_iso()})
            shutil.rmtree(folder / "fetch", ignore_errors=True)
            release_free_memory()
    return report


def release_free_memory() -> None:
    """Hand the pages the C allocator keeps free back to the system (glibc's ``malloc_trim``; elsewhere nothing).
    A mitigation, not a fix: a long-lived process syncing every minute (`dpr serve`, a worker) keeps the freed
    pages of each sync's encoding in its allocator's arenas, beside the question threads' (8 question threads and
    30 in-process syncs: RSS +20 MB without, flat with; issue 70). Costs milliseconds, once a sync."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc
        return
    trim = getattr(libc, "malloc_trim", None)
    if trim is not None:
        trim(0)


def _sync(runtime: Runtime, spec: SourceSpec, folder: Path, executor: Executor, report: SyncReport) -> None:
    shutil.rmtree(folder / "fetch", ignore_errors=True)  # what a killed sync left (a web listing writes here)
    with contextlib.closing(open_kind(spec, runtime.settings, folder)) as kind:
        entries = [e for e in kind.listing() if spec.selects(e.key)]  # whole, or it raised: nothing judged
        report.mark = getattr(kind, "commit", "")
        state = SourceState.load(folder)
        stored = stored_from(runtime, spec.name)
        todo: list[Entry] = []
        kept: set[str] = set()  # the documents of the items not read: the source still gives them
        for entry in entries:
            recorded = state.items.get(entry.key)
            if recorded is None:
                report.added += 1
            elif recorded.version != entry.version or not stored.issuperset(recorded.ids):
                report.changed += 1
            else:
                kept.update(recorded.ids)
                continue
            todo.append(entry)
        report.listed, report.unchanged = len(entries), len(entries) - len(todo)
        report.read = [e.key for e in todo[:KEEP_RECORDS]]
        seen, scope = _Fetching(ids=kept, complete=not todo, state=state), SyncScope(source=spec.name)
        job = IngestJob(runtime, lambda: _items(kind, spec, runtime, todo, folder / "fetch", seen), scope=scope,
                        prune=True, seen=seen)

        def followed(submitted: Submitted) -> dict[str, Any]:
            report.job = submitted.job  # in the report whatever happens next
            return follow_job(executor, submitted.job, submitted=submitted)

        status = job.run(executor, followed) if todo else sync(runtime, scope, seen, prune=True)  # no job: prune
    arrived = _arrived(todo, seen, status)
    _record_failures(report, spec, status)
    report.documents, report.passages = int(status.get("documents") or 0), int(status.get("chunks") or 0)
    report.removed, report.points_removed = int(status.get("pruned") or 0), int(status.get("points_pruned") or 0)
    report.gone = list(status.get("stale") or [])
    new = SourceState(mark=report.mark or state.mark)
    listed = {e.key for e in entries}
    for key, recorded in state.items.items():
        if key in listed or seen.aborted is not None:
            new.items[key] = recorded  # kept: unchanged, or read again without success (its old ids stay known)
    for entry in arrived:
        new.items[entry.key] = Recorded(entry.version, seen.by_key.get(entry.key, []))
    new.save(folder)
    if seen.aborted is not None:
        raise seen.aborted
    report.outcome = "failed" if status.get("state") == "failed" else "ok"
    if report.outcome == "failed":
        report.error = f"job {report.job} ended failed; `dpr jobs {report.job}` says why"


def _items(kind: SourceKind, spec: SourceSpec, runtime: Runtime, todo: list[Entry], dest: Path,
           seen: _Fetching) -> Iterator[Item]:
    """The changed items, fetched and read one at a time; stops (``seen.aborted``) if the source stops answering.
    The items that failed keep what they gave before (``seen.ids``): still there, only unreadable now."""
    settings = runtime.settings
    for entry, path in fetch_ahead(kind, todo, dest):
        doc_id = spec.doc_id(entry.key)
        if isinstance(path, SourceUnreachable):
            seen.aborted = path
            log.warning("source stopped answering; the sync ends failed", extra={"source": spec.name})
            return
        if isinstance(path, (ItemFailed, SourceError)):  # this item only (it vanished, too large, access denied)
            failure = DocumentFailure(doc_id, getattr(path, "reason", "refused"), str(path), doc_id=doc_id)
            seen.failed[entry.key] = failure.to_json()
            seen.by_key[entry.key] = []
            yield failure
            continue
        rows = path.name.lower().endswith(RECORD_SUFFIXES)  # a records file: its rows keep their own ids
        ids: list[str] = []
        for item in iter_files(path, settings.max_document_bytes, IdLedger(), settings.documents, defer_binary=True):
            item = _adapted(item, spec, doc_id, str(path), rows)
            if isinstance(item, Document):
                ids.append(item.doc_id)
            elif isinstance(item, DocumentFailure) and item.doc_id:
                seen.failed[entry.key] = item.to_json()
            yield item
        seen.by_key[entry.key] = ids
    seen.ids.update(*(seen.state.items[k].ids for k in seen.failed if k in seen.state.items))  # still there


def _adapted(item: Item, spec: SourceSpec, doc_id: str, local: str, rows: bool) -> Item:
    """A reader's item as the source's: id ``NAME/key`` (a records file's rows keep theirs), ``source`` = NAME,
    and messages naming the item rather than the local copy."""
    if isinstance(item, Document):  # a FileRef too: its local path is where the batch parses it
        return dataclasses.replace(item, doc_id=item.doc_id if rows else doc_id, source=spec.name)
    if isinstance(item, DocumentFailure):
        return dataclasses.replace(item, source=doc_id, error=item.error.replace(local, doc_id),
                                   doc_id=item.doc_id if rows and item.doc_id else doc_id)
    return Skipped(doc_id, item.reason.replace(local, doc_id))


def _arrived(todo: list[Entry], seen: _Fetching, status: dict[str, Any]) -> list[Entry]:
    """The items read this time whose documents all arrived: none failed in the job (nothing is assumed when the
    job ended failed, or kept too few failure records to tell)."""
    if not status or status.get("state") == "failed":
        return []
    failed = status.get("failed") or []
    if int(status.get("failed_total") or len(failed)) > len(failed):
        return []
    bad = {str(f.get("doc_id") or f.get("source") or "") for f in failed}
    return [e for e in todo
            if e.key in seen.by_key and e.key not in seen.failed and not bad.intersection(seen.by_key[e.key])]


def _record_failures(report: SyncReport, spec: SourceSpec, status: dict[str, Any]) -> None:
    records = [{k: str(v) for k, v in f.items()} for f in status.get("failed") or [] if isinstance(f, dict)]
    for f in records:  # a binary file's parse failure names the source: name the item instead
        if f.get("source") == spec.name and f.get("doc_id"):
            f["source"] = f["doc_id"]
            f["error"] = f.get("error", "").replace(f"{spec.name}:", f"{f['doc_id']}:", 1)
    report.failures = records[:KEEP_RECORDS]
    report.failed = int(status.get("failed_total") or len(records))
    report.skipped = int(status.get("skipped_total") or len(status.get("skipped") or []))


def purge_source(runtime: Runtime, registry: Registry, name: str, wait_s: float = 0.0) -> tuple[int, int]:
    """Remove every document of source ``name`` from its collection (payload ``source`` = name), under its sync
    lock; (documents, passages) removed. The source itself stays (``Registry.remove`` removes it)."""
    spec = registry.get(name)
    runtime = runtime.for_collection(spec.collection)
    with sync_lock(registry.folder(name), name, wait_s):
        ids = sorted(stored_from(runtime, name))
        points = runtime.delete(ids) if ids else 0
        (registry.folder(name) / "state.json").unlink(missing_ok=True)
    return len(ids), points
