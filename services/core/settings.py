"""The one settings object. Constructed only at composition roots (CLI callback, worker app, API app).

Environment variables use the ``DPR_`` prefix and ``__`` for nesting, e.g. ``DPR_CHUNK__OVERLAP=32``.
A ``.env`` file in the working directory is read too.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from services.core.errors import ConfigError
from services.core.store_settings import EdgeSettings, QdrantSettings

if TYPE_CHECKING:
    from encoders.runtimes import Backend, Choice

COLLECTION_NAME = r"^[A-Za-z0-9_-]{1,64}$"
# torch's device types (torch.device refuses anything else), with an optional index: cpu, cuda, cuda:1, mps
DEVICE_TYPES = (
    "cpu", "cuda", "mps", "xpu", "hip", "ipu", "hpu", "mtia", "xla", "lazy", "vulkan", "meta", "mkldnn", "opengl",
    "opencl", "ideep", "ve", "fpga", "maia", "privateuseone",
)
MODEL_FILES = ("modules.json", "config.json")  # a sentence-transformers (or plain transformers) model directory


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
    device: str = Field(default="cpu", description="torch device: cpu, cuda, cuda:N, mps, ...")
    threads: int | None = Field(
        default=None, ge=1,
        description="Intra-op threads of the towers (torch, onnxruntime); default (services/core/threads.py): "
        "the usable "
        "cores (affinity, cgroup quota), split between a worker's pool processes; `dpr serve`: 1."
    )
    backend: Literal["auto", "torch", "onnx", "onnx-int8", "openvino-bf16", "openvino-fp32"] = Field(
        default="auto",
        description="What runs the towers: auto (the default: chosen from the CPU by encoders/runtimes.py, OpenVINO "
        "bf16 where it has AMX (1.5-2.5x int8's passages/s at cosine 0.99998 to fp32) or is AMD with AVX512_BF16, "
        "else OpenVINO fp32 passages "
        "and onnx questions), torch, onnx (ONNX Runtime fp32), onnx-int8 (dynamic int8: faster, not faithful), "
        "openvino-bf16 or openvino-fp32. The export is made once per model and "
        "machine (ONNX_CACHE) and tied to its fingerprint; a model the export cannot reproduce is served by torch.",
    )
    question_backend: Literal["auto", "torch", "onnx", "onnx-int8", "openvino-bf16", "openvino-fp32"] | None = Field(
        default=None,
        description="Backend of the question tower (queries); default: with backend auto, chosen from the CPU the "
        "same way (onnx fp32 where bf16 is not chosen); beside explicit onnx-int8 passages, onnx; else the same "
        "as backend. Any backend but torch keeps torch out of `dpr query`, which then starts in under a second.",
    )

    @property
    def passages(self) -> Backend:
        """The passage tower's backend, ``auto`` resolved from the CPU (``encoders.runtimes.choose``)."""
        return self.choice("document").backend

    @property
    def questions(self) -> Backend:
        """The question tower's backend: ``question_backend`` if set; with ``backend`` auto, chosen from the CPU;
        beside ``onnx-int8`` passages, ``onnx``: fp32 questions take int8's rounding off one side of every score
        for a few milliseconds per question (README, Backends); else the passage backend."""
        return self.choice("query").backend

    def choice(self, role: Literal["query", "document"]) -> Choice:
        """The runtime of one tower and why (``dpr status`` reports it)."""
        from encoders.runtimes import choose

        if role == "document":
            return choose("document", self.backend)
        return choose("query", self.question_backend or "auto", passages=self.backend)

    @field_validator("device", mode="after")
    @classmethod
    def _known_device(cls, value: str) -> str:
        kind, _, index = value.partition(":")
        if kind not in DEVICE_TYPES or (index and not index.isdigit()):
            raise ValueError(
                f"DPR_ENCODER__DEVICE={value!r} is not a torch device; use cpu, cuda, cuda:N or mps "
                f"(known types: {', '.join(DEVICE_TYPES)})"
            )
        return value


class RerankSettings(BaseModel):
    """The cross-encoder reranker over the first stage's hits (`dpr train-reranker`, `dpr query --rerank N`)."""

    model: str | None = Field(
        default=None,
        description="Reranker name under DATA_DIR/models or a path; default: the one the collection recorded, else "
        "the newest reranker.",
    )
    backend: Literal["torch", "onnx", "onnx-int8", "openvino-bf16", "openvino-fp32"] | None = Field(
        default=None, description="What runs the reranker; default: the passage tower's backend (it reads N "
        "passages per question)."
    )
    batch_size: int = Field(default=32, ge=1, le=1024, description="(question, passage) pairs per forward pass.")


class CelerySettings(BaseModel):
    visibility_timeout: int = Field(default=3600, ge=10, description="Seconds; above the longest task.")
    task_time_limit: int = Field(default=1800, ge=10)
    batch_documents: int = Field(default=64, ge=1, description="Documents per ingest task.")
    batch_bytes: int = Field(default=1_000_000, ge=1024, description="Max text bytes per ingest task.")
    inline_file_bytes: int = Field(
        default=2_097_152, ge=0, description="A PDF/DOCX/PPTX/ODT/EPUB up to this size travels in the task (base64);"
        " larger ones reach the workers by path (docs/documents.md, Parsing with workers). 0: always by path."
    )
    path_map: str = Field(
        default="", description="On workers: CLIENT_PREFIX=WORKER_PREFIX[;...] rewrites the paths of files sent by "
        "path, where the shared folder is mounted elsewhere than on the submitting machine."
    )
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
        default=None, description="An admin key: when set, every /v1 request needs a key, header 'X-API-Key' (or "
        "'Authorization: Bearer'). Keys with a role: `dpr keys create` (docs/security.md)."
    )
    max_request_bytes: int = Field(default=10_000_000, ge=1024, description="Larger request bodies get 413.")
    max_documents: int = Field(default=1000, ge=1, description="Documents per POST /v1/documents request.")
    ready_timeout: float = Field(default=2.0, gt=0, description="Seconds /readyz waits for the broker and store.")
    # Abuse limits (docs/security.md): per-key token buckets, and slow clients cut.
    rate_limit: float | None = Field(
        default=50.0, gt=0, description="Requests per second per API key (a token bucket; 429 + Retry-After "
        "beyond); unset: only keys created with --rate are limited. Applies once keys are configured.",
    )
    rate_burst: int = Field(default=100, ge=1, description="Requests a key may send at once before the rate applies.")
    header_timeout: float = Field(
        default=10.0, gt=0, description="Seconds a client has to send a request's headers; slower connections "
        "(slowloris) are closed.",
    )
    body_timeout: float = Field(
        default=30.0, gt=0, description="Seconds a request body may stall between two chunks before the connection "
        "is closed.",
    )
    keep_alive_timeout: int = Field(default=5, ge=1, description="Seconds an idle keep-alive connection stays open.")
    max_header_bytes: int = Field(
        default=16_384, ge=1024, description="Largest request line + headers; larger ones get 400."
    )
    # Admission (entrypoints/api/admission.py, docs/capacity.md): a burst beyond capacity gets 503 + Retry-After.
    max_in_flight: int = Field(default=16, ge=1, description="/v1 requests at work at once per worker process.")
    max_queue: int = Field(
        default=256, ge=0, description="/v1 requests that may wait for a slot; more get 503 + Retry-After at once."
    )
    queue_timeout: float = Field(
        default=5.0, gt=0, description="Seconds a request may wait for a slot before it gets 503 + Retry-After."
    )

    @field_validator("api_key", mode="after")
    @classmethod
    def _empty_key_is_no_key(cls, value: SecretStr | None) -> SecretStr | None:
        """An empty DPR_API__API_KEY (a blank Secret or compose default) means no key, never the empty key."""
        return None if value is not None and not value.get_secret_value() else value


class ServingSettings(BaseModel):
    """The serving runtime's question batcher (services/serving.py, docs/capacity.md): concurrent questions share one
    question-tower call; repeated questions are encoded once."""

    batching: bool = Field(default=True, description="Encode concurrent questions together; false: each alone.")
    batch_window_ms: float = Field(
        default=0.0, ge=0, le=100, description="Milliseconds a batch waits for more questions while they come "
        "together (never for a lone question); 0: a batch is what queued while the tower was busy (measured no "
        "worse than 2 or 5 ms: docs/capacity.md)."
    )
    max_batch: int = Field(default=32, ge=1, le=1024, description="Questions per question-tower call at most.")
    encoders: int = Field(default=2, ge=1, le=64, description="Question-tower calls at once (encoder threads).")
    cache_size: int = Field(
        default=4096, ge=0, description="Encoded questions kept (LRU per model fingerprint + text); 0: no cache."
    )


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


class DocumentSettings(BaseModel):
    """Limits on reading binary documents (PDF, DOCX, PPTX, ODT, EPUB): each is parsed in a child process
    (services/readers/sandbox.py), so a hang or a crash costs that one document; see docs/documents.md."""

    parse_timeout_s: float = Field(default=120.0, gt=0, description="Seconds one document may take to parse.")
    max_pages: int = Field(default=5000, ge=1, description="Pages (slides) read per document; the rest are reported.")
    max_file_bytes: int = Field(default=500_000_000, ge=1, description="Larger binary documents are refused.")
    max_uncompressed_bytes: int = Field(
        default=300_000_000, ge=1, description="Total bytes a DOCX/PPTX/ODT/EPUB may inflate to (zip bomb guard)."
    )
    max_compression_ratio: float = Field(
        default=200.0, gt=1, description="Inflated/compressed ratio above which a large zip entry is refused."
    )
    max_parser_memory_mb: int = Field(
        default=4096, ge=256, description="Address-space cap of the parser process (MiB); over it the document fails."
    )
    ocr: bool = Field(
        default=False, description="Read PDF pages without a text layer (scans) with Debian's tesseract (apt-get "
        "install tesseract-ocr tesseract-ocr-eng); off: a scan fails as no_text_layer. See docs/documents.md."
    )
    ocr_language: str = Field(default="eng", pattern=r"^[A-Za-z_+]{2,64}$", description="tesseract -l LANG.")
    ocr_dpi: int = Field(default=200, ge=72, le=600, description="Resolution pages are rendered at for OCR.")
    quarantine_dir: Path | None = Field(
        default=None, description="Where documents that crashed the parser are remembered (by sha256 of their "
        "bytes) for every process using it; default DATA_DIR/quarantine. See docs/documents.md."
    )


class SourceSettings(BaseModel):
    """Sources kept in sync (`dpr sources`, services/sources/): where an s3:// source's store is, and bounds on a
    sync's reads; see docs/sources.md."""

    s3_endpoint: str | None = Field(
        default=None, description="URL of the S3-compatible store for s3:// sources that name none (else "
        "AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, else AWS)."
    )
    s3_region: str = Field(default="us-east-1", description="Region for s3:// sources when AWS_REGION is unset.")
    timeout_s: float = Field(default=30.0, gt=0, description="Seconds a source may take to answer one request.")
    tick_seconds: float = Field(
        default=30.0, ge=0, description="How often `dpr serve` (embedded) or the beat (workers) looks for sources "
        "due to sync; 0: sources sync only when asked."
    )
    folder_roots: list[Path] = Field(
        default_factory=list, description="Folders under which sources on this machine (a folder, a git repository "
        "by path) may be added over HTTP (POST /v1/sources); empty: only with `dpr sources add` on the machine."
    )
    allow_private_addresses: bool = Field(
        default=False, description="Let http(s) sources reach loopback, private and link-local addresses (off: "
        "refused, redirects included)."
    )
    max_pages: int = Field(default=10_000, ge=1, description="Pages an http(s) source may list; more: the sync "
                           "reads and removes nothing, naming this setting.")
    max_depth: int = Field(default=10, ge=0, description="Links an http(s) source follows from its start page.")
    max_page_bytes: int = Field(default=20_000_000, ge=1024, description="Largest page an http(s) source reads.")
    max_total_bytes: int = Field(default=2_000_000_000, ge=1024, description="Bytes one http(s) sync may read.")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="DPR_",
        env_nested_delimiter="__",
        env_file=".env",
        extra="ignore",
        validate_default=True,
    )

    data_dir: Path = Field(default=Path(".dpr"), description="Embedded store, models, job state.")
    onnx_cache: Path | None = Field(
        default=None, description="Exports of models outside DATA_DIR/models (the base model); default the machine's "
        "cache, $XDG_CACHE_HOME/dpr-ingest/towers (~/.cache/dpr-ingest/towers). Exports are tied to the model's "
        "fingerprint and checked when they load, so every data dir shares one."
    )
    collection: str = Field(default="passages", pattern=COLLECTION_NAME)
    broker_url: str | None = Field(default=None, description="redis://... to run ingest on Celery workers.")
    qdrant_url: str | None = Field(default=None, description="Qdrant server URL; unset: the embedded engine.")
    qdrant_api_key: SecretStr | None = None
    max_document_bytes: int = Field(default=20_000_000, ge=1, description="Larger documents are refused.")
    min_free_mb: int = Field(
        default=256, ge=0, description="Free MB the data dir's disk must keep: a store write, job file, snapshot "
        "or model export below it stops with exit 3 and writes nothing (docs/data-safety.md); 0 turns it off."
    )
    api_url: str | None = None
    """URL of a running `dpr serve` (http://host:8000): `dpr query` and `dpr status` then ask it over HTTP."""

    chunk: ChunkSettings = ChunkSettings()
    encoder: EncoderSettings = EncoderSettings()
    rerank: RerankSettings = RerankSettings()
    qdrant: QdrantSettings = QdrantSettings()
    edge: EdgeSettings = EdgeSettings()
    celery: CelerySettings = CelerySettings()
    api: ApiSettings = ApiSettings()
    serving: ServingSettings = ServingSettings()
    reembed: ReembedSettings = ReembedSettings()
    documents: DocumentSettings = DocumentSettings()
    sources: SourceSettings = SourceSettings()

    @model_validator(mode="after")
    def _check_urls(self) -> Settings:
        if self.broker_url is not None:
            _check_url(
                "DPR_BROKER_URL", self.broker_url, "Redis", ("redis", "rediss"),
                "use redis://host:6379/0 or unset it to run the pipeline in-process", need_host=False,
            )
        if self.qdrant_url is not None and not self.qdrant_url.startswith(":memory:"):
            _check_url(
                "DPR_QDRANT_URL", self.qdrant_url, "Qdrant", ("http", "https"),
                "use http://host:6333 or unset it for the embedded engine", need_host=True,
            )
        return self

    @model_validator(mode="after")
    def _check_model_dir(self) -> Settings:
        """A model setting that names a directory must name a model (not, say, the data folder)."""
        spec = self.encoder.model
        if spec in ("active", "base", "multilingual"):  # built-in names (encoders.registry.BUILTIN)
            return self
        for path in (self.models_dir / spec, Path(spec).expanduser()):
            if path.is_dir() and not any((path / name).is_file() for name in MODEL_FILES):
                raise ValueError(
                    f"DPR_ENCODER__MODEL={spec!r}: {path} is a directory but not a model (no "
                    f"{' or '.join(MODEL_FILES)}); point it at a model directory (`dpr models list`) or set "
                    "DPR_ENCODER__MODEL=base"
                )
        return self

    @property
    def store_backend(self) -> Literal["edge", "server"]:
        return "server" if self.qdrant_url else "edge"

    @property
    def models_dir(self) -> Path:
        return self.data_dir / "models"

    @property
    def onnx_cache_dir(self) -> Path:
        """Exports of models outside models_dir (the base model): ONNX_CACHE, default the machine's cache
        (``$XDG_CACHE_HOME/dpr-ingest/towers``, else ``~/.cache/dpr-ingest/towers``), shared by every data dir,
        worker and server of this user: a tower is converted once per machine, not per collection."""
        if self.onnx_cache is not None:
            return self.onnx_cache
        import os

        root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return Path(root) / "dpr-ingest" / "towers"

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


def _check_url(variable: str, url: str, label: str, schemes: tuple[str, ...], fix: str, need_host: bool) -> None:
    """A URL the client libraries can parse: a known scheme, a host, and a port that is a number in range."""
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises on a port that is not a number in 0..65535
    except ValueError as e:
        raise ValueError(f"{variable}={url!r} is not a valid URL ({e}); {fix}") from None
    if parts.scheme not in schemes:
        raise ValueError(f"{variable}={url!r} is not a {label} URL; {fix}")
    if need_host and not parts.hostname:
        raise ValueError(f"{variable}={url!r} has no host; {fix}")
