"""A model directory's fingerprint: a short, stable hash of the files that define its vectors.

The lowest module of ``encoders``: it imports nothing of the project, so every module that names a model by its
fingerprint (``towers``, ``multilingual``, ``onnx_towers``, ``registry``) can import it without a cycle.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

# The files whose bytes define a model: weights, configuration, tokenizer. Anything else (model cards,
# metrics, READMEs) may change without changing the vectors.
_FINGERPRINT_SUFFIXES = (".safetensors", ".bin", ".json", ".txt", ".model")
_FINGERPRINT_SKIP = {"model_card.json", "metrics.json", "README.md", "dpr_model.json"}
ONNX_DIR = "onnx"  # a model's ONNX export (encoders.onnx_export) lives here and is no part of its fingerprint


def model_fingerprint(path: Path) -> str:
    """A short, stable hash of the files that define a model directory (weights, config, tokenizer)."""
    return _fingerprint_cached(str(path.resolve()), model_files_key(path))


def model_files_key(path: Path) -> tuple[tuple[str, int, int], ...]:
    """(relative name, size, mtime) of each file the fingerprint reads: unchanged files, unchanged fingerprint."""
    entries = []
    for p in sorted(path.rglob("*")):
        rel = p.relative_to(path)
        if rel.parts[0] == ONNX_DIR or rel.parts[0].startswith(f".{ONNX_DIR}."):  # the export and its staging
            continue
        if p.is_file() and p.suffix in _FINGERPRINT_SUFFIXES and p.name not in _FINGERPRINT_SKIP:
            st = p.stat()
            entries.append((str(p.relative_to(path)), st.st_size, st.st_mtime_ns))
    return tuple(entries)


@lru_cache(maxsize=16)
def _fingerprint_cached(path: str, files: tuple[tuple[str, int, int], ...]) -> str:
    h = hashlib.sha256()
    root = Path(path)
    for rel, size, _ in files:
        h.update(rel.encode())
        h.update(str(size).encode())
        with open(root / rel, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]
