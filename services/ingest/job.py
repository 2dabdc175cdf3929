"""One ingest run, from its input to its report: ``IngestJob``; `dpr ingest`, ``POST /v1/documents``, a source's
sync (``services.sources.sync``: it diffs a listing) and evaluation's throw-away corpus
(``services.lab.evaluation.store_retriever``) are adapters over it (arguments in, the report out).

The job reads its input once: one pass settles an explicit ``--language`` on the first document
(``language.prepare_collection``), counts what was read for the progress (against ``count_documents``, a quick
count that reads no document), records what it held for the stale check (``sync.SeenDocuments``) and feeds the
executor, which cuts and runs the batches (``batches``: the one batch loop). Then the folders, the id prefix or the
source the job mirrors are checked for stale documents, pruned with ``prune`` (``sync.sync``). The input is read
again only to re-send a batch the broker lost (``source``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from services.core.errors import ConfigError
from services.ingest.batches import Submitted
from services.ingest.follow import Source
from services.ingest.language import check_choice, prepare_collection
from services.ingest.pipeline import IngestReport
from services.ingest.sync import SeenDocuments, SyncScope, sync
from services.readers import Document, Item, iter_documents
from services.readers.sources import count_documents, detect_format

if TYPE_CHECKING:
    from services.ingest.executor import Executor
    from services.runtime import Runtime

Outcome = Callable[[Submitted], dict[str, Any]]


@dataclass
class Tally:
    """How far the run is, for a progress display: documents read of about ``total``, done, passages, failed."""

    total: int | None = None  # the quick count of the input; None: unknown
    read: int = 0
    done: int = 0
    chunks: int = 0
    failed: int = 0


@dataclass
class IngestJob:
    """One run: ``source`` (the input, read once by ``run``), the collection's language, the scope it keeps in
    sync and whether to prune it; ``on_progress`` sees the ``tally`` as documents are read and batches end (an
    in-process run: ``on_batch`` is the executor's hook)."""

    runtime: Runtime
    source: Source
    language: str = "auto"
    scope: SyncScope | None = None
    prune: bool = False
    estimate: Callable[[], int | None] = lambda: None  # the quick count of the input, for the ETA
    on_progress: Callable[[Tally], None] | None = None
    tally: Tally = field(default_factory=Tally)
    seen: SeenDocuments = field(default_factory=SeenDocuments)

    @classmethod
    def of_paths(cls, runtime: Runtime, paths: list[Path], fmt: str, *, language: str = "auto", prune: bool = False,
                 on_progress: Callable[[Tally], None] | None = None) -> IngestJob:
        """`dpr ingest PATH...`: files, folders, JSONL files or BEIR corpora (binary files go unparsed: the batch's
        runner parses them). The folders among them are checked for stale documents: all of them with ``prune``,
        which refuses any other input."""
        for p in paths:
            if not p.exists():
                raise ConfigError(f"{p}: no such file or directory; check the path")
        folders = paths if prune else [
            p for p in paths if p.is_dir() and fmt in ("auto", "files") and detect_format(p) == "files"]
        s = runtime.settings
        return cls(runtime, lambda: iter_documents(paths, fmt=fmt, max_bytes=s.max_document_bytes,  # type: ignore[arg-type]
                                                   limits=s.documents, defer_binary=True),
                   language=language, scope=SyncScope.of_paths(folders, fmt) if folders else None, prune=prune,
                   estimate=lambda: count_documents(paths, fmt), on_progress=on_progress)  # type: ignore[arg-type]

    def run(self, executor: Executor, outcome: Outcome | None = None) -> dict[str, Any]:
        """Read the input once into ``executor``; the report is ``outcome(submitted)`` (the job store's status of
        an in-process run, a follower's last status) or, without it, the submission itself (state ``queued``),
        and the stale documents of the scope once the whole input was read."""
        items = self._settled(self.seen.watch(self.source()))
        if self.on_progress is not None:
            self.tally.total = self.estimate()
            self.on_progress(self.tally)  # the display starts before the executor loads the model
            items = self._counted(items, self.on_progress)
        submitted = executor.submit(items, collection=self.runtime.settings.collection)
        report = outcome(submitted) if outcome is not None else submitted.to_json()
        if self.scope is not None and self.seen.complete:
            report |= sync(self.runtime, self.scope, self.seen, prune=self.prune)
        return report

    def on_batch(self, part: IngestReport) -> None:
        """An in-process batch ended (the executor's hook)."""
        self.tally.done += part.items
        self.tally.chunks += part.chunks
        self.tally.failed += len(part.failed)
        if self.on_progress is not None:
            self.on_progress(self.tally)

    def _settled(self, items: Iterator[Item]) -> Iterator[Item]:
        """``items``, once an explicit language is settled on the first document (``auto``: nothing read)."""
        if check_choice(self.language) == "auto":
            return items
        head: list[Item] = []
        for item in items:
            head.append(item)
            if isinstance(item, Document):
                break
        runtime = self.runtime
        prepare_collection(runtime.store, lambda: runtime.towers, self.language, head)
        return itertools.chain(head, items)

    def _counted(self, items: Iterable[Item], show: Callable[[Tally], None]) -> Iterator[Item]:
        """``items`` as they stream, counted (nothing is held to know the input's length)."""
        for item in items:
            self.tally.read += 1
            show(self.tally)
            yield item
