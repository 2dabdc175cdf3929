"""The multilingual model on the default backends (onnx-int8 passages, onnx questions) end to end through the CLI:
its ONNX export is made on the first ingest (minutes on 2 cores, hence slow) and a Korean question finds the
Korean document. tests/slow/test_multilingual_towers.py runs the same questions on torch in seconds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytestmark = pytest.mark.slow

DOCS = {
    "seoul.txt": "서울특별시는 대한민국의 수도이자 최대 도시이다. 조선 시대부터 한양이라 불렸으며 "
                 "한강이 도시를 가로지른다.",
    "sejong.txt": "세종대왕은 조선의 제4대 왕으로, 1443년에 백성을 위하여 훈민정음을 창제하였다.",
    "nile.txt": "The Nile is the longest river in Africa and flows north into the Mediterranean Sea.",
    "cats.txt": "Cats are small domesticated carnivores that purr when content and hunt mice at night.",
}


def test_korean_question_on_the_default_onnx_backends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from entrypoints.cli.main import app

    folder = tmp_path / "docs"
    folder.mkdir()
    for name, text in DOCS.items():
        (folder / name).write_text(text, encoding="utf-8")
    monkeypatch.setenv("DPR_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("DPR_ENCODER__MODEL", "multilingual")  # converted from the wheel into DATA_DIR/models
    runner = CliRunner()
    res = runner.invoke(app, ["ingest", str(folder), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["documents"] == len(DOCS)
    assert list((tmp_path / "data" / "models").glob("*/onnx/manifest.json"))  # the export the onnx backends serve
    for question, expected in (("한글을 만든 왕은 누구인가?", "docs/sejong.txt"),
                               ("Which river is the longest in Africa?", "docs/nile.txt")):
        res = runner.invoke(app, ["query", question, "-k", "3", "--mode", "dense", "--json"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)[0]["doc_id"] == expected, question
