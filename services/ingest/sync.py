"""Keeping a collection in step with a folder (``dpr ingest FOLDER --prune``), a client's id prefix (the API's
``sync_prefix``) or a source (`dpr sources`): the documents stored from there that the latest complete read did not
see are *stale*; they are reported, and removed with ``prune``.

Which stored documents "came from" a scope: ids under one of its prefixes (a folder's text files are stored as
``<folder name>/<path inside>``), a source under one of its folders (a records file's rows keep their own ids; their
source is the file) or the source named. A document the read saw, or whose source failed or was skipped this time
(still there, only unreadable now), is never stale. Nothing is judged from a read that did not finish.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from services.core.errors import CollectionNotFound, ConfigError
from services.jobs.store import KEEP_RECORDS
from services.readers import Document, Item
from services.readers.folders import id_prefix
from services.readers.sources import detect_format
from services.store.protocol import VectorStore

if TYPE_CHECKING:
    from services.runtime import Runtime

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SyncScope:
    prefixes: tuple[str, ...] = ()  # "docs/" : ids that start with it
    folders: tuple[str, ...] = ()  # "docs/" or "/abs/docs/": sources that start with it
    source: str = ""  # a source's name: documents whose source is exactly it

    @classmethod
    def of_paths(cls, paths: Iterable[Path], fmt: str = "auto") -> SyncScope:
        """The folders among ``paths`` read as files (a JSONL or BEIR input is a data set, not a folder to mirror:
        refused, since a pruned data set would lose every row the file no longer holds by mistake)."""
        prefixes: list[str] = []
        folders: list[str] = []
        for path in paths:
            if not path.is_dir() or (fmt == "auto" and detect_format(path) != "files") or fmt not in ("auto", "files"):
                raise ConfigError(f"{path}: --prune keeps a folder in sync; give folders of files (not a single file, "
                                  "a JSONL file or a BEIR corpus), or drop --prune")
            prefixes.append(f"{id_prefix(path)}/")
            folders.extend(dict.fromkeys((f"{str(path).rstrip('/')}/", f"{path.resolve()}/")))
        return cls(tuple(prefixes), tuple(folders))

    @classmethod
    def of_prefix(cls, prefix: str) -> SyncScope:
        if not prefix.strip():
            raise ConfigError("sync_prefix is empty; give the id prefix this batch replaces, e.g. 'docs/'")
        return cls(prefixes=(prefix,))

    def covers(self, doc_id: str, source: str) -> bool:
        return doc_id.startswith(self.prefixes) or source.startswith(self.folders) or source == self.source != ""


@dataclass
class SeenDocuments:
    """Wraps an item stream and records what it held; ``complete`` once the stream ran to its end."""

    ids: set[str] = field(default_factory=set)
    sources: set[str] = field(default_factory=set)  # failed or skipped this time: still there
    complete: bool = False
    aborted: Exception | None = None  # the input stopped part-way (a source stopped answering): never complete

    def watch(self, items: Iterable[Item]) -> Iterator[Item]:
        for item in items:
            if isinstance(item, Document):
                self.ids.add(item.doc_id)
            else:
                self.sources.update((item.source, item.source.rsplit(":", 1)[0]))  # a file, or "file:line"
                if getattr(item, "doc_id", ""):
                    self.ids.add(item.doc_id)  # type: ignore[union-attr]
            yield item
        self.complete = self.aborted is None


def stale_documents(store: VectorStore, scope: SyncScope, seen: SeenDocuments) -> list[str]:
    """Ids stored under ``scope`` that ``seen`` did not hold, sorted."""
    if not seen.complete:
        raise RuntimeError("the read did not finish: nothing can be judged stale from part of a folder")
    try:
        stored = store.documents()
    except CollectionNotFound:  # no collection yet: nothing stored, nothing stale
        return []
    return sorted(doc_id for doc_id, source in stored.items()
                  if scope.covers(doc_id, source) and doc_id not in seen.ids and source not in seen.sources)


def sync(runtime: Runtime, scope: SyncScope, seen: SeenDocuments, *, prune: bool) -> dict[str, Any]:
    """The stale documents of ``scope`` (the first ``KEEP_RECORDS`` listed), removed when ``prune``."""
    stale = stale_documents(runtime.store, scope, seen)
    removed = runtime.delete(stale) if prune and stale else 0
    if stale:
        log.info("stale documents", extra={"stale": len(stale), "pruned": prune, "points_deleted": removed})
    return {"stale": stale[:KEEP_RECORDS], "stale_total": len(stale), "pruned": len(stale) if prune else 0,
            "points_pruned": removed}
