"""HTTP API over the services: ``entrypoints.api.app.create_app(settings)`` (FastAPI), served by uvicorn via
``dpr serve``. Nothing is imported here: the package's modules (``app``, ``routes.*``, ``schemas``, ...) import one
another, never this package, so there is no cycle through it."""
