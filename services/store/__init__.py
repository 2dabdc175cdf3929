"""Vector stores: one front end (``Store``, meeting the ``VectorStore`` protocol) over two engines.

``open_store(settings)`` is the one place that picks an engine and builds the store: the embedded qdrant-edge
engine (``edge/engine.py``) or a Qdrant server through qdrant-client (``server/engine.py``). Tests hand an
engine in: ``Store(EdgeEngine(tmp_path, "c"))`` or ``Store(ServerEngine(QdrantClient(":memory:"), "c"))``.
The engines are imported lazily so that importing this package (e.g. for the CLI) stays cheap.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from services.store.frontend import Store
from services.store.protocol import VectorStore

if TYPE_CHECKING:
    from services.core.settings import Settings

log = logging.getLogger(__name__)

__all__ = ["Store", "VectorStore", "open_store"]


def open_store(settings: Settings) -> Store:
    """The embedded store under ``settings.store_dir`` unless ``settings.qdrant_url`` names a server.

    Server: ``QdrantClient(url=..., api_key=..., timeout=...)`` with ``settings.qdrant`` cluster options applied
    to new generations; ``":memory:"`` gives qdrant-client's in-process engine (tests only). The store owns the
    client: ``close()`` closes it.
    """
    if settings.qdrant_url:
        from services.store.server.engine import ServerEngine

        log.debug("opening the server store", extra={"url": settings.qdrant_url, "alias": settings.collection})
        return Store(ServerEngine.from_settings(settings))
    from services.store.edge.engine import EdgeEngine

    log.debug("opening the embedded store", extra={"dir": str(settings.store_dir), "alias": settings.collection})
    return Store(EdgeEngine.from_settings(settings))
