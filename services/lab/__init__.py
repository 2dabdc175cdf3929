"""Training, evaluation, adaptation and feedback: code that runs only when a model learns or is measured, never on
the query or ingest path.
"""
