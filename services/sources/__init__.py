"""Sources: places documents live (a folder, an S3-compatible bucket prefix, a git repository) that a collection
is kept in step with, each sync a producer of one ingest job (docs/sources.md).

- ``registry``: what a source is (``SourceSpec``) and the data dir's sources (``Registry``);
- ``kinds``: listing and fetching, per kind (``FolderSource``; ``s3``; ``git``);
- ``state``: what syncs remember (versions per item, the last outcome) and the lock that keeps one sync per source;
- ``sync``: one sync (``sync_source``) and ``purge``.
"""

from __future__ import annotations
