"""The one settings object. Constructed only at composition roots (CLI callback, worker app, API app).

Environment variables use the ``DPR_`` prefix and ``__`` for nesting, e.g. ``DPR_CHUNK__OVERLAP=32``.
A ``.env`` file in the working directory is read too.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from services.errors import ConfigError

COLLECTION_NAME = r"^[A-Za-z0-9_-]{1,64}$"


class ChunkSettings(BaseModel):
    """How documents become passages (token windows of the passage tower's own tokenizer)."""

    max_tokens: int | None = Field(
        default=None, ge=16, description="Window size in tokens; default: the passage tower's max length."
    )
    overlap: int = Field(default=32, ge=0, description="Tokens shared by consecutive windows.")
    max_title_tokens: int = Field(default=32, ge=0, description="Title tokens carried with each passage.")

    @model_validator(mode="after")
    def _overlap_below_window(self) -> ChunkSettings:
        if self.max_tokens is not None and self.overlap >= self.max_tokens:
            raise ValueError(
                f"chunk.overlap ({self.overlap}) must be smaller than chunk.max_tokens ({self.max_tokens}); "
                "lower DPR_CHUNK__OVERLAP"
            )
        return self


class EncoderSettings(BaseModel):
    """Which towers encode passages and questions."""

    model: str = Field(
        default="active",
        description="'active' (the activated model, else the base), 'base', a model name under "
        "DATA_DIR/models, or a path to a model directory.",
    )
    batch_size: int = Field(default=32, ge=1, le=4096)
    device: str = "cpu"
    threads: int | None = Field(default=None, ge=1, description="torch intra-op threads; default: all cores.")


class QdrantSettings(BaseModel):
    """Server adapter (qdrant-client) options; applied on collection creation."""

    timeout: float = 30.0
    shard_number: int | None = Field(default=None, ge=1)
    replication_factor: int | None = Field(default=None, ge=1)
    write_consistency_factor: int | None = Field(default=None, ge=1)
    on_disk_vectors: bool = False
    hnsw_m: int | None = Field(default=None, ge=0)
    hnsw_ef_construct: int | None = Field(default=None, ge=4)
    quantization: Literal["none", "int8"] = "none"


class EdgeSettings(BaseModel):
    """Embedded engine (qdrant-edge) options."""

    lock_timeout: float = Field(default=120.0, gt=0, description="Seconds to wait for the shard's file lock.")
    idle_release: float = Field(
        default=0.5, ge=0, description="Seconds a process keeps the shard open after its last use."
    )


class CelerySettings(BaseModel):
    visibility_timeout: int = Field(default=3600, ge=10, description="Seconds; above the longest task.")
    task_time_limit: int = Field(default=1800, ge=10)
    batch_documents: int = Field(default=64, ge=1, description="Documents per ingest task.")
    batch_bytes: int = Field(default=1_000_000, ge=1024, description="Max text bytes per ingest task.")
    max_retries: int = Field(default=8, ge=0)
    unacked_restore_interval: float | None = Field(
        default=None, gt=0, description="Seconds between sweeps that redeliver unacked tasks (kombu default 10)."
    )
    unacked_restore_throttle: int | None = Field(
        default=None, ge=1, description="Scan on every Nth sweep (kombu default 10); 1 in tests."
    )


class ApiSettings(BaseModel):
    """HTTP API (`dpr serve`): where it listens, how big a request may be, optional API key."""

    host: str = Field(default="127.0.0.1", description="Bind address; 0.0.0.0 inside a container.")
    port: int = Field(default=8000, ge=1, le=65535)
    workers: int = Field(default=1, ge=1, le=64, description="uvicorn worker processes (each loads the model).")
    api_key: SecretStr | None = Field(
        default=None, description="When set, every /v1 request needs header 'X-API-Key' (or 'Authorization: Bearer')."
    )
    max_request_bytes: int = Field(default=10_000_000, ge=1024, description="Larger request bodies get 413.")
    max_documents: int = Field(default=1000, ge=1, description="Documents per POST /v1/documents request.")
    ready_timeout: float = Field(default=2.0, gt=0, description="Seconds /readyz waits for the broker and store.")

    @field_validator("api_key", mode="after")
    @classmethod
    def _empty_key_is_no_key(cls, value: SecretStr | None) -> SecretStr | None:
        """An empty DPR_API__API_KEY (a blank Secret or compose default) means no key, never the empty key."""
        return None if value is not None and not value.get_secret_value() else value


class ReembedSettings(BaseModel):
    """Model lifecycle: re-embedding into a new generation, the beat check, generations kept."""

    schedule_seconds: float | None = Field(
        default=None, gt=0, description="Beat: seconds between checks for a model change; unset: no schedule."
    )
    batch_size: int = Field(default=256, ge=1, le=10_000, description="Passages per re-embed batch (task).")
    keep_generations: int = Field(default=2, ge=0, description="Inactive generations `dpr gc` keeps by default.")
    lock_ttl: float = Field(default=600.0, ge=10, description="Seconds a re-embed or beat lock lives unrefreshed.")
    fence_timeout: float = Field(
        default=300.0, gt=0, description="Seconds writers wait for a swap, and a swap waits for in-flight writes."
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="DPR_",
        env_nested_delimiter="__",
        env_file=".env",
        extra="ignore",
        validate_default=True,
    )

    data_dir: Path = Field(default=Path(".dpr"), description="Embedded store, models, job state.")
    collection: str = Field(default="passages", pattern=COLLECTION_NAME)
    broker_url: str | None = Field(default=None, description="redis://... to run ingest on Celery workers.")
    qdrant_url: str | None = Field(default=None, description="Qdrant server URL; unset: the embedded engine.")
    qdrant_api_key: SecretStr | None = None
    max_document_bytes: int = Field(default=20_000_000, ge=1, description="Larger documents are refused.")

    chunk: ChunkSettings = ChunkSettings()
    encoder: EncoderSettings = EncoderSettings()
    qdrant: QdrantSettings = QdrantSettings()
    edge: EdgeSettings = EdgeSettings()
    celery: CelerySettings = CelerySettings()
    api: ApiSettings = ApiSettings()
    reembed: ReembedSettings = ReembedSettings()

    @model_validator(mode="after")
    def _check_urls(self) -> Settings:
        if self.broker_url is not None and not self.broker_url.startswith(("redis://", "rediss://")):
            raise ValueError(
                f"DPR_BROKER_URL={self.broker_url!r} is not a Redis URL; use redis://host:6379/0 or unset it "
                "to run the pipeline in-process"
            )
        url = self.qdrant_url
        if url is not None and not url.startswith(("http://", "https://", ":memory:")):
            raise ValueError(
                f"DPR_QDRANT_URL={url!r} is not a Qdrant URL; use http://host:6333 or unset it for the "
                "embedded engine"
            )
        return self

    @property
    def store_backend(self) -> Literal["edge", "server"]:
        return "server" if self.qdrant_url else "edge"

    @property
    def models_dir(self) -> Path:
        return self.data_dir / "models"

    @property
    def store_dir(self) -> Path:
        return self.data_dir / "store"

    def for_collection(self, collection: str | None) -> Settings:
        """The same settings for another collection (alias); ``None`` or the same name returns ``self``."""
        if not collection or collection == self.collection:
            return self
        if not re.fullmatch(COLLECTION_NAME, collection):
            raise ConfigError(f"collection {collection!r} is not a valid name; use 1-64 letters, digits, '_' or '-'")
        return self.model_copy(update={"collection": collection})
