"""The two engines under the store front end (``services.store.protocol.Engine``), one file each.

- ``edge.py``: qdrant-edge-py, Qdrant's engine in-process (the embedded default), one shard directory per
  generation under a file lease (``services/store/lease.py``).
- ``server.py``: qdrant-client against a Qdrant server or cluster (or its in-process engine in tests).

Import them directly (each pulls in its engine library); ``services.store.open_store`` picks one from the settings.
"""
