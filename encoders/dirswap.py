"""A directory made again as a whole (a model conversion, a tower or reranker export): built in an empty sibling and
swapped in by rename, so a reader sees the old directory or the new one, never a half-written one. No project
imports: every builder in ``encoders`` can use it without a module cycle."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def rebuilt_dir(target: Path) -> Iterator[Path]:
    """An empty sibling of ``target`` to build in; when the block ends without an error it takes ``target``'s place
    (the old one removed after the rename). The sibling is removed on the way out whatever happened."""
    staging = target.parent / f".{target.name}.staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        yield staging
        old = target.parent / f".{target.name}.old-{os.getpid()}"
        if target.exists():
            os.replace(target, old)
        os.replace(staging, target)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
