"""The multilingual model on the backends chosen from the CPU (encoders/runtimes.py) end to end through the CLI:
its ONNX export is made on the first ingest (minutes on 2 cores, hence slow) and a Korean question finds the
Korean document. tests/slow/test_multilingual_towers.py runs the same questions on torch in seconds."""

from __future__ import annotations

from pathlib import Path

import pytest
from kit.cli import dpr_json
from kit.documents import KOREAN_ENGLISH, write_folder
from typer.testing import CliRunner

pytestmark = pytest.mark.slow


def test_korean_question_on_the_default_onnx_backends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = write_folder(tmp_path / "docs", KOREAN_ENGLISH)
    monkeypatch.setenv("DPR_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("DPR_ENCODER__MODEL", "multilingual")  # converted from the wheel into DATA_DIR/models
    runner = CliRunner()
    assert dpr_json(runner, "ingest", str(folder))["documents"] == len(KOREAN_ENGLISH)
    assert list((tmp_path / "data" / "models").glob("*/onnx/manifest.json"))  # the export the onnx backends serve
    for question, expected in (("한글을 만든 왕은 누구인가?", "docs/sejong.txt"),
                               ("Which river is the longest in Africa?", "docs/nile.txt")):
        assert dpr_json(runner, "query", question, "-k", "3", "--mode", "dense")[0]["doc_id"] == expected, question
