"""The three roles, ordered: a key may do what its role and every role below it may do.

- ``read``: search, status, jobs, evaluation reports, who am I;
- ``write``: ingest and delete documents (and judgements), plus everything ``read`` may;
- ``admin``: models, activation, re-embedding, rollback, gc, snapshots, feedback export, keys, plus everything.
"""

from __future__ import annotations

from typing import Literal, get_args

Role = Literal["read", "write", "admin"]
ROLES: tuple[Role, ...] = get_args(Role)
_RANK = {role: rank for rank, role in enumerate(ROLES)}


def allows(have: Role, need: Role) -> bool:
    """Whether a key of role ``have`` may call a route that needs ``need``."""
    return _RANK[have] >= _RANK[need]


def parse_role(value: str) -> Role:
    """``value`` as a role, or a ValueError naming the choices."""
    for role in ROLES:
        if value == role:
            return role
    raise ValueError(f"unknown role {value!r}; use one of {', '.join(ROLES)}")
