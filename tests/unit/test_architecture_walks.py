"""docs/architecture.md's walks name real frames: every ``path qualname`` line of its frame blocks (printed by
scripts/walk_frames.py from a real run) is still defined in that file, so the page cannot drift from the code
unseen. Read with ``ast``: nothing is imported."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
FRAME = re.compile(r"^  ((?:entrypoints|services|encoders|workers)/[\w/]+\.py) ([\w.<>]+)$")


def defined(path: Path) -> set[str]:
    """The qualified names of the functions and classes defined in ``path``, as ``co_qualname`` spells them."""
    names: set[str] = set()

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(prefix + child.name)
                visit(child, f"{prefix}{child.name}.<locals>.")
            elif isinstance(child, ast.ClassDef):
                names.add(prefix + child.name)
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text()), "")
    return names


def frames() -> list[tuple[str, str]]:
    text = (REPO / "docs" / "architecture.md").read_text()
    return [(m[1], m[2]) for line in text.splitlines() if (m := FRAME.match(line))]


def test_the_walks_show_frames() -> None:
    named = frames()
    assert len(named) > 20, "the frame blocks of the two walks are missing from docs/architecture.md"
    assert ("services/ingest/job.py", "IngestJob.run") in named
    assert ("services/query.py", "search_many") in named


@pytest.mark.parametrize(("path", "qualname"), sorted(set(frames())))
def test_each_frame_is_still_defined_where_the_page_says(path: str, qualname: str) -> None:
    source = REPO / path
    assert source.is_file(), f"docs/architecture.md names {path}; run scripts/walk_frames.py and update the walks"
    function = re.sub(r"\.<locals>\.<(listcomp|dictcomp|setcomp|genexpr|lambda)>$", "", qualname)
    assert function in defined(source), (
        f"docs/architecture.md names {qualname} in {path}, which no longer defines it; run scripts/walk_frames.py "
        "and update the walks")
