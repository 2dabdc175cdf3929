"""HTTP API over the services: ``create_app(settings)`` (FastAPI), served by uvicorn via ``dpr serve``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import FastAPI

    from services.settings import Settings

__all__ = ["create_app"]


def create_app(settings: Settings, **kwargs: Any) -> FastAPI:
    from entrypoints.api.app import create_app as _create_app

    return _create_app(settings, **kwargs)
