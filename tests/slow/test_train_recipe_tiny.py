"""`dpr train`'s recipe (the fine-tune, then mining rounds chosen on dev: ``services.lab.towers.rounds``) on a tiny
randomly initialised model and a tiny BEIR folder (seconds): every stage is recorded in the card with its dev
figure, times, peak RSS and whether it was kept; a round without a dev gain is not kept and ends the rounds; a run
stopped after the fine-tune goes on at the first round without training the fine-tune again; `rounds.count = 0` is the
single fine-tune of before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kit.tiny_beir import short_passage, tiny_beir
from kit.tiny_models import tiny_sentence_model

pytestmark = pytest.mark.slow

def _passage(words: str, j: int) -> str:
    """This file's wording of a tiny BEIR passage (kit.tiny_beir): ``short_passage`` with " follow." at the end."""
    return short_passage(words, j)[:-1] + " follow."


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("recipe")
    return {"base": tiny_sentence_model(root), "beir": tiny_beir(root / "beir", _passage)}


def _settings(tmp_path: Path) -> Any:
    from services.core.settings import Settings

    return Settings(data_dir=tmp_path / "data", encoder={"backend": "torch", "question_backend": "torch"})


def _config(name: str) -> Any:
    from services.lab.towers.trainer import TrainConfig

    return TrainConfig(name=name, max_steps=2, batch_size=4, learning_rate=5e-3, max_query_tokens=32,
                       max_passage_tokens=64)


class Killed(Exception):
    """Stands for the process being killed: raised from the progress callback as round 1 starts."""


def test_fine_tune_and_a_round_are_recorded_and_a_killed_run_resumes_at_the_round(world: dict[str, Any],
                                                                                   tmp_path: Path) -> None:
    from encoders.towers import model_fingerprint
    from services.lab.towers.recipe import TrainingData
    from services.lab.towers.rounds import RoundConfig, train_recipe

    settings = _settings(tmp_path)
    data = TrainingData(data=world["beir"], dev_queries=4)
    rounds = RoundConfig(rounds=1, min_gain=-1.0)  # any dev figure keeps the round

    def kill_at_round_1(stage: str, done: int, total: int | None, note: str) -> None:
        if stage == "round 1":
            raise Killed

    with pytest.raises(Killed):
        train_recipe(settings, data, _config("rc"), base=str(world["base"]), rounds=rounds, progress=kill_at_round_1)
    [run_dir] = (settings.data_dir / "train").iterdir()
    finetune = json.loads((run_dir / "finetune.json").read_text())
    assert not (run_dir / "round-1.json").exists() and not settings.models_dir.exists()  # nothing saved yet
    finetune_dir = Path(finetune["path"])
    assert finetune_dir.parent == run_dir / "stages"  # staged models live in the run's directory
    weights_before = {p.name: p.stat().st_mtime_ns for p in finetune_dir.iterdir()}

    seen: list[str] = []
    done = train_recipe(settings, data, _config("rc"), base=str(world["base"]), rounds=rounds,
                        progress=lambda stage, *_: seen.append(stage))
    assert done.stages == {"finetune": "skipped", "round 1": "ran"}  # resumed at stage 2
    assert done.run_dir == run_dir
    assert {p.name: p.stat().st_mtime_ns for p in finetune_dir.iterdir()} == weights_before  # not trained again
    assert sorted(p.name.split("-")[1] for p in (run_dir / "stages").iterdir()) == ["finetune", "round1"]
    assert "round 1" in seen and "recipe" in seen

    card = done.result.card
    stages = card["stages"]
    assert [s["stage"] for s in stages] == ["finetune", "round 1"]
    for stage in stages:
        assert stage["dev_ndcg@10"] is not None and 0 <= stage["dev_ndcg@10"] <= 1
        assert stage["stage_seconds"] > 0 and stage["train_seconds"] > 0 and stage["peak_rss_mib"] > 0
        assert stage["steps"] == 2 and stage["kept"] is True
    assert [s["chosen"] for s in stages] == [False, True]
    assert card["recipe"]["chosen"] == "round 1" and card["recipe"]["rounds"]["hard_negatives"] == 3
    assert card["dev_metrics"]["after"]["ndcg@10"] == pytest.approx(stages[1]["dev_ndcg@10"], abs=1e-4)
    # the round's negatives: mined by the fine-tuned towers (dense), denoised, 3 per pair, 2 epochs at lr 1e-5
    round_record = json.loads((run_dir / "round-1.json").read_text())
    assert round_record["mining"]["source"] == "dense" and round_record["mining"]["model"] == str(finetune_dir)
    assert round_record["mining"]["denoise"] == 0.95 and round_record["mining"]["num_negatives"] == 3
    assert round_record["base"] == finetune["model"]
    round_card = json.loads((Path(round_record["path"]) / "model_card.json").read_text())
    assert round_card["hyperparameters"]["learning_rate"] == 1e-5 and round_card["hyperparameters"]["epochs"] == 2
    assert round_card["base"]["path"] == str(finetune_dir)
    # the saved model is the chosen stage's weights under models_dir, named as `dpr train --name` says
    assert done.result.model_dir.parent == settings.models_dir and done.result.name.startswith("rc-")
    assert done.result.fingerprint == model_fingerprint(Path(round_record["path"]))

    again = train_recipe(settings, data, _config("rc"), base=str(world["base"]), rounds=rounds)
    assert set(again.stages.values()) == {"skipped"} and again.result.name == done.result.name  # nothing twice


def test_a_round_without_a_dev_gain_is_not_kept_and_ends_the_rounds(world: dict[str, Any], tmp_path: Path) -> None:
    from encoders.towers import model_fingerprint
    from services.lab.towers.recipe import TrainingData
    from services.lab.towers.rounds import RoundConfig, train_recipe

    settings = _settings(tmp_path)
    done = train_recipe(settings, TrainingData(data=world["beir"], dev_queries=4), _config("ng"),
                        base=str(world["base"]), rounds=RoundConfig(rounds=2, min_gain=1.0))  # no round gains 1.0
    stages = done.result.card["stages"]
    assert [(s["stage"], s["kept"], s["chosen"]) for s in stages] == [("finetune", True, True),
                                                                     ("round 1", False, False)]  # no round 2
    finetune = json.loads((done.run_dir / "finetune.json").read_text())  # type: ignore[operator]
    assert done.result.fingerprint == model_fingerprint(Path(finetune["path"]))


def test_cli_runs_the_recipe_and_rounds_0_is_the_single_fine_tune(world: dict[str, Any], tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from entrypoints.cli.main import app

    for key in ("DPR_ENCODER__BACKEND", "DPR_ENCODER__QUESTION_BACKEND"):
        monkeypatch.setenv(key, "torch")
    from services.lab.shared.recipe_files import recipe_text

    runner = CliRunner()
    tiny = {"train": {"max_steps": 2, "batch_size": 4}, "data": {"dev_queries": 4}}
    r1, r0 = tmp_path / "r1.toml", tmp_path / "r0.toml"
    r1.write_text(recipe_text(**tiny, rounds={"count": 1}))
    r0.write_text(recipe_text(**tiny, rounds={"count": 0}))
    args = ["--data-dir", str(tmp_path / "data"), "train", str(world["beir"]), "--base", str(world["base"]),
            "--json", "--recipe"]
    recipe = runner.invoke(app, [*args, str(r1), "--name", "cr"])
    assert recipe.exit_code == 0, recipe.output
    out = json.loads(recipe.stdout)
    assert out["stages_run"] == {"finetune": "ran", "round 1": "ran"}
    stages = out["card"]["stages"]
    assert [s["stage"] for s in stages] == ["finetune", "round 1"] and sum(s["chosen"] for s in stages) == 1
    assert all(isinstance(s["kept"], bool) and s["dev_ndcg@10"] is not None for s in stages)
    used = out["card"]["recipe"]["settings"]
    assert used["file"] == str(r1) and used["rounds"]["count"] == 1 and used["train"]["learning_rate"] == 3e-5
    shown = runner.invoke(app, [*args[:-2], "--recipe", str(r1), "--name", "cr"])  # the same run: nothing trained
    assert shown.exit_code == 0, shown.output
    assert f"saved {out['model']}" in shown.stdout and "round 1: cr-round1-" in shown.stdout
    assert "dev nDCG@10" in shown.stdout and "(done earlier)" in shown.stdout

    single = runner.invoke(app, [*args, str(r0), "--name", "one"])
    assert single.exit_code == 0, single.output
    one = json.loads(single.stdout)
    assert "stages" not in one["card"] and one["card"]["steps"] == 2 and one["card"]["dev_metrics"]["after"]
    assert one["card"]["recipe"]["settings"]["file"] == str(r0)
    assert not (tmp_path / "data" / "train" / "one").exists()

    refused = runner.invoke(app, [*args, str(r1), "--question-only"])
    assert refused.exit_code != 0 and "--question-only" in refused.output and "rounds.count = 1" in refused.output
    assert "Traceback" not in refused.output
