"""The sources of a data dir: what each one is (``SourceSpec``), kept as ``DATA_DIR/sources/NAME/source.json``.

A source is a place documents live (a folder, an S3-compatible bucket prefix, a git repository) that the product
keeps a collection in step with. Its spec holds no secret: credentials are named by the environment variable that
holds them (``key_env`` / ``secret_env``), read only when a sync runs, and never written, logged or shown.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from services.core.errors import ConfigError, Conflict, PermanentError
from services.core.fsutil import now_iso, write_atomic
from services.sources.state import sync_lock

Kind = Literal["folder", "s3", "git", "web"]
NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]{0,127}"
SOURCES_DIR = "sources"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MIN_INTERVAL_S = 60.0


class SourceNotFound(PermanentError):
    """No source of that name in this data dir."""


@dataclass(frozen=True)
class SourceSpec:
    """One source: where (``uri``, of ``kind``), what (``include`` / ``exclude`` globs over the item's key, the
    path inside the source), into which collection, how often (``every_s``; None: only when asked)."""

    name: str
    uri: str
    kind: Kind
    collection: str | None = None
    every_s: float | None = None
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    endpoint: str | None = None  # s3: the store's URL (else DPR_SOURCES__S3_ENDPOINT, AWS_ENDPOINT_URL[_S3])
    key_env: str | None = None  # s3: the variable holding the access key id (else the AWS chain)
    secret_env: str | None = None  # s3: the variable holding the secret access key
    branch: str | None = None  # git: the branch followed (else the repository's HEAD)
    created: str = field(default_factory=now_iso)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["include"], out["exclude"] = list(self.include), list(self.exclude)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SourceSpec:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["include"] = tuple(known.get("include") or ())
        known["exclude"] = tuple(known.get("exclude") or ())
        return cls(**known)

    def selects(self, key: str) -> bool:
        """Whether an item at ``key`` belongs to the source: matches an include glob (any, when none) and no
        exclude glob. ``*`` matches across folders (``*.md`` selects ``guide/intro.md``)."""
        from fnmatch import fnmatchcase

        if self.include and not any(fnmatchcase(key, g) for g in self.include):
            return False
        return not any(fnmatchcase(key, g) for g in self.exclude)

    def doc_id(self, key: str) -> str:
        """The document id of the item at ``key``: ``NAME/key`` (what ``dpr ingest`` gives a folder named NAME)."""
        return f"{self.name}/{key}"


def parse_interval(text: str | None) -> float | None:
    """``15m``, ``1h``, ``90s``, ``2d`` or plain seconds -> seconds; None/"" -> None (synced only when asked)."""
    if text is None or not str(text).strip():
        return None
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", str(text))
    if not match:
        raise ConfigError(f"--every {text!r} is not an interval; use e.g. 90s, 15m, 1h or 1d")
    seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if seconds < MIN_INTERVAL_S:
        raise ConfigError(f"--every {text!r} is shorter than {MIN_INTERVAL_S:.0f} s; use 1m or more")
    return seconds


def format_interval(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def kind_of(uri: str) -> Kind:
    """``s3://bucket/prefix`` -> s3; ``git+URL`` or a URL / path ending in ``.git`` -> git; ``http(s)://`` -> web;
    a folder -> folder."""
    if uri.startswith("s3://"):
        return "s3"
    if uri.startswith("git+") or uri.rstrip("/").endswith(".git"):
        return "git"
    if uri.startswith(("http://", "https://")):
        return "web"
    if re.match(r"^[a-z][a-z0-9+.-]*://", uri):
        raise ConfigError(f"{uri}: not a source this version reads; give a folder, s3://bucket/prefix, a web site "
                          "(https://host/path/) or a git repository (git+https://host/repo.git, git+file:///path/repo)")
    return "folder"


def new_spec(name: str, uri: str, **options: Any) -> SourceSpec:
    """A checked spec: a valid name, a URI of a known kind (a folder made absolute, and existing), env names that
    are names (never values), a branch only for git, an endpoint only for s3."""
    if not re.fullmatch(NAME, name):
        raise ConfigError(f"source name {name!r} is not valid; use 1-64 letters, digits, '_', '.' or '-', starting "
                          "with a letter or digit")
    kind = kind_of(uri)
    if re.match(r"^[a-z][a-z0-9+.-]*://[^/@]*:[^/@]*@", uri):
        raise ConfigError(f"source {name}: the URI holds a password, which would be stored in clear; give it to git's "
                          "credential helper (git config credential.helper), or for s3 name the variables that hold "
                          "it with --key-env/--secret-env")
    if kind == "folder":
        path = Path(uri).expanduser()
        if not path.is_dir():
            raise ConfigError(f"{uri}: no such folder; give an existing folder, s3://bucket/prefix or a git URL")
        uri = str(path.resolve())
    elif kind == "s3":
        bucket = uri[len("s3://"):].split("/", 1)[0]
        if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", bucket):
            raise ConfigError(f"{uri}: {bucket!r} is not a bucket name; use s3://bucket/prefix (3-63 lowercase "
                              "letters, digits, '.' or '-')")
    elif kind == "web":
        from urllib.parse import urlsplit

        parts = urlsplit(uri)
        if not parts.hostname or parts.query or parts.fragment:
            raise ConfigError(f"{uri}: give a site and a path, e.g. https://docs.example.org/guide/ (no query or "
                              "fragment)")
    for option in ("key_env", "secret_env"):
        value = options.get(option)
        if value is not None and not re.fullmatch(ENV_NAME, value):
            flag = option.replace("_", "-")
            raise ConfigError(f"--{flag} takes the NAME of an environment variable (e.g. AWS_ACCESS_KEY_ID), not "
                              "a value; credentials are never stored")
    if (options.get("key_env") is None) != (options.get("secret_env") is None):
        raise ConfigError("--key-env and --secret-env go together; give both variable names, or neither (the AWS "
                          "chain is used)")
    endpoint = options.get("endpoint")
    if endpoint is not None and not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", endpoint):
        raise ConfigError(f"--endpoint {endpoint!r} is not a URL; give the store's, e.g. http://127.0.0.1:8333")
    if kind != "s3" and any(options.get(o) for o in ("endpoint", "key_env", "secret_env")):
        raise ConfigError(f"--endpoint, --key-env and --secret-env are for s3:// sources; {uri} is a {kind}")
    if kind != "git" and options.get("branch"):
        raise ConfigError(f"--branch is for git sources; {uri} is a {kind}")
    return SourceSpec(name=name, uri=uri, kind=kind, **{k: v for k, v in options.items() if v is not None})


def local_path(spec: SourceSpec) -> Path | None:
    """The path on this machine a source reads (a folder, a git repository given by path); None for a remote one."""
    if spec.kind == "folder":
        return Path(spec.uri)
    if spec.kind == "git":
        url = spec.uri.removeprefix("git+").removeprefix("file://")
        return None if re.match(r"^[a-z][a-z0-9+.-]*://|^[^/]+@[^/]+:", url) else Path(url).expanduser()
    return None


class Registry:
    """The sources of one data dir: a folder per source under ``DATA_DIR/sources`` (its spec, its state, its
    lock, its last sync's record)."""

    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir / SOURCES_DIR

    def folder(self, name: str) -> Path:
        return self.root / name

    def add(self, spec: SourceSpec) -> SourceSpec:
        folder = self.folder(spec.name)
        if (folder / "source.json").exists():
            raise Conflict(f"source {spec.name!r} exists already; `dpr sources remove {spec.name}` first, or "
                           "choose another name")
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(folder / "source.json", json.dumps(spec.to_json(), indent=1))
        return spec

    def get(self, name: str) -> SourceSpec:
        path = self.folder(name) / "source.json"
        if not re.fullmatch(NAME, name) or not path.is_file():
            known = ", ".join(s.name for s in self.all()) or "none"
            raise SourceNotFound(f"no source {name!r} in {self.root.parent} (sources: {known}); add it with "
                                 "`dpr sources add NAME URI`")
        return SourceSpec.from_json(json.loads(path.read_text(encoding="utf-8")))

    def all(self) -> list[SourceSpec]:
        if not self.root.is_dir():
            return []
        return [SourceSpec.from_json(json.loads((d / "source.json").read_text(encoding="utf-8")))
                for d in sorted(self.root.iterdir()) if (d / "source.json").is_file()]

    def remove(self, name: str) -> None:
        """Forget the source (its documents stay; ``sync.purge_source`` removes them); refused while it syncs."""
        self.get(name)
        with sync_lock(self.folder(name), name):
            (self.folder(name) / "source.json").unlink()  # first: a half-removed folder is no source any more
        shutil.rmtree(self.folder(name), ignore_errors=True)
