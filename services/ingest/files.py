"""The binary files of an ingest batch (``FileRef``: PDF, DOCX, PPTX, ODT, EPUB) parsed where the batch runs, in
this process's parser sandbox, and not at all when the store already holds their bytes.

``parse_files`` is what ``IngestPipeline.ingest_batch`` calls for a batch's unparsed files (or the in-process
executor calls one batch ahead, while the previous batch encodes); ``file_states`` is the store lookup it decides
"unchanged" with. A file that crashes the parser's child is quarantined by its bytes (the sandbox's
``services.readers.quarantine``); one that killed the process running its batch twice (``ParseGuard``) fails for
the rest of that job only (a time limit or an OOM kill strikes whatever was parsing).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from services.core.fsutil import sha256_of
from services.core.settings import DocumentSettings
from services.jobs.store import JobStore
from services.readers import Document, DocumentFailure, Item
from services.readers.filesig import FileRef, ParseLog, chunk_key, local_file, parse_path_map, signature
from services.store.points import DocState

if TYPE_CHECKING:
    from services.ingest.pipeline import IngestPipeline

PARSE_DEATHS = 2


@dataclass
class ParseGuard:
    """The job store hears which document a batch's runner is parsing. When deliveries of the batch have died
    ``PARSE_DEATHS`` times while parsing the same document (the worker process killed or out of memory; the
    sandbox's child crashing is caught before this, without a redelivery), the next delivery fails that document
    as ``parser_crashed`` instead of parsing it again, and the rest of its batch is written: a poison document
    costs two deliveries, never its batch-mates nor a redelivery loop. One death is not enough: a hard time limit
    or an OOM kill of a busy worker strikes whatever it was parsing."""

    jobs: JobStore
    job: str
    batch: int
    poisoned: set[str] = field(default_factory=set)

    def before(self, doc_id: str) -> None:
        self.jobs.mark_parsing(self.job, self.batch, doc_id)

    def after(self, doc_id: str) -> None:
        self.jobs.mark_parsing(self.job, self.batch, "")


@dataclass
class ParsedFiles:
    """What a batch's ``FileRef``s became: documents (carrying ``file_sig``) and failures to ingest, and the
    files the store already holds byte for byte (doc id, stored passages, written by this same job)."""

    items: list[Item] = field(default_factory=list)
    unchanged: list[tuple[str, int, bool]] = field(default_factory=list)
    parsed: int = 0
    seconds: float = 0.0
    by: str = ""




def parse_files(
    pipeline: IngestPipeline, refs: list[FileRef], *, job: str = "", generation: str | None = None,
    known: tuple[dict[str, DocState], str] | None = None, guard: ParseGuard | None = None,
) -> ParsedFiles:
    """Parse the binary files of a batch in this process's parser sandbox, except those whose signature
    (``services.readers.filesig``: sha256, size, chunking) and model match what the store holds for their doc
    id: those are not parsed at all. ``known``: ``file_states`` looked up already (the store is then not
    touched here, so this may run on another thread while a batch writes). Never raises for a document's sake."""
    from services.readers.binary import read_binary  # the sandbox client; the parsers run in its child only
    from services.readers.sandbox import shared_sandbox

    out = ParsedFiles(by=f"{socket.gethostname()}:{os.getpid()}")
    if not refs:
        return out
    pairs = parse_path_map(pipeline.path_map)
    limits, chunking = pipeline.documents, pipeline.chunking
    states, model = known or file_states(pipeline, refs, generation)
    key = chunk_key(chunking.max_tokens, chunking.overlap, chunking.max_title_tokens,
                    pipeline.towers.max_passage_tokens)
    for ref in refs:
        local = local_file(ref, pairs, out.by)
        if isinstance(local, DocumentFailure):
            out.items.append(local)
            continue
        try:
            digest = sha256_of(local.path)
            sig = signature(digest, local.path.stat().st_size, key)
            state = states.get(ref.doc_id)
            if state is not None and state.file_sig == sig and state.model == model and state.chunks > 0:
                out.unchanged.append((ref.doc_id, state.chunks, bool(job) and job in state.jobs))
                continue
            if guard is not None and ref.doc_id in guard.poisoned:
                out.items.append(DocumentFailure(
                    ref.source, "parser_crashed",
                    f"{ref.source}: the worker running its batch died twice while parsing it; it is quarantined (not "
                    "parsed again in this job) and the rest of the batch goes on; repair or re-create it (e.g. `qpdf "
                    "in.pdf out.pdf`), or ingest it alone to see why", doc_id=ref.doc_id))
                continue
            ParseLog.note(ref.doc_id)
            t0 = time.perf_counter()
            if guard is not None:
                guard.before(ref.doc_id)
            try:
                parsed = list(read_binary(local.path, ref.kind, ref.doc_id, pipeline.max_document_bytes, limits))
            except BaseException:  # e.g. Celery's soft time limit mid-parse: the child may still be sending parts
                shared_sandbox(limits or DocumentSettings()).close()  # a fresh one for the next document
                raise
            finally:  # only a death in the middle leaves the mark
                if guard is not None:
                    guard.after(ref.doc_id)
            out.seconds += time.perf_counter() - t0
            out.parsed += 1
        except OSError as e:
            out.items.append(DocumentFailure(ref.source, "unreadable", f"{ref.source}: cannot be read "
                                             f"({e.strerror or e}); check its permissions", doc_id=ref.doc_id))
            continue
        finally:
            local.close()
        here = str(local.path)
        for item in parsed:
            if isinstance(item, Document):
                out.items.append(dataclasses.replace(item, source=ref.source,
                                                     metadata={**item.metadata, "file_sig": sig}))
            elif isinstance(item, DocumentFailure):
                out.items.append(dataclasses.replace(item, source=ref.source,
                                                     error=item.error.replace(here, ref.source)))
            else:
                out.items.append(item)
    return out


def file_states(pipeline: IngestPipeline, refs: list[FileRef], generation: str | None = None
                ) -> tuple[dict[str, DocState], str]:
    """What the store holds for these files' doc ids, and the model their passages must have been written with
    to count as unchanged."""
    store, model = pipeline.store, pipeline.towers.fingerprint
    if generation is not None:
        return store.doc_states([r.doc_id for r in refs], generation=generation), model
    active = store.active()
    if active is None:  # a new collection: nothing is stored yet
        return {}, model
    if pipeline.towers_for is not None:
        model = active.spec.model  # the towers follow the collection's model
    return store.doc_states([r.doc_id for r in refs], generation=active.name), model
