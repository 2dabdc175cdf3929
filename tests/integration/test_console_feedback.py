"""The console's "relevant / not relevant" buttons in a real headless browser (Debian's chromium, Playwright)
against a real ``dpr serve`` (base model, embedded engine): a press stores the judgement (the hit's document and
chunk with the question asked), the collection panel counts it, a repeat says so, the other button replaces it;
`dpr feedback list --json` then reads what the browser stored. Skips with the reason when chromium or playwright
is missing."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from api_server import DPR, ServeProcess, wait_ready
from test_console_browser import TIMEOUT_MS, _env, _page, _playwright

pytestmark = pytest.mark.integration

ROWS = [
    {"id": "nile", "title": "The Nile", "text": "The Nile is the longest river in Africa and flows north."},
    {"id": "tides", "title": "Tides", "text": "Tides are the rise and fall of sea levels caused by the Moon."},
    {"id": "tea", "title": "Tea", "text": "Green tea is not oxidised; black tea is fully oxidised."},
]


def test_buttons_store_count_and_replace_judgements(tmp_path: Path) -> None:
    sync_api = _playwright()
    data = tmp_path / "data"
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    done = subprocess.run([DPR, "ingest", str(corpus), "--json"], env=_env(data), cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    server = ServeProcess(_env(data), tmp_path)
    try:
        wait_ready(server.url, timeout=180, process=server.process, log=server.log)
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
            try:
                expect = sync_api.expect
                page, errors = _page(browser, server.url)
                page.click("a[data-tab=search]")
                page.fill("#question", "Which river flows north?")
                page.click("#search-form button[type=submit]")
                first = page.locator("#results .hit").first
                expect(first).to_have_attribute("data-doc", "nile")
                first.locator(".feedback-button[data-relevant=true]").click()
                expect(first.locator(".feedback-note")).to_have_text("saved", timeout=TIMEOUT_MS)
                expect(first.locator(".feedback-button.chosen")).to_have_attribute("data-relevant", "true")
                panel = page.locator("#status-fields dt:text-is('feedback') + dd")
                expect(panel).to_contain_text("1 judgements")
                first.locator(".feedback-button[data-relevant=true]").click()
                expect(first.locator(".feedback-note")).to_have_text("already judged")
                first.locator(".feedback-button[data-relevant=false]").click()
                expect(first.locator(".feedback-button.chosen")).to_have_attribute("data-relevant", "false")
                expect(panel).to_contain_text("1 judgements")
                expect(panel).to_contain_text("0 relevant")
                assert errors == []
                page.context.close()
            finally:
                browser.close()
    finally:
        server.stop()
    listed = subprocess.run([DPR, "feedback", "list", "--json"], env=_env(data), cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    judgements = json.loads(listed.stdout)["judgements"]
    assert [(j["question"], j["doc_id"], j["chunk"], j["relevant"]) for j in judgements] == [
        ("Which river flows north?", "nile", 0, False)]
