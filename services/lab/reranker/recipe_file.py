"""`dpr train-reranker --recipe FILE` (``services.lab.shared.recipe_files``): how to train the reranker (epochs,
learning rate, loss, negatives, the dev measure, ...). ``recipe.toml`` beside this module is the default. Each table's
keys are the fields of what it fills: ``[data]`` and ``[negatives]`` the towers' training set (``TrainingData``,
``MiningConfig``), ``[train]`` ``RerankConfig``, ``[dev]`` the first stage and its candidates.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from services.lab.shared.mining import MiningConfig
from services.lab.shared.recipe_files import Data, Negatives, Positive, Table, load_tables
from services.lab.towers.recipe import TrainingData

if TYPE_CHECKING:
    from services.lab.reranker.trainer import RerankConfig

DEFAULT = Path(__file__).with_name("recipe.toml")
HELP = "docs/training.md, 'Reranker'"


class Train(Table):
    epochs: Positive
    batch_size: int = Field(ge=1)
    in_batch_negatives: int = Field(ge=0)
    mini_batch_size: int = Field(ge=0)
    learning_rate: Positive
    warmup_ratio: float = Field(ge=0, lt=1)
    weight_decay: float = Field(ge=0)
    scale: Positive
    loss: Literal["mnrl", "bce"]
    max_length: int = Field(ge=8)
    seed: int
    max_steps: int
    precision: Literal["auto", "fp32", "bf16"] = "auto"


class Dev(Table):
    candidates: int = Field(ge=1)
    first_stage: str = Field(min_length=1)


class Recipe(Table):
    data: Data
    negatives: Negatives
    train: Train
    dev: Dev

    def training_data(self, **what: Any) -> TrainingData:
        return TrainingData(**what, **self.data.model_dump(), seed=self.train.seed,
                            mining=MiningConfig(**self.negatives.model_dump()))

    def rerank_config(self, **what: Any) -> RerankConfig:
        from services.lab.reranker.trainer import RerankConfig

        return RerankConfig(**what, **self.train.model_dump(), candidates=self.dev.candidates)


def load_recipe(path: Path | None = None) -> Recipe:
    """The default recipe with ``path``'s keys over it; ``ConfigError`` naming the file, the key and the fix."""
    return load_tables(Recipe, DEFAULT, path, HELP)[0]
