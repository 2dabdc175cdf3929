"""Sources in a real `dpr serve` (the embedded default): its schedule syncs a source that is due on its own, the
sources are on /metrics, and the console's Sources tab, in a real headless browser (Debian's chromium driven by
Playwright), shows each source and syncs one with its button, the outcome and counts following live.

Skips with the reason when chromium or playwright is missing, as the console's other browser test does."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest
from api_server import DPR, ServeProcess, wait_ready
from test_console_browser import TIMEOUT_MS, _env, _page, _playwright
from worker_cluster import wait_until

pytestmark = pytest.mark.integration


def test_dpr_serve_schedules_sources_and_the_console_syncs_one(tmp_path: Path) -> None:
    sync_api = _playwright()
    data = tmp_path / "data"
    for name, text in (("notes", "To reset the boiler, hold the red button for ten seconds."),
                       ("auto", "The garden hose is kept in the shed behind the house.")):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "a.txt").write_text(text + "\n")
        (folder / "b.md").write_text(f"# {name}\n\nA second note of the {name} source.\n")
        every = ["--every", "1m"] if name == "auto" else []
        added = subprocess.run([DPR, "sources", "add", name, str(folder), *every], env=_env(data), cwd=tmp_path,
                               capture_output=True, text=True, timeout=120)
        assert added.returncode == 0, added.stderr
    server = ServeProcess(_env(data, DPR_SOURCES__TICK_SECONDS="1"), tmp_path)
    try:
        wait_ready(server.url, timeout=180, process=server.process, log=server.log)

        def synced(name: str) -> bool:
            last = httpx.get(f"{server.url}/v1/sources/{name}", timeout=10).json()["last"]
            return last.get("outcome") == "ok"

        wait_until(lambda: synced("auto"), 180, "dpr serve's schedule to sync the due source")
        assert not synced("notes")  # no interval: synced only when asked
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
        assert 'dpr_source_last_sync_ok{source="auto"} 1.0' in metrics
        assert 'dpr_source_last_sync_items{change="added",source="auto"} 2.0' in metrics

        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
            try:
                page, errors = _page(browser, f"{server.url}/#sources")
                expect = sync_api.expect
                notes = page.locator("tr[data-source=notes]")
                expect(notes.locator("td.outcome")).to_have_text("never synced")
                expect(page.locator("tr[data-source=auto] td.outcome")).to_have_text("ok")
                notes.locator("button[data-source=notes]").click()
                expect(notes.locator("td.outcome")).to_have_text("ok", timeout=TIMEOUT_MS)
                expect(notes).to_contain_text("2 added, 0 changed, 0 removed, 0 failed")
                expect(page.locator("#sources-message")).to_have_text("notes: ok")
                assert errors == [], errors
            finally:
                browser.close()
        hits = httpx.post(f"{server.url}/v1/search", json={"question": "reset the boiler", "k": 1,
                                                            "filters": {"source": "notes"}}, timeout=60).json()
        assert hits["hits"][0]["doc_id"] == "notes/a.txt"
    finally:
        server.stop()
