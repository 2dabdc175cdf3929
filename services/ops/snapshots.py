"""Snapshots: a consistent, checksummed copy of one collection in one archive; restore into a fresh data dir
(docs/data-safety.md lists what an archive holds and how each engine is copied).

An archive (``NAME.dpr-snapshot.tar.gz``, under ``DATA_DIR/snapshots`` unless told otherwise) holds
``manifest.json`` first (formats, collection, engine, generation, spec, the model's card, every file with its size
and sha256), the active generation under ``data/`` and, with ``include_model``, the model under ``model/NAME/``;
its checksum sits beside it (``.sha256``). Restore checks that checksum when present and every file against the
manifest while unpacking: a corrupt or truncated archive is refused (``SnapshotError``). Create and restore build
beside their target (``.NAME.*.tmp``) and rename into place at the end: a failure leaves nothing behind and says
so. The embedded engine copies the generation under the store's lease after a flush (whole upsert batches only);
the lease is held only for that copy, the archive is written after.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import tarfile
import time
import uuid
import zlib
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING, Any

from services.core import datadir, diskspace
from services.core.errors import DprError, SnapshotError
from services.core.fsutil import allocated_bytes, built_beside, fsync_path, move_into, sha256_of, write_atomic

if TYPE_CHECKING:
    from services.core.settings import Settings

SNAPSHOT_FORMAT = 1
SUFFIX = ".dpr-snapshot.tar.gz"
MANIFEST = "manifest.json"
BLOCK = 1 << 20
PIECE = 1 << 16
_ZERO = bytes(BLOCK)


# --- files (copy_file_sparse / copy_tree_sparse / allocated_bytes live in services.core.fsutil) ----------------------


def _write_sparse(source: IO[bytes], path: Path, size: int) -> str:
    """Stream ``size`` bytes into ``path``, seeking over all-zero blocks (holes), and return their sha256."""
    digest = hashlib.sha256()
    written = 0
    with open(path, "wb") as out:
        while written < size:
            block = source.read(min(BLOCK, size - written))
            if not block:
                raise SnapshotError(f"{path.name} is truncated in the archive")
            digest.update(block)
            for at in range(0, len(block), PIECE):  # holes at page-cluster granularity
                piece = block[at:at + PIECE]
                if piece == _ZERO[: len(piece)]:
                    out.seek(len(piece), io.SEEK_CUR)
                else:
                    out.write(piece)
            written += len(block)
        out.truncate(size)
        out.flush()
        os.fsync(out.fileno())
    return digest.hexdigest()


# --- create --------------------------------------------------------------------------------------------------------


def snapshots_dir(settings: Settings) -> Path:
    return settings.data_dir / "snapshots"


def create_snapshot(settings: Settings, engine: Any, out_dir: Path | None = None,
                    include_model: bool = False) -> dict[str, Any]:
    """Snapshot the collection ``engine`` serves (an ``EdgeEngine`` or ``ServerEngine``: ``store.engine``). The
    archive and its checksum file are built in a folder beside them and renamed in at the end: a failure leaves
    nothing behind."""
    started = time.perf_counter()
    out_dir = out_dir or snapshots_dir(settings)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    name = f"{settings.collection}-{stamp}-{uuid.uuid4().hex[:6]}{SUFFIX}"
    path = out_dir / name
    sidecar = name + ".sha256"
    with built_beside(path, "the snapshot") as build:
        staging = build / "staging"
        if engine.backend == "edge":
            gen_dir = engine.root / "generations"
            current = engine.read_pointer()
            if current is not None and (gen_dir / current).is_dir():
                need = allocated_bytes(gen_dir / current)
                diskspace.require(build, settings.min_free_mb, "a snapshot", need_bytes=2 * need)
        with diskspace.translate(build, "a snapshot"):
            generation, spec, points = _snapshots(engine).snapshot_generation(engine, staging / "data")
            model = _model_reference(settings, spec.model, staging / "model" if include_model else None)
            files = _file_entries(staging)
            manifest = {
                "snapshot_format": SNAPSHOT_FORMAT,
                "data_dir_format": datadir.CURRENT,
                "written_by": datadir.dpr_version(),
                "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "collection": settings.collection,
                "backend": engine.backend,
                "generation": generation,
                "points": points,
                "spec": spec.to_json(),
                "model": model,
                "files": files,
            }
            _write_archive(staging, manifest, build / name)
            digest = sha256_of(build / name)
            write_atomic(build / sidecar, f"{digest}  {name}\n")
        os.replace(build / sidecar, out_dir / sidecar)
        os.replace(build / name, path)
        fsync_path(out_dir)
    return {
        "snapshot": str(path), "collection": settings.collection, "backend": engine.backend,
        "generation": generation, "points": points, "model": model["fingerprint"], "model_name": model["name"],
        "model_included": include_model and model["included"], "bytes": path.stat().st_size, "sha256": digest,
        "files": len(files), "seconds": round(time.perf_counter() - started, 3),
    }


def _model_reference(settings: Settings, fingerprint: str, copy_to: Path | None) -> dict[str, Any]:
    """The model that embedded the passages: its name and card (and its files under ``copy_to``, if asked and it
    is not the base model)."""
    from encoders import registry
    from encoders.towers import read_model_card

    try:
        path, name = registry.model_for_fingerprint(fingerprint, settings.models_dir)
    except registry.ModelNotFound:
        return {"fingerprint": fingerprint, "name": None, "card": {}, "included": False}
    included = False
    if copy_to is not None and name != "base":
        shutil.copytree(path, copy_to / path.name)
        included = True
    return {"fingerprint": fingerprint, "name": name, "card": read_model_card(path), "included": included,
            "directory": path.name if name != "base" else None}


def _file_entries(staging: Path) -> list[dict[str, Any]]:
    out = []
    for p in sorted(staging.rglob("*")):
        if p.is_file():
            out.append({"path": p.relative_to(staging).as_posix(), "size": p.stat().st_size, "sha256": sha256_of(p)})
    return out


def _write_archive(staging: Path, manifest: dict[str, Any], path: Path) -> None:
    with open(path, "wb") as raw:
        with tarfile.open(fileobj=raw, mode="w:gz", compresslevel=6, format=tarfile.PAX_FORMAT) as tar:
            data = json.dumps(manifest, indent=2, sort_keys=True).encode("utf-8")
            info = tarfile.TarInfo(MANIFEST)
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
            tar.addfile(info, io.BytesIO(data))
            for entry in manifest["files"]:
                tar.add(staging / entry["path"], arcname=entry["path"], recursive=False)
        raw.flush()
        os.fsync(raw.fileno())


# --- list ----------------------------------------------------------------------------------------------------------


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest (the archive's first member) without reading the rest; ``SnapshotError`` if unreadable."""
    try:
        with tarfile.open(path, mode="r:gz") as tar:
            first = tar.next()
            if first is None or first.name != MANIFEST:
                raise SnapshotError(f"{path} is not a dpr snapshot (its first member is not {MANIFEST})")
            f = tar.extractfile(first)
            if f is None:
                raise SnapshotError(f"{path}: {MANIFEST} is not a file")
            manifest = json.loads(f.read())
    except (tarfile.TarError, EOFError, zlib.error, OSError, ValueError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise SnapshotError(f"{path} is corrupt or not a dpr snapshot ({e}); take a new snapshot") from None
    if not isinstance(manifest, dict) or "files" not in manifest:
        raise SnapshotError(f"{path}: {MANIFEST} is not a dpr snapshot manifest")
    return manifest


def list_snapshots(settings: Settings, where: Path | None = None) -> list[dict[str, Any]]:
    folder = where or snapshots_dir(settings)
    out: list[dict[str, Any]] = []
    if not folder.is_dir():
        return out
    for path in sorted(folder.glob(f"*{SUFFIX}")):
        row: dict[str, Any] = {"snapshot": str(path), "bytes": path.stat().st_size}
        try:
            m = read_manifest(path)
            row |= {"collection": m.get("collection"), "backend": m.get("backend"), "created_at": m.get("created_at"),
                    "generation": m.get("generation"), "points": m.get("points"),
                    "model": (m.get("model") or {}).get("fingerprint"), "ok": True}
        except SnapshotError as e:
            row |= {"ok": False, "error": str(e)}
        out.append(row)
    return out


# --- restore -------------------------------------------------------------------------------------------------------


def verify_checksum(path: Path) -> str | None:
    """Check the archive against its ``.sha256`` file when there is one; the archive's sha256 (None if no file)."""
    sidecar = path.with_name(path.name + ".sha256")
    if not sidecar.is_file():
        return None
    expected = sidecar.read_text(encoding="utf-8").split()[0] if sidecar.read_text(encoding="utf-8").strip() else ""
    actual = sha256_of(path)
    if actual != expected:
        raise SnapshotError(
            f"{path} does not match its checksum ({sidecar.name} says {expected[:16]}..., the file is "
            f"{actual[:16]}...): the archive is corrupt or truncated; copy it again or use another snapshot"
        )
    return actual


def restore_snapshot(path: Path, settings: Settings, engine_for: Any = None) -> dict[str, Any]:
    """Unpack ``path`` into the data dir of ``settings`` (a fresh one, or one without that collection) and make its
    generation the collection's active one. ``engine_for(settings)``: the engine to restore into (default: the one
    ``open_store`` would pick: a server with DPR_QDRANT_URL). The collection is built in a data dir beside the
    target and moved in at the end: a failure leaves the target as it was."""
    started = time.perf_counter()
    if not path.is_file():
        raise FileNotFoundError(f"no snapshot file {path}; `dpr snapshot list` shows the snapshots kept")
    checksum = verify_checksum(path)
    manifest = read_manifest(path)
    if int(manifest.get("snapshot_format", 0)) > SNAPSHOT_FORMAT:
        raise SnapshotError(
            f"{path} has snapshot format {manifest.get('snapshot_format')} (written by {manifest.get('written_by')});"
            f" this {datadir.dpr_version()} reads format {SNAPSHOT_FORMAT}: restore it with that release"
        )
    collection = str(manifest["collection"])
    target = settings.for_collection(collection) if collection != settings.collection else settings
    generation = str(manifest["generation"])
    datadir.check(target.data_dir)
    backend = "server" if target.qdrant_url else "edge"
    if manifest.get("backend") != backend:
        raise SnapshotError(
            f"{path} is a snapshot of the {manifest.get('backend')} engine and the target uses the {backend} engine; "
            "restore it with the engine it came from, then move the collection with `dpr reembed` / a re-ingest"
        )
    make_engine = engine_for or _engine_for
    if backend == "edge":  # the collection lives in the data dir: refused before anything is built beside it
        with contextlib.closing(make_engine(target)) as engine:
            exists = engine.read_pointer() is not None or bool(engine.generations())
        if exists:
            raise SnapshotError(f"collection {collection!r} already exists in {target.data_dir}; restore into a new "
                                "data dir (--data-dir) or delete that collection first")
    model = manifest.get("model") or {}
    with built_beside(target.data_dir, f"restoring {path.name}") as build:
        staging, new = build / "unpacked", build / "data"
        need = sum(int(f["size"]) for f in manifest["files"]) if backend == "server" else 0
        diskspace.require(build, target.min_free_mb, "restoring a snapshot", need_bytes=need)
        with diskspace.translate(build, "restoring a snapshot"):
            _unpack(path, manifest, staging)
        datadir.stamp(new)
        with contextlib.closing(make_engine(target.model_copy(update={"data_dir": new}))) as engine:
            _snapshots(engine).restore_generation(engine, staging / "data", generation)
        _install_model(new, staging, model)
        move_into(new, target.data_dir)
    return {
        "snapshot": str(path), "data_dir": str(target.data_dir), "collection": collection, "generation": generation,
        "points": manifest.get("points"), "model": model.get("fingerprint"), "model_name": model.get("name"),
        "sha256": checksum, "checksum_file": checksum is not None, "warnings": _model_warnings(target, model),
        "seconds": round(time.perf_counter() - started, 3),
    }


def _engine_for(settings: Settings) -> Any:
    if settings.qdrant_url:
        from services.store.server.engine import ServerEngine

        return ServerEngine.from_settings(settings)
    from services.store.edge.engine import EdgeEngine

    return EdgeEngine.from_settings(settings)


def _snapshots(engine: Any) -> Any:
    """The engine's snapshot module: ``services/store/edge/snapshots.py`` or ``server/snapshots.py``."""
    if engine.backend == "edge":
        from services.store.edge import snapshots
    else:
        from services.store.server import snapshots  # type: ignore[no-redef]
    return snapshots


def _safe_member(name: str) -> str:
    pure = PurePosixPath(name)
    if pure.is_absolute() or ".." in pure.parts or not pure.parts or pure.parts[0] not in ("data", "model"):
        raise SnapshotError(f"snapshot member {name!r} is outside the snapshot's folders; the archive is not ours")
    return pure.as_posix()


def _unpack(path: Path, manifest: dict[str, Any], staging: Path) -> None:
    expected = {_safe_member(str(f["path"])): f for f in manifest["files"]}
    seen: set[str] = set()
    try:
        with tarfile.open(path, mode="r:gz") as tar:
            for member in iter(tar.next, None):
                if member.name == MANIFEST:
                    continue
                name = _safe_member(member.name)
                entry = expected.get(name)
                if entry is None or not member.isfile():
                    raise SnapshotError(f"{path}: member {name!r} is not in the manifest; the archive was altered")
                dest = staging / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(member)
                if source is None or member.size != int(entry["size"]):
                    raise SnapshotError(f"{path}: {name} has {member.size} bytes, the manifest says {entry['size']}")
                digest = _write_sparse(source, dest, member.size)
                if digest != entry["sha256"]:
                    raise SnapshotError(f"{path}: {name} does not match its sha256 in the manifest; the archive is "
                                        "corrupt: use another snapshot")
                seen.add(name)
    except DprError:
        raise
    except (tarfile.TarError, EOFError, zlib.error, ValueError) as e:
        raise SnapshotError(f"{path} is corrupt or truncated ({e}); use another snapshot") from None
    missing = sorted(set(expected) - seen)
    if missing:
        raise SnapshotError(f"{path} is truncated: {len(missing)} files of the manifest are missing ({missing[0]}, "
                            "...); use another snapshot")


def _install_model(data_dir: Path, staging: Path, model: dict[str, Any]) -> None:
    """Move an included model into the models dir of the data dir being built."""
    directory = model.get("directory")
    if model.get("included") and directory:
        (data_dir / "models").mkdir(parents=True, exist_ok=True)
        os.replace(staging / "model" / directory, data_dir / "models" / directory)


def _model_warnings(settings: Settings, model: dict[str, Any]) -> list[str]:
    """A warning when the model that embedded the passages is not in the restored data dir's models."""
    from encoders import registry

    fingerprint = model.get("fingerprint")
    if not fingerprint:
        return []
    with contextlib.suppress(registry.ModelNotFound):
        registry.model_for_fingerprint(str(fingerprint), settings.models_dir)
        return []
    name = model.get("directory") or model.get("name") or "?"
    return [
        f"the model that embedded these passages ({name}, fingerprint {fingerprint}) is not in "
        f"{settings.models_dir}: copy it there from the original data dir's models/{name} (or snapshot with "
        "--include-model); queries are refused until it is"
    ]
