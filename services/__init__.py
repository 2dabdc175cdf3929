"""dpr-ingest domain layer: settings, documents, chunking, vector store, ingest / query / re-embed services."""
