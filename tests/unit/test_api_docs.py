"""docs/api.md checked against the schema the server serves (issue 71): the routes table names every operation of
``/openapi.json`` with the role the route declares (``x-dpr-role``) and nothing the schema lacks (but the console's
pages, which are not in it); the errors table names every error status an operation documents; the search section
names every field of the search body. A route added without its line in docs/api.md fails here, naming the line to
add.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from entrypoints.api.app import create_app, openapi_document
from services.core.settings import Settings

pytestmark = pytest.mark.unit

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
NOT_IN_SCHEMA = {("GET", "/"), ("GET", "/console/{name}")}  # the console's page and assets: public, no data


def _schema() -> dict:  # type: ignore[type-arg]
    app = create_app(Settings(data_dir=Path("/nonexistent")), warm_model=False)
    return openapi_document(app, locked=True)


def _section(title: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index(title)
    end = text.find("\n## ", start + len(title))
    return text[start:end if end >= 0 else None]


def documented_routes() -> dict[tuple[str, str], str]:
    """(METHOD, path) -> role, from the routes table: a row may name several operations and one role for all of
    them, or one role each (in order)."""
    routes: dict[tuple[str, str], str] = {}
    for line in _section("## Routes").splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        operations = re.findall(r"`([A-Z]+) (/[^`]*)`", cells[0])
        roles = [r.strip() for r in cells[1].split(",")]
        assert len(roles) in (1, len(operations)), line
        for i, (method, path) in enumerate(operations):
            routes[(method, path)] = roles[0] if len(roles) == 1 else roles[i]
    return routes


def test_the_routes_table_is_the_schema() -> None:
    schema = _schema()
    served = {(method.upper(), path): op["x-dpr-role"] for path, ops in schema["paths"].items()
              for method, op in ops.items()}
    documented = documented_routes()
    missing = sorted(set(served) - set(documented))
    assert not missing, "docs/api.md's routes table lacks: " + "; ".join(
        f"| `{m} {p}` | {served[(m, p)]} | ... |" for m, p in missing)
    extra = sorted(set(documented) - set(served) - NOT_IN_SCHEMA)
    assert not extra, f"docs/api.md names operations /openapi.json does not have: {extra}"
    wrong = {op: (documented[op], role) for op, role in served.items() if documented[op] != role}
    assert not wrong, f"roles in docs/api.md differ from the routes' (documented, declared): {wrong}"


def test_the_errors_table_names_every_documented_error_status() -> None:
    schema = _schema()
    statuses = {int(code) for ops in schema["paths"].values() for op in ops.values() for code in op["responses"]
                if code[0] in "45"} | {405}  # 405: any path, for a method it does not serve (Allow names them)
    table = {int(m) for m in re.findall(r"^\| (\d{3}) \|", _section("## Errors"), flags=re.MULTILINE)}
    assert table == statuses, f"docs/api.md lacks {sorted(statuses - table)}, names {sorted(table - statuses)} too"


def test_the_search_section_names_every_field_of_the_body() -> None:
    schema = _schema()
    fields = set(schema["components"]["schemas"]["SearchIn"]["properties"])
    text = _section("### `POST /v1/search`")
    missing = sorted(f for f in fields if f'"{f}"' not in text)
    assert not missing, f"docs/api.md's POST /v1/search section does not name {missing}"
