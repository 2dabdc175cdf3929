"""Ingest, one package, top to bottom: ``job`` (one run, input to report) -> ``executor`` (where a job's batches run:
this process, or ``workers.executor.CeleryExecutor``) -> ``batches`` (the one batch loop: a job cut into batches,
one batch run and its outcome recorded) -> ``pipeline`` (one batch: chunk, ``encoding``, write) -> ``files`` (parse
a batch's binary files), ``chunking``, ``language``. ``follow`` waits for a job to end; ``sync`` keeps a collection
in step with a folder. Job state is ``services.jobs`` (below). Nothing is imported here.
"""
