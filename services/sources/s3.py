"""``s3://bucket/prefix`` on any S3-compatible store (AWS, MinIO, Ceph, SeaweedFS), through boto3.

boto3 (chosen over SigV4 written on httpx: 0.3-0.4 s to import and 0.4 s to build a client, once per sync, and it
brings the whole AWS credential chain, retries and ``AWS_ENDPOINT_URL_S3`` for free) is imported here only, so
nothing else pays for it. The endpoint: the source's own, else ``DPR_SOURCES__S3_ENDPOINT``, else what boto3
reads itself (``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, else AWS). Credentials: the variables the source
names (``key_env`` / ``secret_env``), else the AWS chain (environment, profile, instance role). No error text
ever carries a credential: messages are built from the bucket, the key and the error code only.

Item key: the object key after the prefix (``s3://docs/manuals/a.pdf`` with prefix ``manuals`` -> ``a.pdf``);
version: its ETag. Keys ending in ``/`` (folder markers) are not items.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from services.core.errors import ConfigError
from services.sources.kinds import Entry, ItemFailed, SourceError, SourceUnreachable

if TYPE_CHECKING:
    from services.core.settings import Settings
    from services.sources.registry import SourceSpec

_GONE = ("NoSuchKey", "404")
_REFUSED = ("NoSuchBucket", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403", "AllAccessDisabled")


def split_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> (``bucket``, ``some/prefix/``); the prefix ends in ``/`` unless empty."""
    bucket, _, prefix = uri[len("s3://"):].partition("/")
    prefix = prefix.strip("/")
    return bucket, f"{prefix}/" if prefix else ""


class S3Source:
    fetch_workers = 8  # downloads in flight ahead of the reader (boto3's client is thread-safe)

    def __init__(self, spec: SourceSpec, settings: Settings) -> None:
        self.spec = spec
        self.bucket, self.prefix = split_uri(spec.uri)
        self.max_bytes = max(settings.max_document_bytes, settings.documents.max_file_bytes)
        self.endpoint = spec.endpoint or settings.sources.s3_endpoint
        self._client = _client(spec, settings, self.endpoint, self.fetch_workers)

    @property
    def where(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" + (f" at {self.endpoint}" if self.endpoint else "")

    def listing(self) -> Iterator[Entry]:
        pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix)
        with self._errors("list"):
            for page in pages:
                for obj in page.get("Contents") or ():
                    key = str(obj["Key"])[len(self.prefix):]
                    if not key or key.endswith("/"):
                        continue
                    yield Entry(key, str(obj.get("ETag", "")).strip('"'), int(obj.get("Size") or 0))

    def fetch(self, entry: Entry, dest: Path) -> Path:
        if entry.size > self.max_bytes:
            raise ItemFailed("oversized", f"s3://{self.bucket}/{self.prefix}{entry.key}: {entry.size:,} bytes is over "
                             f"the {self.max_bytes:,}-byte limit; split it or raise DPR_DOCUMENTS__MAX_FILE_BYTES")
        target = dest / entry.key
        target.parent.mkdir(parents=True, exist_ok=True)
        with self._errors("read", entry.key):
            body = self._client.get_object(Bucket=self.bucket, Key=self.prefix + entry.key)["Body"]
            with open(target, "wb") as f:
                for chunk in body.iter_chunks(1 << 20):
                    f.write(chunk)
        return target

    def close(self) -> None:
        pass  # the client is the process's (``_client``), kept for the next sync

    @contextlib.contextmanager
    def _errors(self, what: str, key: str = "") -> Iterator[None]:
        """botocore's errors -> the sync's: unreachable (exit 3), refused (exit 1), or this one object's failure."""
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        name, where = self.spec.name, self.where
        item = f"s3://{self.bucket}/{self.prefix}{key}"
        try:
            yield
        except NoCredentialsError:
            raise ConfigError(f"source {name}: no credentials for {where}; set AWS_ACCESS_KEY_ID and "
                              "AWS_SECRET_ACCESS_KEY, or add the source with --key-env/--secret-env") from None
        except ClientError as error:
            code = str(error.response.get("Error", {}).get("Code", ""))
            status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
            if key and (code in _GONE or status == 404):
                raise ItemFailed("gone", f"{item}: removed since it was listed ({code or status}); the next sync "
                                 "removes its documents") from None
            if code in _REFUSED or status in (401, 403, 404):
                raise SourceError(f"source {name}: {where} refused to {what} ({code or status}); check the bucket "
                                  "name, the credentials and their permissions") from None
            if status >= 500 or status == 429 or code in ("SlowDown", "ServiceUnavailable", "InternalError"):
                raise SourceUnreachable(f"source {name}: {where} failed to {what} ({code or status}); try again "
                                        f"later (`dpr sources sync {name}`)") from None
            raise SourceError(f"source {name}: {where} refused to {what} {key} ({code or status})") from None
        except (BotoCoreError, OSError) as error:
            raise SourceUnreachable(f"source {name}: cannot reach {where} ({type(error).__name__}); check that the "
                                    "store is up and the endpoint is right (--endpoint, DPR_SOURCES__S3_ENDPOINT or "
                                    f"AWS_ENDPOINT_URL_S3), then `dpr sources sync {name}`") from None


_CLIENTS: dict[tuple[Any, ...], Any] = {}  # one boto3 client per (endpoint, credentials, region, limits) per process
_CLIENTS_LOCK = threading.Lock()


def _client(spec: SourceSpec, settings: Settings, endpoint: str | None, connections: int) -> Any:
    """The process's client for these settings: built once and kept (boto3 is thread-safe per client; building one
    per sync cost `dpr serve` about 1 MB of RSS each time in a 30-minute soak of syncs every minute)."""
    import boto3
    from botocore.config import Config

    credentials: dict[str, str] = {}
    if spec.key_env and spec.secret_env:
        for option, variable in (("aws_access_key_id", spec.key_env), ("aws_secret_access_key", spec.secret_env)):
            value = os.environ.get(variable)
            if not value:
                raise ConfigError(f"source {spec.name}: the environment variable {variable} (named by the source "
                                  "for its credentials) is not set; export it where the sync runs")
            credentials[option] = value
    timeout = settings.sources.timeout_s
    config = Config(connect_timeout=min(timeout, 10.0), read_timeout=timeout,
                    retries={"max_attempts": 3, "mode": "standard"}, max_pool_connections=connections + 2,
                    s3={"addressing_style": "path"} if endpoint else {})
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or settings.sources.s3_region
    key = (endpoint, region, timeout, connections, tuple(sorted(credentials.items())))
    with _CLIENTS_LOCK:
        if key not in _CLIENTS:
            _CLIENTS[key] = boto3.session.Session().client("s3", endpoint_url=endpoint, region_name=region,
                                                           config=config, **credentials)
        return _CLIENTS[key]
