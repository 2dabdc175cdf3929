"""`dpr train --recipe FILE` (services/lab/towers/recipe_file.py) and `dpr train-reranker --recipe FILE`
(services/lab/reranker/recipe_file.py): the shipped default recipe is the library's defaults, a file sets only the
keys it changes, and an unknown key or a bad value is one line naming the file, the key and the fix (exit 2) before
anything is read or trained."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest
from typer.testing import CliRunner

from entrypoints.cli.main import app
from services.core.errors import ConfigError
from services.lab.reranker.recipe_file import load_recipe as load_reranker_recipe
from services.lab.reranker.trainer import RerankConfig
from services.lab.shared.mining import MiningConfig
from services.lab.shared.self_supervised import PairConfig
from services.lab.towers.recipe import TrainingData
from services.lab.towers.recipe_file import DEFAULT, load_recipe
from services.lab.towers.rounds import RoundConfig
from services.lab.towers.trainer import TrainConfig

pytestmark = pytest.mark.unit


def test_the_shipped_recipe_is_the_library_default() -> None:
    recipe = load_recipe()
    data = recipe.training_data(data=Path("d"))
    assert data == TrainingData(data=Path("d")) and data.mining == MiningConfig() and data.pair_config == PairConfig()
    assert recipe.train_config() == TrainConfig()
    labelled = TrainingData(data=Path(__file__).parent)  # a folder: not a pairs JSONL
    assert recipe.round_config(labelled, TrainConfig()) == RoundConfig()
    assert recipe.describe()["file"] is None and recipe.describe()["train"]["learning_rate"] == 3e-5


def test_a_file_sets_only_its_keys_and_is_recorded(tmp_path: Path) -> None:
    path = tmp_path / "fast.toml"
    path.write_text("[train]\nepochs = 1\nlearning_rate = 1e-5\ntrain_passage_tokens = 0\nblend = 0.5\n"
                    "[negatives]\nsource = \"dense\"\ndenoise = 0.9\n[rounds]\ncount = 0\n")
    recipe = load_recipe(path)
    config = recipe.train_config(name="x")
    assert (config.epochs, config.learning_rate, config.blend, config.train_passage_tokens) == (1.0, 1e-5, 0.5, None)
    assert asdict(config) == asdict(TrainConfig(name="x", epochs=1.0, learning_rate=1e-5, blend=0.5,
                                                train_passage_tokens=None))
    mining = recipe.training_data().mining
    assert (mining.source, mining.denoise, mining.num_negatives) == ("dense", 0.9, 1)
    assert recipe.round_config(TrainingData(data=tmp_path), config).rounds == 0
    assert recipe.describe()["file"] == str(path) and recipe.describe()["rounds"]["count"] == 0


def test_the_default_rounds_fall_to_0_without_a_dev_split_and_a_file_that_asks_for_them_is_kept(
        tmp_path: Path) -> None:
    unlabelled = TrainingData(data=tmp_path, self_supervised="ict")
    assert load_recipe().round_config(unlabelled, TrainConfig()).rounds == 0
    path = tmp_path / "r.toml"
    path.write_text("[rounds]\ncount = 2\n")
    assert load_recipe(path).round_config(unlabelled, TrainConfig()).rounds == 2  # train_recipe refuses it


@pytest.mark.parametrize(("text", "says"), [
    ("[train]\nepoch = 2\n", "unknown key train.epoch; use one of epochs, batch_size"),
    ("[trian]\nepochs = 2\n", "unknown table trian; use one of data, pairs, negatives, train, rounds"),
    ("[train]\nepochs = -1\n", "train.epochs = -1: Input should be greater than 0; fix the value or drop the key"),
    ("[train]\nbatch_size = \"32\"\n", "train.batch_size = '32': Input should be a valid integer"),
    ("[negatives]\nsource = \"tfidf\"\n", "negatives.source = 'tfidf': Input should be 'bm25' or 'dense'"),
    ("[negatives]\nrank_start = 30\n", "negatives: Value error, rank_start 30 must be below rank_end 30"),
    ("[rounds]\ndenoise = 1.5\n", "rounds.denoise = 1.5: Input should be less than or equal to 1"),
    ("[train\n", "is not valid TOML"),
])
def test_a_bad_recipe_names_the_file_the_key_and_the_fix(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_recipe(path)
    assert str(e.value).startswith(str(path)) and says in str(e.value), str(e.value)


def test_dpr_train_refuses_a_bad_recipe_with_exit_2_before_reading_the_data(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[train]\nlr = 1e-5\n")
    args = ["--data-dir", str(tmp_path / "d"), "train", str(tmp_path / "no-such-data"), "--recipe"]
    result = CliRunner().invoke(app, [*args, str(path)])
    assert result.exit_code == 2 and "unknown key train.lr" in result.stderr and str(path) in result.stderr
    missing = CliRunner().invoke(app, [*args, str(tmp_path / "none.toml")])
    assert missing.exit_code == 2 and "cannot read the recipe file" in missing.stderr
    assert DEFAULT.is_file() and not (tmp_path / "d" / "models").exists()


def test_the_shipped_reranker_recipe_is_what_train_reranker_ran_before_its_recipe_file() -> None:
    recipe = load_reranker_recipe()
    assert recipe.training_data(data=Path("d")) == TrainingData(data=Path("d"), mining=MiningConfig(num_negatives=3))
    assert recipe.rerank_config(name="rerank") == RerankConfig()
    assert (recipe.dev.candidates, recipe.dev.first_stage) == (50, "bm25")


def test_a_reranker_recipe_sets_only_its_keys_and_a_bad_one_is_refused_with_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "rr.toml"
    path.write_text("[train]\nloss = \"bce\"\nmax_steps = 2\n[dev]\nfirst_stage = \"base\"\n"
                    "[negatives]\nrank_end = 9\n")
    recipe = load_reranker_recipe(path)
    assert asdict(recipe.rerank_config()) == asdict(RerankConfig(loss="bce", max_steps=2))
    assert recipe.dev.first_stage == "base" and recipe.training_data().mining.rank_end == 9
    bad = tmp_path / "bad.toml"
    bad.write_text("[train]\nloss = \"hinge\"\n")
    args = ["--data-dir", str(tmp_path / "d"), "train-reranker", str(tmp_path / "no-such-data"), "--recipe", str(bad)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "train.loss = 'hinge'" in result.stderr and str(bad) in result.stderr
    assert not (tmp_path / "d" / "models").exists()


@pytest.mark.parametrize("command", ["train", "train-reranker"])
def test_how_to_train_is_a_recipe_file_and_the_command_keeps_at_most_14_options(command: str) -> None:
    from typer.main import get_command

    click_command = get_command(app).commands[command]  # type: ignore[attr-defined]
    options = [p.name for p in click_command.params if p.param_type_name == "option"]
    assert "recipe" in options and len(options) <= (14 if command == "train" else 12), options
