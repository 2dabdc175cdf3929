"""`dpr train --recipe FILE` (``services.lab.shared.recipe_files``): how to train the towers (epochs, learning rates,
negatives, rounds, ...). ``recipe.toml`` beside this module is the default: today's best recipe (docs/training.md).
Each table's keys are the fields of the dataclass it fills (``TrainingData``, ``PairConfig``, ``MiningConfig``,
``TrainConfig``, ``RoundConfig``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, PrivateAttr

from services.lab.shared import recipe_files
from services.lab.shared.mining import MiningConfig
from services.lab.shared.recipe_files import Fraction, Negatives, Positive, Table, load_tables
from services.lab.shared.self_supervised import PairConfig
from services.lab.towers.recipe import TrainingData

if TYPE_CHECKING:
    from services.lab.towers.rounds import RoundConfig
    from services.lab.towers.trainer import TrainConfig

DEFAULT = Path(__file__).with_name("recipe.toml")
HELP = "docs/training.md, 'The recipe file'"


class Data(recipe_files.Data):
    pretrain: Literal["ict", "title", "both"] | None = None
    pretrain_epochs: Positive
    pretrain_max_pairs: int | None = Field(None, ge=1)


class Pairs(Table):
    ict_per_doc: int = Field(ge=1)
    keep_sentence_prob: float = Field(ge=0, le=1)
    max_context_words: int = Field(ge=10)


class Train(Table):
    epochs: Positive
    batch_size: int = Field(ge=2)
    mini_batch_size: int = Field(ge=0)
    learning_rate: Positive
    warmup_ratio: float = Field(ge=0, lt=1)
    scale: float = Field(ge=1)
    train_passage_tokens: int = Field(ge=0)
    answer_windows: bool
    shared: bool
    seed: int
    max_steps: int
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    freeze_embeddings: bool | None = None
    blend: Fraction | None = None


class Rounds(Table):
    count: int = Field(ge=0)
    hard_negatives: int = Field(ge=0)
    denoise: Fraction
    epochs: Positive
    learning_rate: Positive
    mini_batch_size: int = Field(ge=0)
    min_gain: float


class Recipe(Table):
    data: Data
    pairs: Pairs
    negatives: Negatives
    train: Train
    rounds: Rounds
    _file: Path | None = PrivateAttr(None)
    _given: dict[str, Any] = PrivateAttr(default_factory=dict)

    def training_data(self, **what: Any) -> TrainingData:
        return TrainingData(**what, **self.data.model_dump(), seed=self.train.seed,
                            mining=MiningConfig(**self.negatives.model_dump()),
                            pair_config=PairConfig(**self.pairs.model_dump()))

    def train_config(self, **what: Any) -> TrainConfig:
        from services.lab.towers.trainer import TrainConfig

        values = self.train.model_dump()
        return TrainConfig(**what, **values | {"train_passage_tokens": values["train_passage_tokens"] or None})

    def round_config(self, data: TrainingData, config: TrainConfig) -> RoundConfig:
        """The rounds; the default recipe's count falls to 0 where no dev split can choose them (a file that sets
        ``count`` there is refused by ``train_recipe``)."""
        from services.lab.towers.rounds import RoundConfig, rounds_unavailable

        count = self.rounds.count
        if "count" not in self._given.get("rounds", {}) and rounds_unavailable(data, config):
            count = 0
        return RoundConfig(rounds=count, **self.rounds.model_dump(exclude={"count"}))

    def read_from(self, path: Path | None, given: dict[str, Any]) -> Recipe:
        """This recipe, noted as read from ``path`` (None: the default) where the file set the keys ``given``."""
        self._file, self._given = path, given
        return self

    def describe(self) -> dict[str, Any]:
        """What the model card records: the file (None: the default) and every value used."""
        return {"file": str(self._file) if self._file else None, **self.model_dump()}


def load_recipe(path: Path | None = None) -> Recipe:
    """The default recipe with ``path``'s keys over it; ``ConfigError`` naming the file, the key and the fix."""
    recipe, given = load_tables(Recipe, DEFAULT, path, HELP)
    return recipe.read_from(path, given)
