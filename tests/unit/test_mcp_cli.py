"""`dpr mcp`'s own rules, without a server: streamable HTTP beyond loopback only for an API with keys (or
--insecure), as `dpr serve`; an unknown transport is a usage error."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dpr_client.mcp import refuse_open_http
from entrypoints.cli.main import app

pytestmark = pytest.mark.unit


def test_http_beyond_loopback_needs_keys_or_insecure() -> None:
    assert refuse_open_http("127.0.0.1", locked=False, insecure=False) is None
    assert refuse_open_http("::1", locked=False, insecure=False) is None
    assert refuse_open_http("0.0.0.0", locked=True, insecure=False) is None
    assert refuse_open_http("0.0.0.0", locked=False, insecure=True) is None
    refused = refuse_open_http("0.0.0.0", locked=False, insecure=False)
    assert refused is not None and "--insecure" in refused and "DPR_API__API_KEY" in refused


def test_an_unknown_transport_is_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["mcp", "--transport", "sse"])
    assert result.exit_code == 2 and "use stdio or http" in result.stderr
