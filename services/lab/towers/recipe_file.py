"""`dpr train --recipe FILE`: how to train (epochs, learning rates, negatives, rounds, ...) in a TOML file, apart from
what to train on (the command's options). ``recipe.toml`` beside this module is the default: today's best recipe
(docs/training.md); a file given sets only the keys it changes, table by table. Each table's keys are the fields of
the dataclass it fills (``TrainingData``, ``PairConfig``, ``MiningConfig``, ``TrainConfig``, ``RoundConfig``); an
unknown key or a bad value is refused with one line naming the file, the key and the fix (``ConfigError``: exit 2).
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from services.core.errors import ConfigError
from services.lab.shared.mining import MiningConfig
from services.lab.shared.self_supervised import PairConfig
from services.lab.towers.recipe import TrainingData

if TYPE_CHECKING:
    from services.lab.towers.rounds import RoundConfig
    from services.lab.towers.trainer import TrainConfig

DEFAULT = Path(__file__).with_name("recipe.toml")
HELP = "docs/training.md, 'The recipe file'"
Fraction = Annotated[float, Field(gt=0, le=1)]
Positive = Annotated[float, Field(gt=0)]


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Data(_Table):
    dev_queries: int = Field(ge=0)
    max_pairs: int | None = Field(None, ge=1)
    pretrain: Literal["ict", "title", "both"] | None = None
    pretrain_epochs: Positive
    pretrain_max_pairs: int | None = Field(None, ge=1)


class Pairs(_Table):
    ict_per_doc: int = Field(ge=1)
    keep_sentence_prob: float = Field(ge=0, le=1)
    max_context_words: int = Field(ge=10)


class Negatives(_Table):
    num_negatives: int = Field(ge=0)
    rank_start: int = Field(ge=0)
    rank_end: int = Field(ge=1)
    source: Literal["bm25", "dense"]
    model: str | None = None
    denoise: Fraction | None = None

    @model_validator(mode="after")
    def _window(self) -> Negatives:
        if self.rank_start >= self.rank_end:
            raise ValueError(f"rank_start {self.rank_start} must be below rank_end {self.rank_end}")
        return self


class Train(_Table):
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


class Rounds(_Table):
    count: int = Field(ge=0)
    hard_negatives: int = Field(ge=0)
    denoise: Fraction
    epochs: Positive
    learning_rate: Positive
    mini_batch_size: int = Field(ge=0)
    min_gain: float


class Recipe(_Table):
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

    def describe(self) -> dict[str, Any]:
        """What the model card records: the file (None: the default) and every value used."""
        return {"file": str(self._file) if self._file else None, **self.model_dump()}


def load_recipe(path: Path | None = None) -> Recipe:
    """The default recipe with ``path``'s keys over it; ``ConfigError`` naming the file, the key and the fix."""
    tables, given = _read(DEFAULT), _read(path) if path is not None else {}
    for name, table in given.items():
        both = isinstance(table, dict) and isinstance(tables.get(name), dict)
        tables[name] = {**tables[name], **table} if both else table
    try:
        recipe = Recipe.model_validate(tables)
    except ValidationError as e:
        raise ConfigError(_explain(path or DEFAULT, e)) from None
    recipe._file, recipe._given = path, given
    return recipe


def recipe_text(**tables: dict[str, Any]) -> str:
    """A recipe file's text (table -> key -> value): what benchmarks and tests give ``--recipe``."""
    return "".join(f"[{name}]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in keys.items())
                   for name, keys in tables.items())


def _read(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read the recipe file {path} ({e.strerror}); give a TOML file ({HELP})") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path} is not valid TOML ({e}); fix it ({HELP})") from None


def _explain(path: Path, error: ValidationError) -> str:
    first = error.errors()[0]
    loc = [str(part) for part in first["loc"]]
    more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
    if first["type"] == "extra_forbidden":
        fields = Recipe.model_fields if len(loc) == 1 else Recipe.model_fields[loc[0]].annotation.model_fields  # type: ignore[union-attr]
        kind = "table" if len(loc) == 1 else "key"
        return f"{path}: unknown {kind} {'.'.join(loc)}{more}; use one of {', '.join(fields)} or drop it ({HELP})"
    value = f" = {first['input']!r}" if len(loc) > 1 and first["type"] != "missing" else ""
    return (f"{path}: {'.'.join(loc)}{value}: {first['msg']}{more}; fix the value or drop the key to keep the "
            f"default ({HELP})")
