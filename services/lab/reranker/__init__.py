"""`dpr train-reranker`: the cross-encoder reranker's recipe and trainer."""
