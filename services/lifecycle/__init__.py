"""The model lifecycle (placeholder while the module is split)."""

from __future__ import annotations

from services.lifecycle.swap import *  # noqa: F403
