"""Sources: places documents live (a folder, an S3-compatible bucket prefix, a web site, a git repository) that a
collection is kept in step with, each sync a producer of one ingest job (docs/sources.md).

- ``registry``: what a source is (``SourceSpec``) and the data dir's sources (``Registry``);
- ``kinds``: what a kind offers a sync (a versioned listing, a fetch) and ``FolderSource``; ``s3``, ``web`` and
  ``git`` the others (each imported only for its kind);
- ``state``: what syncs remember (versions per item, the last outcome) and the lock that keeps one sync per source;
- ``sync``: one sync (``sync_source``) and ``purge_source``;
- ``schedule``: when each source is due, the status of every source, and the loop `dpr serve` runs.
"""

from __future__ import annotations
