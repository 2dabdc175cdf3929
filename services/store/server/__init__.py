"""The server engine: qdrant-client against a Qdrant server or cluster (``engine.py``), its converters and snapshots."""
