"""Vector stores: one ``VectorStore`` protocol, two adapters (``engines/edge.py``: embedded qdrant-edge;
``engines/server.py``: Qdrant server).

``open_store(settings)`` is the one place that picks and builds an adapter; the adapters are imported lazily
so that importing this package (e.g. for the CLI) stays cheap.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from services.store.protocol import VectorStore

if TYPE_CHECKING:
    from services.settings import Settings

log = logging.getLogger(__name__)

__all__ = ["VectorStore", "open_store"]


def open_store(settings: Settings) -> VectorStore:
    """The embedded store under ``settings.store_dir`` unless ``settings.qdrant_url`` names a server.

    Server: ``QdrantClient(url=..., api_key=..., timeout=...)`` with ``settings.qdrant`` cluster options applied
    to new generations; ``":memory:"`` gives qdrant-client's in-process engine (tests only). The store owns the
    client: ``close()`` closes it.
    """
    if settings.qdrant_url:
        from services.store.engines.server import ServerStore

        log.debug("opening the server store", extra={"url": settings.qdrant_url, "alias": settings.collection})
        return ServerStore.from_settings(settings)
    from services.store.engines.edge import EdgeStore

    log.debug("opening the embedded store", extra={"dir": str(settings.store_dir), "alias": settings.collection})
    return EdgeStore.from_settings(settings)
