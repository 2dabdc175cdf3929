"""Korean end to end through the real CLI, the real embedded engine and the real base model: `dpr ingest
--language ko` stores the language with the collection, a sparse-mode `dpr query` in Korean finds the document
whose words it shares only up to particles and endings, and a later `--language en` is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from kit.cli import dpr_json
from kit.documents import write_folder
from typer.testing import CliRunner

from entrypoints.cli.main import app

pytestmark = pytest.mark.integration

DOCS = {
    "school.txt": "학교\n\n학생들은 매일 아침 학교에서 공부한다. 선생님은 교실에서 수학을 가르친다.\n",
    "river.txt": "한강\n\n한강은 서울을 가로지르는 큰 강이다. 강변에는 공원과 자전거 길이 많다.\n",
    "kimchi.txt": "김치\n\n김치는 배추와 고춧가루로 만드는 한국의 전통 음식이다. 겨울마다 김장을 한다.\n",
}


def test_cli_korean_ingest_and_sparse_query(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = write_folder(tmp_path / "ko", DOCS)
    monkeypatch.setenv("DPR_DATA_DIR", str(tmp_path / "dpr"))
    runner = CliRunner()
    assert dpr_json(runner, "ingest", str(folder), "--collection", "ko", "--language", "ko")["documents"] == 3

    for question, expected in (("배추로 만든 음식은?", "ko/kimchi.txt"), ("서울의 강", "ko/river.txt"),
                               ("학생이 공부하는 곳", "ko/school.txt")):
        hits = dpr_json(runner, "query", question, "--collection", "ko", "--mode", "sparse", "-k", "1")
        assert hits[0]["doc_id"] == expected, question

    res = runner.invoke(app, ["ingest", str(folder), "--collection", "ko", "--language", "en"])
    assert res.exit_code == 2 and "tokenises BM25 as 'ko'" in res.stderr
