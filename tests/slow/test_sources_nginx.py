"""Issue 70's web floor: a site served by nginx (Debian's), the Python documentation's HTML from Debian's
python3.11-doc package (the FAQ: 9 pages, fetched by ``scripts/fetch_python_docs.sh`` as `make demo` fetches it),
with a page changed and one removed between syncs: the first sync stores what `dpr ingest` of the same files
stores, the second reads only the changed page and leaves exactly a fresh ingest's points.

Skips with the reason when nginx is not installed (apt-get install nginx-light) or the package cannot be fetched."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kit.stored import stored_points
from typer.testing import CliRunner

from entrypoints.cli.main import app

pytestmark = pytest.mark.slow

NGINX = Path("/usr/sbin/nginx")
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def faq(tmp_path: Path) -> Path:
    """The FAQ's HTML pages of python3.11-doc, copied into a site folder."""
    done = subprocess.run(["bash", str(REPO / "scripts" / "fetch_python_docs.sh"), str(tmp_path / "deb")],
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        pytest.skip(f"python3.11-doc could not be fetched: {done.stderr.strip()}")
    html = Path(done.stdout.strip()).parent
    site = tmp_path / "site" / "faq"
    shutil.copytree(html / "faq", site)
    return site


@pytest.fixture
def nginx(faq: Path, tmp_path: Path) -> Iterator[str]:
    if not NGINX.exists():
        pytest.skip(f"needs nginx at {NGINX} (apt-get install nginx-light)")
    port, prefix = free_port(), tmp_path / "nginx"
    prefix.mkdir()
    conf = prefix / "nginx.conf"
    temp = " ".join(f"{kind}_temp_path {prefix}/{kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi",
                                                                         "scgi"))
    conf.write_text(f"""daemon off; worker_processes 1; pid {prefix}/nginx.pid; error_log {prefix}/error.log;
{'user root;' if subprocess.run(['id', '-u'], capture_output=True, text=True).stdout.strip() == '0' else ''}
events {{ worker_connections 64; }}
http {{ include /etc/nginx/mime.types; access_log off; {temp}
  server {{ listen 127.0.0.1:{port}; root {faq.parent}; etag on; }} }}
""")
    process = subprocess.Popen([str(NGINX), "-p", str(prefix), "-c", str(conf)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while not _answers(url):
            assert process.poll() is None and time.monotonic() < deadline, (prefix / "error.log").read_text()
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(30)


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/faq/index.html", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def dpr(data: Path, *args: str) -> Any:
    res = CliRunner().invoke(app, ["--data-dir", str(data), *args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def fresh_ingest(tmp: Path, site: Path) -> dict[str, tuple[str, int, str]]:
    """`dpr ingest` of the site's pages, in a folder named as the source, in a new data dir."""
    root = tmp / "fresh" / "pyfaq"
    shutil.rmtree(tmp / "fresh", ignore_errors=True)
    shutil.copytree(site, root)
    dpr(tmp / "fresh-data", "ingest", str(root))
    points = stored_points(tmp / "fresh-data")
    shutil.rmtree(tmp / "fresh-data")
    return points


def test_the_python_faq_on_nginx(nginx: str, faq: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPR_SOURCES__ALLOW_PRIVATE_ADDRESSES", "true")  # nginx is on loopback
    data = tmp_path / "data"
    dpr(data, "sources", "add", "pyfaq", f"{nginx}/faq/")
    first = dpr(data, "sources", "sync", "pyfaq")
    pages = sorted(p.name for p in faq.glob("*.html"))
    assert first["outcome"] == "ok" and sorted(first["read"]) == pages and first["failed"] == 0
    assert stored_points(data) == fresh_ingest(tmp_path, faq)

    gui = faq / "gui.html"
    gui.write_text(gui.read_text().replace("Tkinter", "Tk (Tkinter)", 1))
    (faq / "windows.html").unlink()
    second = dpr(data, "sources", "sync", "pyfaq")
    assert second["read"] == ["gui.html"] and second["removed"] == 1 and second["outcome"] == "ok"
    assert stored_points(data) == fresh_ingest(tmp_path, faq)
    hits = dpr(data, "query", "How do I make a GUI in Python?", "--filter", "source=pyfaq", "-k", "1")
    assert hits[0]["doc_id"].startswith("pyfaq/")
