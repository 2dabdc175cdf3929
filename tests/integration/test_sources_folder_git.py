"""`dpr sources` on a folder and on real git repositories, through the real store and the base towers: a sync
stores what `dpr ingest` of the same files stores, the next one reads only what changed and leaves exactly a
fresh ingest's points, `--filter source=NAME` finds the source's documents, `remove --purge` removes exactly them,
an unreachable source exits 3 deleting nothing, and two commits between syncs re-read only the files they touched."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kit.stored import stored_points
from typer.testing import CliRunner

from entrypoints.cli.main import app

pytestmark = pytest.mark.integration

FILES = {
    "boiler.md": "# Boiler\n\nTo reset the boiler, hold the red button for ten seconds.\n",
    "garden/hose.txt": "The garden hose is kept in the shed behind the house, coiled on the left wall.\n",
    "garden/roses.md": "# Roses\n\nPrune the roses in early spring, just above an outward-facing bud.\n",
    "kitchen.txt": "The dishwasher filter is under the lower basket; rinse it once a week.\n",
}


def dpr(data: Path, *args: str, code: int = 0) -> Any:
    res = CliRunner().invoke(app, ["--data-dir", str(data), *args, "--json"])
    assert res.exit_code == code, res.output
    return json.loads(res.stdout) if code == 0 else res


def write(root: Path, files: dict[str, str]) -> None:
    for key, text in files.items():
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_text(text)


def fresh_ingest(tmp: Path, name: str, files: dict[str, str]) -> dict[str, tuple[str, int, str]]:
    """The points `dpr ingest` of these files, in a folder called ``name``, stores in a new data dir."""
    root = tmp / "fresh" / name
    shutil.rmtree(tmp / "fresh", ignore_errors=True)
    write(root, files)
    dpr(tmp / "fresh-data", "ingest", str(root))
    points = stored_points(tmp / "fresh-data")
    shutil.rmtree(tmp / "fresh-data")
    return points


def test_a_folder_source(tmp_path: Path) -> None:
    data, folder = tmp_path / "data", tmp_path / "manuals"
    write(folder, FILES)
    added = dpr(data, "sources", "add", "house", str(folder), "--every", "15m", "--exclude", "*.tmp")
    assert added["kind"] == "folder" and added["every_s"] == 900
    first = dpr(data, "sources", "sync", "house")
    assert (first["outcome"], first["added"], first["documents"]) == ("ok", 4, 4)
    assert stored_points(data) == fresh_ingest(tmp_path, "house", FILES)

    (folder / "kitchen.txt").write_text("The dishwasher salt goes in the cap at the bottom of the machine.\n")
    (folder / "garden" / "hose.txt").unlink()
    (folder / "scratch.tmp").write_text("excluded")
    second = dpr(data, "sources", "sync", "house")
    assert (second["changed"], second["unchanged"], second["removed"], second["documents"]) == (1, 2, 1, 1)
    assert second["read"] == ["kitchen.txt"] and second["gone"] == ["house/garden/hose.txt"]
    now = {k: v for k, v in FILES.items() if k != "garden/hose.txt"} | {
        "kitchen.txt": (folder / "kitchen.txt").read_text()}
    assert stored_points(data) == fresh_ingest(tmp_path, "house", now)

    hits = dpr(data, "query", "where does the dishwasher salt go", "--filter", "source=house", "-k", "1")
    assert hits[0]["doc_id"] == "house/kitchen.txt" and hits[0]["source"] == "house"
    listed = dpr(data, "sources", "list")
    assert listed[0]["name"] == "house" and listed[0]["last"]["outcome"] == "ok" and listed[0]["next_run"]

    # a sync of it running elsewhere (its lock held): refused at once, exit 3, saying so
    from services.sources.state import sync_lock

    with sync_lock(data / "sources" / "house", "house"):
        busy = dpr(data, "sources", "sync", "house", code=3)
    assert "source house: a sync is already running (pid" in busy.stderr

    # the folder unmounted: exit 3, one line naming the source and the fix, nothing deleted
    folder.rename(tmp_path / "away")
    res = dpr(data, "sources", "sync", "house", code=3)
    assert "source house" in res.stderr and "mount or restore it" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert {p[0] for p in stored_points(data).values()} == {f"house/{k}" for k in now}
    assert dpr(data, "sources", "list")[0]["last"]["outcome"] == "failed"

    # --purge removes exactly the source's documents: another folder's stay
    other = tmp_path / "other"
    write(other, {"note.txt": "An unrelated note about the attic insulation.\n"})
    dpr(data, "ingest", str(other))
    purged = dpr(data, "sources", "remove", "house", "--purge")
    assert purged["documents"] == 3
    assert {p[0] for p in stored_points(data).values()} == {"other/note.txt"}
    assert dpr(data, "sources", "list") == []


def git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.org", "HOME": str(repo.parent), "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def test_a_git_source_reads_only_what_the_commits_touched(tmp_path: Path) -> None:
    data, repo = tmp_path / "data", tmp_path / "handbook"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    write(repo, FILES)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "first")
    dpr(data, "sources", "add", "handbook", f"git+file://{repo}", "--branch", "main")
    first = dpr(data, "sources", "sync", "handbook")
    assert (first["outcome"], first["added"], first["documents"]) == ("ok", 4, 4)
    assert first["mark"] == git(repo, "rev-parse", "HEAD")
    assert stored_points(data) == fresh_ingest(tmp_path, "handbook", FILES)

    # two commits: one changes kitchen.txt and removes the hose; the next adds a file and changes the roses
    (repo / "kitchen.txt").write_text("The oven's grill pan lives in the bottom drawer.\n")
    git(repo, "rm", "-q", "garden/hose.txt")
    git(repo, "commit", "-q", "-am", "second")
    write(repo, {"garage.md": "# Garage\n\nThe spare fuses are in the tin above the workbench.\n",
                 "garden/roses.md": "# Roses\n\nFeed the roses with tomato fertiliser in June.\n"})
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "third")
    second = dpr(data, "sources", "sync", "handbook")
    assert sorted(second["read"]) == ["garage.md", "garden/roses.md", "kitchen.txt"]  # only the touched files
    assert (second["added"], second["changed"], second["unchanged"], second["removed"]) == (1, 2, 1, 1)
    assert second["documents"] == 3 and second["mark"] == git(repo, "rev-parse", "HEAD")
    now = {k: (repo / k).read_text() for k in ("boiler.md", "garage.md", "garden/roses.md", "kitchen.txt")}
    assert stored_points(data) == fresh_ingest(tmp_path, "handbook", now)
    assert dpr(data, "sources", "sync", "handbook")["read"] == []  # nothing new: nothing read

    # the repository gone: exit 3 naming the source, nothing deleted
    repo.rename(tmp_path / "moved")
    res = dpr(data, "sources", "sync", "handbook", code=3)
    assert "source handbook: git could not fetch main" in res.stderr
    assert {p[0] for p in stored_points(data).values()} == {f"handbook/{k}" for k in now}
