"""The search console in a real headless browser: Debian's chromium (``/usr/bin/chromium``) driven by Playwright,
against a real ``dpr serve`` on a loopback port with the real base model and the embedded engine.

The journey: load the page (empty collection), upload a JSONL corpus through the file picker and drop a Markdown
file on the page, follow both jobs to the end (a bad row is reported with its reason), search and find the dropped
file first with the question's words marked, compare dense with BM25 side by side, read the evaluation report
`dpr eval --report` kept in the data dir; then, on a server with an API key, the key prompt, a refused key and the
right one.

Skips with the reason when chromium or playwright is missing (``make test`` installs chromium where it can).
``CONSOLE_SCREENSHOTS=docs/console`` saves a 1200x800 screenshot of each state there (the README shows them).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_server import DPR, ServeProcess, wait_ready

pytestmark = pytest.mark.integration

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOTS = os.environ.get("CONSOLE_SCREENSHOTS")  # not DPR_*: the suite removes those from every test
KEY = "console-test-key"
TIMEOUT_MS = 120_000

CORPUS = [
    ("nile", "The Nile", "The Nile is the longest river in Africa. It flows north through eleven countries and "
     "empties into the Mediterranean Sea; its yearly flood made farming possible in ancient Egypt.", "geography"),
    ("tides", "Tides", "Tides are the rise and fall of sea levels caused by the gravity of the Moon and the Sun. "
     "Most coasts see two high tides and two low tides every lunar day.", "science"),
    ("photosynthesis", "Photosynthesis", "Plants convert light energy into chemical energy: chlorophyll absorbs "
     "sunlight, and carbon dioxide and water become glucose and oxygen.", "science"),
    ("volcanoes", "Volcanoes", "A volcano is an opening in the crust where molten rock, ash and gases escape. "
     "Magma that reaches the surface is called lava.", "science"),
    ("python-files", "Reading files in Python", "Open a text file with `with open(path) as f:` and iterate "
     "`for line in f:` to read it line by line without loading it all into memory.", "programming"),
    ("git-branches", "Git branches", "A branch in Git is a movable pointer to a commit. `git switch -c name` "
     "creates one; merging joins the histories of two branches.", "programming"),
    ("tea", "Tea", "Tea is made by steeping the cured leaves of Camellia sinensis in hot water. Green and black "
     "tea come from the same plant; black tea leaves are oxidised.", "food"),
    ("sourdough", "Sourdough", "Sourdough bread rises with a starter of wild yeast and lactic acid bacteria "
     "instead of baker's yeast, which gives it a sour taste.", "food"),
]
DROPPED = ("honeybees.md", "# Honeybees\n\nWorker bees collect nectar from flowers and carry it back to the "
           "hive. They store it in wax combs and fan it with their wings until most of the water evaporates: "
           "the nectar becomes honey.\n")
QUERIES = {  # the evaluation set: questions about the corpus, each with its one relevant document
    "q1": ("Which river flows into the Mediterranean?", "nile"),
    "q2": ("What makes the sea rise and fall each day?", "tides"),
    "q3": ("How do plants make sugar from light?", "photosynthesis"),
    "q4": ("What is lava?", "volcanoes"),
    "q5": ("How can I read a big text file one line at a time?", "python-files"),
    "q6": ("How do I create a new branch?", "git-branches"),
    "q7": ("What is the difference between green and black tea?", "tea"),
    "q8": ("Why does sourdough bread taste sour?", "sourdough"),
}


def _playwright() -> Any:
    if not CHROMIUM.exists():
        pytest.skip(f"needs Debian's chromium at {CHROMIUM} (apt-get install -y chromium; `make test` does it as root)")
    return pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install -e '.[test]')")


def _env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPR_")}
    env.update({"DPR_DATA_DIR": str(data_dir), "DPR_ENCODER__THREADS": "1", "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1", **extra})
    return env


def _write_inputs(root: Path) -> tuple[Path, Path]:
    """The corpus as JSONL for the upload (plus one empty row: a failure with its reason), and a BEIR folder of
    the same documents with the questions above for `dpr eval`."""
    rows = [{"id": i, "title": t, "text": x, "topic": topic} for i, t, x, topic in CORPUS]
    jsonl = root / "corpus.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in [*rows, {"id": "blank", "text": "  "}]))
    beir = root / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text("".join(json.dumps({"_id": i, "title": t, "text": x}) + "\n"
                                               for i, t, x, _ in CORPUS))
    (beir / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": text}) + "\n"
                                                for q, (text, _) in QUERIES.items()))
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{doc}\t1\n" for q, (_, doc) in QUERIES.items()))
    return jsonl, beir


def _shoot(page: Any, name: str) -> None:
    if SCREENSHOTS:
        folder = Path(SCREENSHOTS)
        folder.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(folder / f"{name}.png"))


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = _playwright()
    with sync_api.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """`dpr eval --report` into the data dir, then `dpr serve` over it (no key)."""
    root = tmp_path_factory.mktemp("console")
    data = root / "data"
    jsonl, beir = _write_inputs(root)
    evaluation = subprocess.run(
        [DPR, "eval", str(beir), "--split", "test", "--in-memory", "--report", str(root / "report"), "--json"],
        env=_env(data), cwd=root, capture_output=True, text=True, timeout=600,
    )
    assert evaluation.returncode == 0, evaluation.stderr
    server = ServeProcess(_env(data), root)
    try:
        wait_ready(server.url, timeout=180, process=server.process, log=server.log)
        yield {"url": server.url, "root": root, "data": data, "jsonl": jsonl}
    finally:
        server.stop()


def _page(browser: Any, url: str) -> tuple[Any, list[str]]:
    """A 1200x800 page on ``url``, and the list its script errors and failed requests are collected in."""
    context = browser.new_context(viewport={"width": 1200, "height": 800}, device_scale_factor=1)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(url)
    return page, errors


def _drop(page: Any, selector: str, name: str, text: str) -> None:
    """A real drop event carrying a File, as a file dragged from the desktop."""
    page.evaluate(
        """([selector, name, text]) => {
            const dt = new DataTransfer();
            dt.items.add(new File([text], name, { type: "text/markdown" }));
            const zone = document.querySelector(selector);
            zone.dispatchEvent(new DragEvent("dragover", { dataTransfer: dt, bubbles: true, cancelable: true }));
            zone.dispatchEvent(new DragEvent("drop", { dataTransfer: dt, bubbles: true, cancelable: true }));
        }""",
        [selector, name, text],
    )


def _ingest(page: Any, expect: Any, jsonl: Path) -> None:
    expect(page.locator("#status-message")).to_contain_text("No collection yet")
    page.click("a[data-tab=ingest]")
    page.set_input_files("#file-input", str(jsonl))
    _drop(page, "#dropzone", *DROPPED)
    jobs = page.locator(".job")
    expect(jobs).to_have_count(2)
    expect(page.locator(".job[data-state=done]")).to_have_count(2, timeout=TIMEOUT_MS)
    corpus_job = jobs.filter(has_text="corpus.jsonl")
    expect(corpus_job.locator("[data-counter=documents] b")).to_have_text(f"{len(CORPUS)} / {len(CORPUS)}")
    expect(corpus_job.locator(".failures li")).to_have_count(1)
    expect(corpus_job.locator(".failures li")).to_contain_text("empty")
    for job in (corpus_job, jobs.filter(has_text=DROPPED[0])):
        assert int(job.locator("[data-counter=passages] b").inner_text()) >= 1
        assert float(job.locator("[data-counter='passages/s'] b").inner_text().replace(",", "")) > 0
    # the collection panel refreshed after the jobs: generation, points, the model by name
    expect(page.locator("#status-fields")).to_contain_text("base")
    points = page.locator("#status-fields dt:text-is('points') + dd")
    assert int(points.inner_text().replace(",", "")) >= len(CORPUS) + 1
    _shoot(page, "ingest")


def _search(page: Any, expect: Any) -> None:
    page.click("a[data-tab=search]")
    page.fill("#question", "How do bees turn nectar into honey?")
    page.click("#search-form button[type=submit]")
    hits = page.locator("#results .hit")
    expect(hits.first).to_have_attribute("data-doc", DROPPED[0])
    expect(hits.first.locator(".rank")).to_have_text("#1")
    expect(hits.first.locator(".place")).to_have_text(f"{DROPPED[0]} › Honeybees")  # where the passage came from
    marked = {m.lower() for m in hits.first.locator("mark").all_inner_texts()}
    assert {"bees", "nectar", "honey"} <= marked, marked
    assert "how" not in marked and "do" not in marked  # question words too common to mark
    _shoot(page, "search")


def _compare(page: Any, expect: Any) -> None:
    page.select_option("#mode", "dense")
    page.select_option("#compare", "sparse")
    page.fill("#k", "5")
    page.fill("#question", "What makes the sea rise and fall each day?")
    page.click("#search-form button[type=submit]")
    expect(page.locator("#results .column")).to_have_count(2)
    expect(page.locator("#compare-summary")).to_be_visible()
    dense, sparse = (page.locator(f"#results .column[data-mode={m}]") for m in ("dense", "sparse"))
    expect(dense.locator(".hit").first).to_have_attribute("data-doc", "tides")
    dense_docs = [h.get_attribute("data-doc") for h in dense.locator(".hit").all()]
    sparse_docs = [h.get_attribute("data-doc") for h in sparse.locator(".hit").all()]
    assert dense_docs and sparse_docs and dense_docs != sparse_docs
    for column, other, label in ((dense, sparse_docs, "sparse (BM25)"), (sparse, dense_docs, "dense")):
        for hit in column.locator(".hit").all():
            doc = hit.get_attribute("data-doc")
            only = "only" in (hit.get_attribute("class") or "")
            assert only == (doc not in other), doc
            badge = hit.locator(".badge").inner_text()
            assert badge == (f"not in {label}" if only else f"#{other.index(doc) + 1} in {label}"), (doc, badge)
    assert page.locator("#results .hit.only").count() >= 1
    _shoot(page, "compare")


def _report(page: Any, expect: Any) -> None:
    page.click("a[data-tab=eval]")
    table = page.locator("table.metrics")
    expect(table).to_contain_text("bm25")
    expect(table).to_contain_text("base")
    expect(page.locator("#eval-message")).to_contain_text(f"{len(QUERIES)} queries")
    images = page.locator(".plots img")
    expect(images).to_have_count(1)  # BEIR: recall@k (no answer strings, so no answer-accuracy plot)
    page.wait_for_function("() => [...document.querySelectorAll('.plots img')].every(i => i.naturalWidth > 0)")
    _shoot(page, "evaluation")


def test_console_journey(browser: Any, deployment: dict[str, Any]) -> None:
    expect = _playwright().expect
    page, errors = _page(browser, deployment["url"])
    assert page.title() == "dpr console"
    _ingest(page, expect, deployment["jsonl"])
    _search(page, expect)
    _compare(page, expect)
    _report(page, expect)
    assert errors == []
    page.context.close()


def test_console_asks_for_the_api_key(browser: Any, deployment: dict[str, Any]) -> None:
    expect = _playwright().expect
    root = deployment["root"]
    server = ServeProcess(_env(deployment["data"], DPR_API__API_KEY=KEY), root)
    try:
        wait_ready(server.url, timeout=180, process=server.process, log=server.log)
        page, errors = _page(browser, server.url)
        dialog = page.locator("#key-dialog")
        expect(dialog).to_be_visible()
        expect(page.locator("#key-reason")).to_contain_text("asks for an API key")
        _shoot(page, "api-key")
        page.fill("#key-input", "not-the-key")
        page.click("#key-form button[type=submit]")
        expect(page.locator("#key-reason")).to_contain_text("refused")
        page.fill("#key-input", KEY)
        page.click("#key-form button[type=submit]")
        expect(dialog).to_be_hidden()
        expect(page.locator("#key-state")).to_have_text("API key set")
        expect(page.locator("#status-fields")).to_contain_text("base")
        page.fill("#question", "Which river flows into the Mediterranean?")
        page.click("#search-form button[type=submit]")
        expect(page.locator("#results .hit").first).to_have_attribute("data-doc", "nile")
        assert page.evaluate("() => sessionStorage.getItem('dpr-api-key')") == KEY
        page.reload()  # asked once: the stored key is sent again, no prompt
        expect(page.locator("#status-fields")).to_contain_text("base")
        expect(dialog).to_be_hidden()
        assert errors == []
        page.context.close()
    finally:
        server.stop()
