"""The client and every integration against a real server (the real app under uvicorn on a loopback port, the
base towers, the embedded engine; one per module) over a small real corpus (a PDF with pages and an outline, a
Markdown guide with headings, JSON records): the sync and async client, retries against a real 429, LangChain's
standard retriever tests and a chain, a LlamaIndex retrieval, a Haystack pipeline (and its to_dict / from_dict),
an MCP session with `dpr mcp` over stdio in a subprocess, and the examples of docs/integrations.md."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_server import DPR, LiveServer, free_port, wait_ready
from kit.documents import make_pdf
from langchain_core.retrievers import BaseRetriever
from langchain_tests.integration_tests import RetrieversIntegrationTests

from dpr_client import AsyncClient, Client, RateLimited, Retry
from entrypoints.api.app import create_app
from services.core.settings import ApiSettings, Settings
from services.runtime import Runtime

pytestmark = pytest.mark.integration

KEY = "integration-admin"
REPO = Path(__file__).resolve().parents[2]
PAGES = [
    "Plotting with gnuplot\nThis manual describes the plotting program and its terminals.",
    "Saving a plot as a PNG image\nTo save a plot as a PNG image, set terminal png and set output to a file name,\n"
    "then replot: set terminal png; set output 'plot.png'; replot.",
    "Printing to PostScript\nThe postscript terminal writes a plot that a printer can print.",
]
GUIDE = ("# Reading files\n\nIntro to files.\n\n## Line by line\n\nUse `with open(path) as f:` and iterate `for line "
         "in f:` to read a text file line by line.\n\n## Whole file\n\nCall `f.read()` to get the whole file as one "
         "string.\n")
RECORDS = [
    {"id": "nile", "title": "Rivers", "text": "The Nile is the longest river in Africa and flows north."},
    {"id": "cats", "title": "Cats", "text": "Cats are small carnivores that purr and hunt mice at night.",
     "metadata": {"topic": "animals"}},
]


@dataclass
class Served:
    url: str
    env: dict[str, str]
    folder: Path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, base_towers: Any) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("integrations")
    settings = Settings(data_dir=root / "dpr", api=ApiSettings(api_key=KEY, rate_burst=1))
    runtime = Runtime(settings)
    runtime.__dict__["towers"] = base_towers  # the session's model
    folder = root / "corpus"
    folder.mkdir()
    make_pdf(folder / "gnuplot.pdf", PAGES, outline=[("Plotting", 0), ("Saving as PNG", 1), ("PostScript", 2)])
    (folder / "files.md").write_text(GUIDE)
    with LiveServer(create_app(settings, runtime=runtime)) as server:
        wait_ready(server.url, timeout=300)  # the question tower's ONNX export, once per session
        with Client(server.url, api_key=KEY) as dpr:
            for file in sorted(folder.iterdir()):
                assert dpr.wait(dpr.upload(file), timeout=120).state == "done"
            assert dpr.wait(dpr.ingest(RECORDS), timeout=120).documents == 2
        env = {"DPR_API_URL": server.url, "DPR_API__API_KEY": KEY}
        yield Served(server.url, env, folder)


@pytest.fixture
def environment(served: Served, monkeypatch: pytest.MonkeyPatch) -> Served:
    for name, value in served.env.items():
        monkeypatch.setenv(name, value)
    return served


def test_the_client_finds_the_page_and_the_heading(environment: Served) -> None:
    with Client() as dpr:
        hit = dpr.search("How do I save a plot as a PNG image?", k=3).hits[0]
        assert (hit.doc_id, hit.page, hit.format) == ("gnuplot.pdf", 2, "pdf") and "p. 2" in hit.citation()
        assert hit.model == dpr.status().model  # the passage tower's fingerprint
        hit = dpr.search("read a text file line by line", k=1, mode="hybrid").hits[0]
        assert hit.heading == ["Reading files", "Line by line"] and hit.format == "md"
        assert [h.doc_id for h in dpr.search("animals", filters={"topic": "animals"}).hits] == ["cats"]

    async def both() -> list[list[str]]:
        async with AsyncClient() as dpr:
            answers = await asyncio.gather(dpr.search("longest river in Africa", k=1),
                                           dpr.search("cats purr", k=1))
        return [[h.doc_id for h in a.hits] for a in answers]

    assert asyncio.run(both()) == [["nile"], ["cats"]]


class Recording(httpx.HTTPTransport):
    def __init__(self) -> None:
        super().__init__()
        self.statuses: list[int] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        self.statuses.append(response.status_code)
        return response


def test_a_real_429_is_retried_after_its_retry_after(served: Served) -> None:
    with Client(served.url, api_key=KEY) as admin:
        token = admin.create_key("read", name="slow", rate=2.0).token  # burst 1: the second call waits
    transport = Recording()
    with Client(served.url, api_key=token, transport=transport) as slow:
        for _ in range(3):
            assert slow.search("river", k=1).hits
    assert 429 in transport.statuses and transport.statuses.count(200) == 3
    with Client(served.url, api_key=token, retry=Retry(attempts=0)) as impatient:
        with pytest.raises(RateLimited, match="rate") as refused:
            for _ in range(3):
                impatient.search("river", k=1)
    assert refused.value.status == 429 and refused.value.retry_after is not None


class TestLangChainStandard(RetrieversIntegrationTests):
    """LangChain's own retriever tests: k from the constructor and from invoke, sync and async."""

    url = ""

    @pytest.fixture(autouse=True)
    def _server(self, served: Served) -> None:
        type(self).url = served.url

    @property
    def retriever_constructor(self) -> type[BaseRetriever]:
        from dpr_client.langchain import DprRetriever

        return DprRetriever

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        return {"url": self.url, "api_key": KEY}

    @property
    def retriever_query_example(self) -> str:
        return "How do I save a plot as a PNG image?"


# The standard async test carries no marker (LangChain runs its suite in asyncio's auto mode); marked in place, since
# the suite refuses a subclass that overrides one of its tests.
pytest.mark.asyncio(RetrieversIntegrationTests.test_ainvoke_returns_documents)


def test_langchain_documents_carry_the_place(served: Served) -> None:
    from dpr_client.langchain import DprRetriever

    retriever = DprRetriever(url=served.url, api_key=KEY, k=1, mode="hybrid")
    doc = retriever.invoke("save a plot as PNG")[0]
    assert doc.metadata["doc_id"] == "gnuplot.pdf" and doc.metadata["page"] == 2 and doc.metadata["score"] > 0
    assert "PNG" in doc.page_content and doc.metadata["format"] == "pdf" and doc.metadata["model"]
    assert [d.metadata["doc_id"] for d in asyncio.run(retriever.ainvoke("cats", filters={"topic": "animals"}))] == [
        "cats"]


def test_llamaindex_retrieves_nodes_with_scores(served: Served) -> None:
    from dpr_client.llamaindex import DprRetriever

    retriever = DprRetriever(served.url, api_key=KEY, k=2)
    found = retriever.retrieve("read a text file line by line")
    assert found[0].node.metadata["heading"] == ["Reading files", "Line by line"] and found[0].score > 0
    assert len(found) == 2
    again = asyncio.run(retriever.aretrieve("read a text file line by line"))
    assert again[0].node.node_id == found[0].node.node_id


def test_haystack_pipeline_and_its_serialisation(environment: Served) -> None:
    from haystack import Pipeline
    from haystack.components.builders import PromptBuilder

    from dpr_client.haystack import DprRetriever

    pipeline = Pipeline()
    pipeline.add_component("retriever", DprRetriever(environment.url, top_k=1))
    pipeline.add_component("prompt", PromptBuilder("{% for d in documents %}[{{ d.meta.citation }}] {{ d.content }}"
                                                   "{% endfor %}", required_variables=["documents"]))
    pipeline.connect("retriever.documents", "prompt.documents")
    out = pipeline.run({"retriever": {"query": "save a plot as a PNG image"}}, include_outputs_from={"retriever"})
    doc = out["retriever"]["documents"][0]
    assert doc.meta["page"] == 2 and doc.score is not None and "p. 2" in out["prompt"]["prompt"]
    data = pipeline.to_dict()
    assert KEY not in repr(data)  # the key is an environment variable's name, never its value
    again = Pipeline.from_dict(data, allowed_modules=["dpr_client.haystack"])
    assert again.run({"retriever": {"query": "save a plot as a PNG image", "top_k": 2}})["prompt"]["prompt"].count(
        "[") == 2
    component = DprRetriever.from_dict(DprRetriever(environment.url, top_k=3, mode="dense").to_dict())  # its own
    assert (component.top_k, component.mode) == (3, "dense")
    assert asyncio.run(component.run_async("cats", filters={"topic": "animals"}))["documents"][0].meta["doc_id"] == (
        "cats")


def test_mcp_over_stdio(served: Served, tmp_path: Path) -> None:
    from mcp.client import Client as McpClient
    from mcp.client.stdio import StdioServerParameters

    with Client(served.url, api_key=KEY) as admin:
        reader = admin.create_key("read", name="agent").token
    (tmp_path / "new.md").write_text("# Danube\n\nThe Danube flows east into the Black Sea.\n")

    def session(key: str) -> McpClient:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DPR_")} | served.env | {"DPR_API__API_KEY": key}
        return McpClient(StdioServerParameters(command=DPR, args=["mcp"], env=env), raise_exceptions=False)

    async def agent() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with session(reader) as mcp:
            seen["tools"] = sorted(t.name for t in (await mcp.list_tools()).tools)
            seen["search"] = await mcp.call_tool("search", {"question": "save a plot as a PNG image", "k": 2})
            seen["passages"] = await mcp.call_tool("passages", {"doc_id": "files.md"})
            seen["status"] = await mcp.call_tool("status", {})
            seen["bad"] = await mcp.call_tool("search", {"question": "x", "k": 0})
            seen["refused"] = await mcp.call_tool("ingest", {"path": str(tmp_path)})
        async with session(KEY) as mcp:
            seen["ingest"] = await mcp.call_tool("ingest", {"path": str(tmp_path)})
            seen["after"] = await mcp.call_tool("search", {"question": "Which river flows into the Black Sea?",
                                                           "k": 1})
        return seen

    seen = asyncio.run(agent())
    assert seen["tools"] == ["ingest", "passages", "search", "status"]
    first = seen["search"].structured_content["results"][0]
    assert first["doc_id"] == "gnuplot.pdf" and first["page"] == 2 and "p. 2" in first["citation"]
    passages = seen["passages"].structured_content["passages"]
    assert [p["chunk_index"] for p in passages] == sorted(p["chunk_index"] for p in passages) and passages
    assert seen["status"].structured_content["points"] > 0
    assert seen["bad"].is_error and "k" in seen["bad"].content[0].text
    assert seen["refused"].is_error and "write" in seen["refused"].content[0].text
    assert not seen["ingest"].is_error and seen["ingest"].structured_content["jobs"][0]["state"] == "done"
    assert seen["after"].structured_content["results"][0]["doc_id"] == "new.md"
    assert "Traceback" not in str(seen)


def test_mcp_over_streamable_http_forwards_each_callers_key(served: Served, tmp_path: Path) -> None:
    import httpx2
    from mcp.client import Client as McpClient
    from mcp.client.streamable_http import streamable_http_client

    with Client(served.url, api_key=KEY) as admin:
        reader = admin.create_key("read", name="remote agent").token
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPR_")} | {"DPR_API_URL": served.url}
    log = tmp_path / "mcp.log"
    with open(log, "wb") as out:  # no key of its own: each caller brings one
        process = subprocess.Popen([DPR, "mcp", "--transport", "http", "--port", str(port)], env=env, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_port(port, process, log)

        async def call(key: str | None, tool: str, arguments: dict[str, Any]) -> Any:
            headers = {} if key is None else {"X-API-Key": key}
            async with httpx2.AsyncClient(headers=headers) as http:
                transport = streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http)
                async with McpClient(transport, raise_exceptions=False) as mcp:
                    return await mcp.call_tool(tool, arguments)

        found = asyncio.run(call(reader, "search", {"question": "save a plot as a PNG image", "k": 1}))
        assert found.structured_content["results"][0]["page"] == 2
        refused = asyncio.run(call(reader, "ingest", {"path": str(served.folder)}))
        assert refused.is_error and "write" in refused.content[0].text
        anonymous = asyncio.run(call(None, "status", {}))
        assert anonymous.is_error and "key" in anonymous.content[0].text.lower()
        assert not asyncio.run(call(KEY, "status", {})).is_error
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(30)


def wait_port(port: int, process: subprocess.Popen[bytes], log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"dpr mcp exited with {process.returncode}:\n{log.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _examples() -> list[str]:
    text = (REPO / "docs" / "integrations.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


@pytest.mark.parametrize("index", range(len(_examples())))
def test_the_docs_examples_run(served: Served, index: int, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPR_")} | served.env
    script = tmp_path / "example.py"
    script.write_text(_examples()[index])
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
