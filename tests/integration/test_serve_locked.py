"""`dpr serve` as a deployment runs it: locked by default on a public address, keys enforced, slow clients cut.

- without a key on 0.0.0.0 it refuses to start (exit 2, one line naming the fix); ``--insecure`` starts it with a
  warning; with a keys file it starts and asks every /v1 request for a key;
- slowloris: a client that sends its request headers a byte at a time is disconnected by the server before it
  gets through them (DPR_API__HEADER_TIMEOUT), and so is one whose body stalls (DPR_API__BODY_TIMEOUT); a normal
  client on the same server is answered.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from api_server import DPR, ServeProcess, free_port

from services.access import KeyStore, keys_path

pytestmark = pytest.mark.integration


def _env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPR_")}
    env.update({"DPR_DATA_DIR": str(data_dir), "DPR_ENCODER__THREADS": "1", "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1", **extra})
    return env


def _serve_public(env: dict[str, str], root: Path, *extra: str) -> tuple[subprocess.Popen[bytes], int, Path]:
    port = free_port()
    log = root / f"serve-{port}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([DPR, "serve", "--host", "0.0.0.0", "--port", str(port), "--log-level", "warning",
                                    *extra], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                   cwd=root)
    return process, port, log


def _wait_up(process: subprocess.Popen[bytes], port: int, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"dpr serve exited with {process.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"dpr serve did not answer in {timeout} s:\n{log.read_text()}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_a_public_address_needs_a_key_or_insecure(tmp_path: Path) -> None:
    data = tmp_path / "data"
    refused = subprocess.run([DPR, "serve", "--host", "0.0.0.0", "--port", str(free_port())], env=_env(data),
                             capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    lines = [x for x in refused.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "without an API key" in lines[0] and "--insecure" in lines[0], refused.stderr

    process, port, log = _serve_public(_env(data), tmp_path, "--insecure")
    try:
        _wait_up(process, port, log)
        assert "warning: --insecure" in log.read_text()
        assert httpx.get(f"http://127.0.0.1:{port}/v1/whoami", timeout=10).json()["key"]["id"] == "anonymous"
    finally:
        _stop(process)

    token = KeyStore(keys_path(data)).create("read", name="it")[1]
    process, port, log = _serve_public(_env(data), tmp_path)
    try:
        _wait_up(process, port, log)
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{url}/v1/whoami", timeout=10).status_code == 401
        me = httpx.get(f"{url}/v1/whoami", headers={"X-API-Key": token}, timeout=10).json()
        assert me["key"]["role"] == "read"
        denied = httpx.post(f"{url}/v1/documents", json={"documents": []}, headers={"X-API-Key": token}, timeout=10)
        assert denied.status_code == 403 and "needs role 'write'" in denied.json()["error"]["message"]
    finally:
        _stop(process)


@pytest.fixture(scope="module")
def slow_limits_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    root = tmp_path_factory.mktemp("slowloris")
    env = _env(root / "data", DPR_API__HEADER_TIMEOUT="1", DPR_API__BODY_TIMEOUT="1")
    server = ServeProcess(env, root)
    try:
        _wait_up(server.process, server.port, server.log)
        yield server
    finally:
        server.stop()


def _trickle(port: int, payload: bytes, pause: float) -> int:
    """Send ``payload`` one byte per ``pause`` seconds; the number of bytes sent before the server closed the
    connection (len(payload) when it never did)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        for i in range(len(payload)):
            try:
                s.sendall(payload[i:i + 1])
            except (BrokenPipeError, ConnectionResetError):
                return i
            time.sleep(pause)
            s.setblocking(False)
            try:
                if s.recv(1024) == b"":  # the server closed its side
                    return i + 1
            except BlockingIOError:
                pass
            except ConnectionResetError:
                return i + 1
            finally:
                s.setblocking(True)
    return len(payload)


def test_slow_headers_are_cut(slow_limits_server: ServeProcess) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"".join(
        f"X-Pad-{i}: {'a' * 8}\r\n".encode() for i in range(12)) + b"\r\n"
    sent = _trickle(slow_limits_server.port, request, pause=0.1)  # ~24 s for the whole request at this pace
    assert sent < len(request) // 2, f"the server kept a slowloris connection for {sent} of {len(request)} bytes"
    assert httpx.get(f"{slow_limits_server.url}/healthz", timeout=10).status_code == 200  # others still served


def test_a_stalled_body_is_cut(slow_limits_server: ServeProcess) -> None:
    body = b'{"question": "' + b"a" * 200 + b'"}'
    head = (f"POST /v1/search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", slow_limits_server.port), timeout=30) as s:
        s.sendall(head + body[:10])  # then nothing: the server must hang up (a 30 s socket timeout bounds the wait)
        try:
            answer = s.recv(4096)
        except ConnectionResetError:
            answer = b""
        except TimeoutError:
            answer = b"(still open)"
        assert answer == b"", f"the server kept a stalled body's connection: {answer[:200]!r}"


def test_a_normal_client_on_a_keep_alive_connection_is_served(slow_limits_server: ServeProcess) -> None:
    with httpx.Client(base_url=slow_limits_server.url, timeout=10) as client:
        for _ in range(3):
            assert client.get("/healthz").status_code == 200
