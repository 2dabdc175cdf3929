"""The integrations over the demo's PDF (Debian's gnuplot-doc: gnuplot.pdf, 311 pages; fetched by
scripts/fetch_debian_pdfs.sh, skipped when the package archive cannot be reached): a real server ingests it through
the client's upload, then the demo question ("How do I save a plot as a PNG image?") is asked through the client,
a LangChain retriever, a Haystack component and an MCP session over stdio, each answering with the manual's page
and heading path."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from integration.api_server import DPR, LiveServer, wait_ready

from dpr_client import Client
from entrypoints.api.app import create_app
from services.core.settings import ApiSettings, Settings
from services.runtime import Runtime

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
KEY = "demo-admin"
QUESTION = "How do I save a plot as a PNG image?"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, base_towers: Any) -> Iterator[str]:
    root = tmp_path_factory.mktemp("demo-pdf")
    fetched = subprocess.run([str(ROOT / "scripts/fetch_debian_pdfs.sh"), str(root), "gnuplot-doc"],
                             capture_output=True, text=True, check=False)
    if fetched.returncode != 0:
        pytest.skip(f"gnuplot-doc could not be fetched: {fetched.stderr.strip()}")
    settings = Settings(data_dir=root / "dpr", api=ApiSettings(api_key=KEY))
    runtime = Runtime(settings)
    runtime.__dict__["towers"] = base_towers
    with LiveServer(create_app(settings, runtime=runtime)) as server:
        wait_ready(server.url, timeout=300)
        with Client(server.url, api_key=KEY) as dpr:
            job = dpr.wait(dpr.upload(Path(fetched.stdout.strip()) / "gnuplot.pdf"), timeout=3600)
            assert job.state == "done" and job.chunks > 300, job
        yield server.url


def _is_the_png_page(text: str, page: int | None, heading: list[str] | None) -> bool:
    return page is not None and bool(heading) and "png" in text.lower()


def test_the_demo_question_through_each_integration(served: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from dpr_client.haystack import DprRetriever as HaystackRetriever
    from dpr_client.langchain import DprRetriever as LangChainRetriever

    with Client(served, api_key=KEY) as dpr:
        hit = dpr.search(QUESTION, k=3).hits[0]
    assert hit.doc_id.endswith("gnuplot.pdf") and _is_the_png_page(hit.text, hit.page, hit.heading), hit
    assert "p." in hit.citation()
    doc = LangChainRetriever(url=served, api_key=KEY, k=3).invoke(QUESTION)[0]
    assert doc.metadata["page"] == hit.page and doc.metadata["heading"] == hit.heading
    monkeypatch.setenv("DPR_API__API_KEY", KEY)  # the Haystack Secret's variable
    found = HaystackRetriever(served, top_k=3).run(QUESTION)["documents"][0]
    assert found.meta["page"] == hit.page

    from mcp.client import Client as McpClient
    from mcp.client.stdio import StdioServerParameters

    env = {k: v for k, v in os.environ.items() if not k.startswith("DPR_")} | {
        "DPR_API_URL": served, "DPR_API__API_KEY": KEY}

    async def agent() -> Any:
        async with McpClient(StdioServerParameters(command=DPR, args=["mcp"], env=env)) as mcp:
            return await mcp.call_tool("search", {"question": QUESTION, "k": 3})

    first = asyncio.run(agent()).structured_content["results"][0]
    assert first["page"] == hit.page and first["citation"] == hit.citation()
