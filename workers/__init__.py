"""Celery side of dpr-ingest: the app (built from Settings at start), thin tasks, and the submitter.

Nothing in ``services/`` imports this package; ``entrypoints.cli`` imports it lazily when a broker is configured.
"""
