"""The embedded engine (qdrant-edge, Qdrant's engine in-process; the default) and all that only it uses.

``engine.py`` (``EdgeEngine``), ``config.py`` (shard config, levers, converters), ``index.py`` (HNSW builds on a
copy; ``build_child.py`` runs in the build's process) and ``journal.py`` (the writes made meanwhile),
``snapshots.py``, ``lease.py``, ``lease_lifetime.py`` and ``generation_lock.py`` (one process per generation),
``owner.py`` (`dpr serve` answering other processes' writes).
"""
