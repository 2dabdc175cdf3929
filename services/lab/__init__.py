"""The lab: training, adaptation, mining, the reranker and evaluation, one folder per thing trained. It runs only when
a model learns or is measured, never on the query or ingest path (tests/unit/test_layers.py keeps it off both); the
serving towers, the registry and the ONNX export stay in ``encoders``.

- ``towers/``: `dpr train` (``recipe``, ``recipe_file`` + ``recipe.toml``, ``rounds``; the sentence-transformers
  ``trainer`` and ``question_only``), WiSE-FT and soups (``wise_ft``; ``blend_and_soup``: `dpr models blend|soup`).
- ``reranker/``: `dpr train-reranker` (``recipe``, ``recipe_file`` + ``recipe.toml``; the cross-encoder ``trainer``).
- ``adaptation/``: `dpr adapt` (``recipe``; ``mining_stage``; the hybrid-agreement ``teacher``).
- ``hybrid/``: `dpr tune-hybrid` (``tuning``: the fusion and its weight, chosen on a dev split).
- ``evaluation/``: `dpr eval` (``retrieval``: retrievers, metric tables, the report; ``store_retriever``: through the
  real store).
- ``shared/``: what every folder above uses: ``training_run`` (the run and the recipe skeleton of every trainer),
  ``rows``, ``self_supervised`` pairs, BM25 and hard-negative ``mining``, ``metrics``, ``stages``
  (a run of resumable stages), ``recipe_files`` (a recipe file's loader). It imports nothing of the folders above it.
"""
