"""`dpr tune-hybrid`: the fusion of dense and BM25 results, tuned on a dev split."""
