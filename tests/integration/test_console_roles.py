"""The console shows only what its key may do: in a real headless browser (Debian's chromium, Playwright) against
a real ``dpr serve`` with a keys file. A read key sees Search and Evaluation but no Ingest tab and no feedback
buttons; a write key sees the Ingest tab. Skips with the reason when chromium or playwright is missing."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_server import ServeProcess, wait_ready

from services.access import KeyStore, keys_path

pytestmark = pytest.mark.integration

CHROMIUM = Path("/usr/bin/chromium")
TIMEOUT_MS = 120_000


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if not CHROMIUM.exists():
        pytest.skip(f"needs Debian's chromium at {CHROMIUM} (apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install -e '.[test]')")
    root = tmp_path_factory.mktemp("console-roles")
    store = KeyStore(keys_path(root / "data"))
    tokens = {role: store.create(role, name=f"{role} person")[1] for role in ("read", "write")}
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPR_")}
    env.update({"DPR_DATA_DIR": str(root / "data"), "DPR_ENCODER__THREADS": "1", "HF_HUB_OFFLINE": "1"})
    server = ServeProcess(env, root)
    try:
        wait_ready(server.url, timeout=180, process=server.process, log=server.log)
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
            try:
                yield {"url": server.url, "tokens": tokens, "browser": browser, "expect": sync_api.expect}
            finally:
                browser.close()
    finally:
        server.stop()


def _open_with_key(served: dict[str, Any], token: str) -> Any:
    page = served["browser"].new_context().new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(served["url"] + "/")
    page.fill("#key-input", token)  # the server asks for a key: the dialog opens
    page.click("#key-form button[type=submit]")
    return page


def test_a_read_key_is_not_offered_ingest(served: dict[str, Any]) -> None:
    expect = served["expect"]
    page = _open_with_key(served, served["tokens"]["read"])
    expect(page.locator("#key-role")).to_have_text("read person (read)")
    expect(page.locator('.tabs a[data-tab="ingest"]')).to_be_hidden()
    expect(page.locator('.tabs a[data-tab="search"]')).to_be_visible()
    page.goto(served["url"] + "/#ingest")  # typed by hand: still not shown
    expect(page.locator("#tab-ingest")).to_be_hidden()
    assert page.evaluate("document.body.dataset.may") == "read"


def test_a_write_key_is_offered_ingest(served: dict[str, Any]) -> None:
    expect = served["expect"]
    page = _open_with_key(served, served["tokens"]["write"])
    expect(page.locator("#key-role")).to_have_text("write person (write)")
    expect(page.locator('.tabs a[data-tab="ingest"]')).to_be_visible()
    page.click('.tabs a[data-tab="ingest"]')
    expect(page.locator("#tab-ingest")).to_be_visible()
