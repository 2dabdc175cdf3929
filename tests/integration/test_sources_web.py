"""`dpr sources` on a web site served by a real HTTP server (Python's http.server on loopback, a thread of the
test): links followed within the start path, robots.txt honoured, a page changed and one removed between syncs
leave exactly a fresh ingest's points with only the changed page read; loopback is refused unless the setting
allows it, redirects out of the path are not followed, and a crawl over the page limit reads and removes nothing."""

from __future__ import annotations

import functools
import json
import shutil
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kit.documents import make_pdf
from kit.stored import stored_points
from typer.testing import CliRunner

from entrypoints.cli.main import app

pytestmark = pytest.mark.integration

PAGES = {
    "docs/index.html": '<html><head><title>Handbook</title></head><body><h1>Handbook</h1><p>The house handbook.</p>'
                       '<a href="boiler.html">Boiler</a> <a href="garden/roses.html">Roses</a> '
                       '<a href="/docs/kitchen.html#top">Kitchen</a> <a href="/private/secret.html">x</a> '
                       '<a href="moved.html">moved</a> <a href="boiler.html?print=1">print</a> '
                       '<a href="manual.pdf">the manual</a></body></html>',
    "docs/boiler.html": "<html><head><title>Boiler</title></head><body><h1>Boiler</h1><p>To reset the boiler, hold "
                        "the red button for ten seconds.</p></body></html>",
    "docs/garden/roses.html": "<html><head><title>Roses</title></head><body><h1>Roses</h1><p>Prune the roses in early "
                              "spring.</p><a href='../boiler.html'>back</a></body></html>",
    "docs/kitchen.html": "<html><head><title>Kitchen</title></head><body><p>Rinse the dishwasher filter weekly.</p>"
                         "</body></html>",
    "docs/robots-hidden.html": "<html><body><p>never linked, never read</p></body></html>",
    "private/secret.html": "<html><body><p>outside the start path</p></body></html>",
    "robots.txt": "User-agent: *\nDisallow: /docs/kitchen.html\n",
}


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def send_head(self) -> Any:
        if self.path == "/docs/moved.html":  # a redirect out of the start path: not followed
            self.send_response(302)
            self.send_header("Location", "/private/secret.html")
            self.end_headers()
            return None
        return super().send_head()


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    root = tmp_path / "site"
    for key, text in PAGES.items():
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_text(text)
    make_pdf(root / "docs" / "manual.pdf", ["Contents", "To bleed a radiator, turn the valve a quarter turn."])
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", root
    server.shutdown()
    server.server_close()


def dpr(data: Path, *args: str, code: int = 0) -> Any:
    res = CliRunner().invoke(app, ["--data-dir", str(data), *args, "--json"])
    assert res.exit_code == code, res.output
    return json.loads(res.stdout) if code == 0 else res


def fresh_ingest(tmp: Path, name: str, files: dict[str, str | bytes]) -> dict[str, tuple[str, int, str]]:
    root = tmp / "fresh" / name
    shutil.rmtree(tmp / "fresh", ignore_errors=True)
    for key, body in files.items():
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(body if isinstance(body, bytes) else body.encode())
    dpr(tmp / "fresh-data", "ingest", str(root))
    points = stored_points(tmp / "fresh-data")
    shutil.rmtree(tmp / "fresh-data")
    return points


def test_a_web_source(site: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url, root = site
    data = tmp_path / "data"
    dpr(data, "sources", "add", "handbook", f"{url}/docs/")
    refused = dpr(data, "sources", "sync", "handbook", code=1)  # loopback: refused by default
    assert "127.0.0.1 resolves to 127.0.0.1, a loopback" in refused.stderr
    assert "DPR_SOURCES__ALLOW_PRIVATE_ADDRESSES" in refused.stderr

    monkeypatch.setenv("DPR_SOURCES__ALLOW_PRIVATE_ADDRESSES", "true")
    first = dpr(data, "sources", "sync", "handbook")
    # kitchen.html: robots.txt disallows it; secret.html and the redirect: outside /docs/; ?print=1: a query
    # manual.pdf: a PDF found on the site, read by the product's PDF reader
    assert sorted(first["read"]) == ["boiler.html", "garden/roses.html", "index.html", "manual.pdf"]
    assert first["outcome"] == "ok" and first["failed"] == 0
    expected = {k.removeprefix("docs/"): PAGES[k] for k in ("docs/index.html", "docs/boiler.html",
                                                             "docs/garden/roses.html")}
    expected["manual.pdf"] = (root / "docs" / "manual.pdf").read_bytes()
    assert stored_points(data) == fresh_ingest(tmp_path, "handbook", expected)

    (root / "docs" / "boiler.html").write_text("<html><head><title>Boiler</title></head><body><h1>Boiler</h1><p>Bleed"
                                               " the radiators before winter.</p></body></html>")
    (root / "docs" / "garden" / "roses.html").unlink()
    second = dpr(data, "sources", "sync", "handbook")
    assert second["read"] == ["boiler.html"] and second["removed"] == 1 and second["documents"] == 1
    expected = {"index.html": PAGES["docs/index.html"], "boiler.html": (root / "docs" / "boiler.html").read_text(),
                "manual.pdf": (root / "docs" / "manual.pdf").read_bytes()}
    assert stored_points(data) == fresh_ingest(tmp_path, "handbook", expected)

    # over the page limit: a listing cut short reads nothing and removes nothing, naming the setting
    monkeypatch.setenv("DPR_SOURCES__MAX_PAGES", "1")
    (root / "docs" / "index.html").write_text(PAGES["docs/index.html"].replace("house", "family"))
    cut = dpr(data, "sources", "sync", "handbook", code=1)
    assert "DPR_SOURCES__MAX_PAGES" in cut.stderr
    assert stored_points(data) == fresh_ingest(tmp_path, "handbook", expected)
