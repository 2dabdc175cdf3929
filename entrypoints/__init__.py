"""Entry points: the `dpr` CLI, the HTTP API and the worker bootstrap.

They are the only composition roots: they parse input, build one ``services.runtime.Runtime`` from the settings,
choose the executor (in-process or Celery) once, call the domain and format output. They are the only code that
knows both ``services/`` (the domain) and ``workers/`` (Celery).
"""
