"""`dpr eval`: retrievers, metric tables and reports, in memory or through the real store."""
