"""A recipe file (`dpr train --recipe FILE`, `dpr train-reranker --recipe FILE`): how to train, in TOML tables, apart
from what to train on (the command's options). Each trainer ships its default file beside its recipe module; a file
given sets only the keys it changes, table by table, over that default. Each trainer's tables are ``Table`` models;
an unknown key or a bad value is refused with one line naming the file, the key and the fix (``ConfigError``: exit
2) before anything is read or trained.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from services.core.errors import ConfigError

Fraction = Annotated[float, Field(gt=0, le=1)]
Positive = Annotated[float, Field(gt=0)]


class Table(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


R = TypeVar("R", bound=Table)


class Data(Table):
    """``[data]``: the dev questions held out of the training split, and a cap on the pairs read."""

    dev_queries: int = Field(ge=0)
    max_pairs: int | None = Field(None, ge=1)


class Negatives(Table):
    """``[negatives]``: the hard negatives mined for training (``services.lab.shared.mining.MiningConfig``)."""

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


def load_tables(model: type[R], default: Path, path: Path | None, doc: str) -> tuple[R, dict[str, Any]]:
    """``default``'s tables with ``path``'s keys over them, validated as ``model``; and the tables ``path`` gave.
    ``doc`` names the page that documents the file."""
    tables, given = _read(default, doc), _read(path, doc) if path is not None else {}
    for name, table in given.items():
        both = isinstance(table, dict) and isinstance(tables.get(name), dict)
        tables[name] = {**tables[name], **table} if both else table
    try:
        return model.model_validate(tables), given
    except ValidationError as e:
        raise ConfigError(_explain(model, path or default, e, doc)) from None


def recipe_text(**tables: dict[str, Any]) -> str:
    """A recipe file's text (table -> key -> value): what benchmarks and tests give ``--recipe``."""
    return "".join(f"[{name}]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in keys.items())
                   for name, keys in tables.items())


def _read(path: Path, doc: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read the recipe file {path} ({e.strerror}); give a TOML file ({doc})") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path} is not valid TOML ({e}); fix it ({doc})") from None


def _explain(model: type[Table], path: Path, error: ValidationError, doc: str) -> str:
    first = error.errors()[0]
    loc = [str(part) for part in first["loc"]]
    more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
    if first["type"] == "extra_forbidden":
        fields = model.model_fields if len(loc) == 1 else model.model_fields[loc[0]].annotation.model_fields  # type: ignore[union-attr]
        kind = "table" if len(loc) == 1 else "key"
        return f"{path}: unknown {kind} {'.'.join(loc)}{more}; use one of {', '.join(fields)} or drop it ({doc})"
    value = f" = {first['input']!r}" if len(loc) > 1 and first["type"] != "missing" else ""
    return (f"{path}: {'.'.join(loc)}{value}: {first['msg']}{more}; fix the value or drop the key to keep the "
            f"default ({doc})")
