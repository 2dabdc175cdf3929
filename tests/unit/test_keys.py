"""Keys with a role, stored hashed, changed without a restart; the access gate's decisions; the rate limiter; the
audit log; `dpr keys` / `dpr audit`; `dpr serve` locked by default. The API through TestClient (no sockets)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from kit.fakes import FakeRuntime
from kit.policy import make_settings
from test_api_routes import DOCS, assert_error, ingest
from typer.testing import CliRunner

from entrypoints.api.app import create_app
from entrypoints.cli.main import app as cli
from entrypoints.cli.serve import is_loopback
from services.access import AccessGate, AuditLog, KeyStore, KeyStoreError, RateLimiter, allows, keys_path
from services.core.settings import ApiSettings

pytestmark = pytest.mark.unit


# --- the store -----------------------------------------------------------------------------------------------------


def test_a_key_is_stored_hashed_and_shown_once(tmp_path: Path) -> None:
    store = KeyStore(keys_path(tmp_path))
    assert not store.exists()
    key, token = store.create("read", ["passages"], name="alice")
    text = (tmp_path / "keys.json").read_text()
    secret = token.split("_", 2)[2]  # dpr_ID_SECRET; the secret may itself hold "_"
    assert token not in text and secret not in text  # only the digest is on disk
    assert key.hash in text and key.hash.startswith("sha256:")
    assert (tmp_path / "keys.json").stat().st_mode & 0o777 == 0o600
    assert store.authenticate(token) == key
    assert store.authenticate(token + "x") is None
    assert store.authenticate(token.replace(key.id, "000000000000")) is None
    assert store.authenticate("") is None and store.authenticate("dpr_nonsense") is None
    assert [k.id for k in store.keys()] == [key.id] and store.keys()[0].collections == ("passages",)


def test_a_revoked_key_is_refused_by_a_reader_that_loaded_it_before(tmp_path: Path) -> None:
    writer, reader = KeyStore(keys_path(tmp_path)), KeyStore(keys_path(tmp_path))  # the CLI and a running server
    key, token = writer.create("write")
    assert reader.authenticate(token) is not None
    second, token2 = writer.create("admin")
    assert reader.authenticate(token2) == second  # a key added while serving works at once
    revoked = writer.revoke(key.id)
    assert revoked.revoked and not revoked.active
    assert reader.authenticate(token) is None  # refused from the next call, no restart
    assert reader.authenticate(token2) is not None
    assert [k.id for k in reader.keys()] == [key.id, second.id]  # a revoked key stays listed


def test_bad_requests_and_a_corrupt_file_name_the_fix(tmp_path: Path) -> None:
    store = KeyStore(keys_path(tmp_path))
    with pytest.raises(KeyStoreError, match="unknown role 'root'"):
        store.create("root")
    with pytest.raises(KeyStoreError, match="collection name"):
        store.create("read", ["a/b"])
    with pytest.raises(KeyStoreError, match="no key 'nope'.*dpr keys list"):
        store.revoke("nope")
    (tmp_path / "keys.json").write_text("{not json")
    with pytest.raises(KeyStoreError, match="cannot read the keys file"):
        store.authenticate("dpr_000000000000_" + "a" * 40)


def test_roles_are_ordered() -> None:
    assert allows("admin", "write") and allows("write", "read") and allows("read", "read")
    assert not allows("read", "write") and not allows("write", "admin")


# --- the rate limiter and the audit log ----------------------------------------------------------------------------


def test_a_token_bucket_per_key() -> None:
    now = [0.0]
    limiter = RateLimiter(rate=2.0, burst=3, clock=lambda: now[0])
    assert [limiter.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]  # the burst
    assert limiter.take("a") == pytest.approx(0.5)  # one token comes back every 1/rate s
    assert limiter.take("b") == 0.0  # another key has its own bucket
    now[0] += 0.5
    assert limiter.take("a") == 0.0 and limiter.take("a") > 0
    assert limiter.take("slow", rate=0.5) == 0.0  # a key's own rate (burst scaled: 3 * 0.5 / 2 -> 1)
    assert limiter.take("slow", rate=0.5) == pytest.approx(2.0)
    assert RateLimiter(rate=None, burst=1).take("any") == 0.0  # no default rate: unlimited unless the key has one


def test_the_audit_log_appends_one_json_line_per_entry(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.log")
    for i in range(5):
        log.append({"action": "DELETE /v1/documents/{doc_id}", "target": {"doc_id": str(i)}, "status": 200})
    with open(tmp_path / "audit.log", "a") as f:
        f.write('{"torn')  # a crash mid-line
    lines = (tmp_path / "audit.log").read_text().splitlines()
    assert len(lines) == 6 and all(json.loads(x)["ts"] for x in lines[:5])
    tail = log.tail(2)
    assert tail[0]["target"] == {"doc_id": "4"} and tail[1] == {"unreadable": '{"torn'}


# --- the gate ------------------------------------------------------------------------------------------------------


def test_the_gate_decides(tmp_path: Path) -> None:
    gate = AccessGate(tmp_path, env_key=None, rate=None)
    assert not gate.locked
    assert gate.decide(None, "admin", "passages", "1.2.3.4").status == 0  # nothing configured: open (loopback)
    key, token = gate.store.create("write", ["passages"], name="ci")
    assert gate.locked
    assert gate.decide(None, "read", "passages", "c").status == 401
    assert gate.decide(b"wrong", "read", "passages", "c").status == 401
    ok = gate.decide(token.encode(), "write", "passages", "c")
    assert ok.status == 0 and ok.principal is not None and ok.principal.id == key.id
    denied = gate.decide(token.encode(), "admin", "passages", "c", action="POST /v1/models/{name}/activate")
    assert denied.status == 403 and "needs role 'admin'" in denied.message and "role 'write'" in denied.message
    other = gate.decide(token.encode(), "read", "other", "c")
    assert other.status == 403 and "'other'" in other.message
    assert gate.decide(token.encode(), "read", None, "c").status == 0  # a route not about a collection
    gate.store.revoke(key.id)
    assert gate.decide(token.encode(), "read", "passages", "c").status == 401


def test_the_env_key_is_an_admin_key(tmp_path: Path) -> None:
    gate = AccessGate(tmp_path, env_key=b"s3cret")
    assert gate.locked
    decision = gate.decide(b"s3cret", "admin", "any", "c")
    assert decision.status == 0 and decision.principal is not None and decision.principal.id == "env"


# --- over HTTP -----------------------------------------------------------------------------------------------------


@pytest.fixture
def keyed(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str], KeyStore]]:
    settings = make_settings(data_dir=tmp_path / "dpr", api=ApiSettings(rate_limit=1000, rate_burst=1000))
    store = KeyStore(keys_path(settings.data_dir))
    tokens = {role: store.create(role, name=f"{role}-key")[1] for role in ("read", "write", "admin")}
    tokens["other"] = store.create("admin", ["elsewhere"], name="other-collection")[1]
    with TestClient(create_app(settings, runtime=FakeRuntime(), warm_model=False)) as c:
        yield c, tokens, store


def _h(token: str) -> dict[str, str]:
    return {"X-API-Key": token}


def test_each_role_does_its_job_and_no_more(keyed: tuple[TestClient, dict[str, str], KeyStore]) -> None:
    c, tokens, _ = keyed
    assert_error(c.post("/v1/search", json={"question": "Nile"}), 401, "unauthorized")
    assert c.get("/healthz").status_code == 200 and c.get("/").status_code == 200  # probes and console: public
    job = ingest(c, DOCS, headers=_h(tokens["write"]))
    assert job["state"] == "done"
    hits = c.post("/v1/search", json={"question": "Nile"}, headers=_h(tokens["read"]))
    assert hits.status_code == 200 and hits.json()["hits"]
    err = assert_error(c.post("/v1/documents", json={"documents": DOCS}, headers=_h(tokens["read"])), 403,
                       "forbidden")
    assert "needs role 'write'" in err["message"] and "role 'read'" in err["message"]
    assert_error(c.delete("/v1/documents/py", headers=_h(tokens["read"])), 403, "forbidden")
    assert c.delete("/v1/documents/py", headers={"Authorization": f"Bearer {tokens['admin']}"}).status_code == 200
    err = assert_error(c.post("/v1/search", json={"question": "Nile"}, headers=_h(tokens["other"])), 403,
                       "forbidden")
    assert "'passages'" in err["message"] and "elsewhere" in err["message"]
    # a collection query parameter the route does not read cannot pick the collection that is checked
    assert_error(c.post("/v1/search?collection=elsewhere", json={"question": "Nile"}, headers=_h(tokens["other"])),
                 403, "forbidden")


def test_whoami_tells_the_console_what_the_key_may_do(keyed: tuple[TestClient, dict[str, str], KeyStore]) -> None:
    c, tokens, _ = keyed
    me = c.get("/v1/whoami", headers=_h(tokens["read"])).json()
    assert me["key"]["role"] == "read" and me["key"]["name"] == "read-key" and me["locked"] is True
    assert me["may"] == {"read": True, "write": False, "admin": False}
    assert tokens["read"] not in json.dumps(me)
    other = c.get("/v1/whoami", headers=_h(tokens["other"])).json()  # not collection-scoped: answers
    assert other["may"] == {"read": False, "write": False, "admin": False}


def test_a_key_revoked_while_serving_is_refused(keyed: tuple[TestClient, dict[str, str], KeyStore]) -> None:
    c, tokens, store = keyed
    assert c.get("/v1/status", headers=_h(tokens["read"])).status_code == 200
    [read] = [k for k in store.keys() if k.role == "read"]
    result = CliRunner().invoke(cli, ["--data-dir", str(store.path.parent), "keys", "revoke", read.id, "--json"])
    assert result.exit_code == 0, result.output
    assert_error(c.get("/v1/status", headers=_h(tokens["read"])), 401, "unauthorized")
    created = CliRunner().invoke(cli, ["--data-dir", str(store.path.parent), "keys", "create", "--role", "read",
                                       "--json"])
    assert c.get("/v1/status", headers=_h(json.loads(created.stdout)["token"])).status_code == 200


def test_write_and_admin_actions_are_audited(keyed: tuple[TestClient, dict[str, str], KeyStore]) -> None:
    c, tokens, store = keyed
    ingest(c, DOCS[:1], headers=_h(tokens["write"]))
    c.delete("/v1/documents/cats", headers=_h(tokens["read"]))  # refused: audited too
    c.delete("/v1/documents/missing", headers=_h(tokens["admin"]))
    c.post("/v1/search", json={"question": "q"}, headers=_h(tokens["read"]))  # a read: not audited
    entries = AuditLog(store.path.parent / "audit.log").tail()
    assert [(e["action"], e["status"], (e["who"] or {}).get("name")) for e in entries] == [
        ("POST /v1/documents", 202, "write-key"),
        ("DELETE /v1/documents/{doc_id:path}", 403, "read-key"),
        ("DELETE /v1/documents/{doc_id:path}", 404, "admin-key"),
    ]
    assert entries[1]["target"] == {"doc_id": "cats"} and entries[1]["collection"] == "passages"
    log_text = (store.path.parent / "audit.log").read_text()
    assert not any(token in log_text for token in tokens.values())  # who = id and name, never the secret
    shown = CliRunner().invoke(cli, ["--data-dir", str(store.path.parent), "audit", "--tail", "2", "--json"])
    assert [e["status"] for e in json.loads(shown.stdout)["entries"]] == [403, 404]


def test_over_its_rate_a_key_gets_429_with_retry_after(tmp_path: Path) -> None:
    settings = make_settings(data_dir=tmp_path / "dpr", api=ApiSettings(rate_limit=0.01, rate_burst=3))
    token = KeyStore(keys_path(settings.data_dir)).create("read")[1]
    other = KeyStore(keys_path(settings.data_dir)).create("read")[1]
    with TestClient(create_app(settings, runtime=FakeRuntime(), warm_model=False)) as c:
        codes = [c.get("/v1/whoami", headers=_h(token)).status_code for _ in range(4)]
        assert codes == [200, 200, 200, 429]
        r = c.get("/v1/whoami", headers=_h(token))
        err = assert_error(r, 429, "rate_limited")
        assert int(r.headers["retry-after"]) >= 1 and "rate limit" in err["message"]
        assert c.get("/v1/whoami", headers=_h(other)).status_code == 200  # per key
        assert c.get("/healthz").status_code == 200  # probes are not limited
        guesses = [c.get("/v1/whoami", headers=_h("guess")).status_code for _ in range(4)]
        assert guesses == [401, 401, 401, 429]  # key guessing is throttled per client


def test_an_unreadable_keys_file_fails_closed(tmp_path: Path) -> None:
    settings = make_settings(data_dir=tmp_path / "dpr")
    settings.data_dir.mkdir(parents=True)
    (settings.data_dir / "keys.json").write_text("{")
    with TestClient(create_app(settings, runtime=FakeRuntime(), warm_model=False)) as c:
        err = assert_error(c.get("/v1/status", headers=_h("x")), 503, "unavailable")
        assert "keys file" in err["message"]
        assert c.get("/healthz").status_code == 200


# --- the CLI ---------------------------------------------------------------------------------------------------------


def test_keys_cli(tmp_path: Path) -> None:
    runner = CliRunner()
    base = ["--data-dir", str(tmp_path)]
    made = runner.invoke(cli, [*base, "keys", "create", "--role", "write", "--collection", "a", "--collection", "b",
                               "--name", "ci", "--json"])
    assert made.exit_code == 0, made.output
    key: dict[str, Any] = json.loads(made.stdout)
    assert key["role"] == "write" and key["collections"] == ["a", "b"] and key["token"].startswith("dpr_")
    plain = runner.invoke(cli, [*base, "keys", "create", "--role", "read"])
    assert plain.exit_code == 0 and plain.stdout.strip().startswith("dpr_")
    # the API's rules for a key (a name, a sane rate) hold on the command line too
    blank = runner.invoke(cli, [*base, "keys", "create", "--role", "read", "--name", "  "])
    assert blank.exit_code == 2 and "--name is blank" in blank.output
    for rate in ("5e-324", "0", "100001"):
        wild = runner.invoke(cli, [*base, "keys", "create", "--role", "read", "--rate", rate])
        assert wild.exit_code == 2 and "0.1 to 100,000" in wild.output, (rate, wild.output)
    listed = json.loads(runner.invoke(cli, [*base, "keys", "list", "--json"]).stdout)
    assert [k["role"] for k in listed["keys"]] == ["write", "read"] and "token" not in json.dumps(listed)
    assert listed["keys"][1]["name"].endswith("(dpr keys create)")  # who made it, when no name was given
    assert "hash" not in json.dumps(listed)
    bad = runner.invoke(cli, [*base, "keys", "create", "--role", "root"])
    assert bad.exit_code == 2 and "use one of read, write, admin" in bad.output
    gone = runner.invoke(cli, [*base, "keys", "revoke", "nope"])
    assert gone.exit_code == 2 and "dpr keys list" in gone.output
    revoked = runner.invoke(cli, [*base, "keys", "revoke", key["id"]])
    assert revoked.exit_code == 0 and "revoked" in revoked.output
    audited = json.loads(runner.invoke(cli, [*base, "audit", "--json"]).stdout)["entries"]
    mine = [e["action"] for e in audited if e["target"].get("key") == key["id"]]
    assert mine == ["dpr keys create", "dpr keys revoke"] and len(audited) == 3  # the plain key's create too


# --- locked by default -----------------------------------------------------------------------------------------------


def test_loopback_addresses() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "", "10.0.0.5", "api.example.com"))


def test_serve_refuses_a_public_address_without_a_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DPR_API__API_KEY", raising=False)
    result = CliRunner().invoke(cli, ["--data-dir", str(tmp_path), "serve", "--host", "0.0.0.0"])
    assert result.exit_code == 2
    assert "refusing to serve on 0.0.0.0 without an API key" in result.output
    assert "DPR_API__API_KEY" in result.output and "--insecure" in result.output


def test_the_thin_client_maps_refusals_to_exit_codes() -> None:
    import httpx

    from dpr_client.errors import error_for
    from entrypoints.cli.client import local_error
    from entrypoints.cli.common import exit_code_for

    def answer(status: int) -> int | None:
        body = {"error": {"type": "x", "message": f"refused with {status}"}}
        return exit_code_for(local_error(error_for(httpx.Response(status, json=body)), "http://dpr"))

    assert (answer(401), answer(403), answer(429)) == (2, 2, 3)  # wrong key / role: configuration; rate: try again


def test_keys_over_http_for_an_unlimited_admin(keyed: tuple[TestClient, dict[str, str], KeyStore]) -> None:
    c, tokens, store = keyed
    assert_error(c.get("/v1/keys", headers=_h(tokens["write"])), 403, "forbidden")
    made = c.post("/v1/keys", json={"role": "read", "name": "dashboard"}, headers=_h(tokens["admin"]))
    assert made.status_code == 201, made.text
    token = made.json()["token"]
    assert c.get("/v1/whoami", headers=_h(token)).json()["key"]["name"] == "dashboard"
    listed = c.get("/v1/keys", headers=_h(tokens["admin"])).json()["keys"]
    assert "dashboard" in [k["name"] for k in listed] and "token" not in json.dumps(listed)
    assert c.delete(f"/v1/keys/{made.json()['id']}", headers=_h(tokens["admin"])).json()["revoked"]
    assert_error(c.get("/v1/whoami", headers=_h(token)), 401, "unauthorized")
    assert_error(c.delete("/v1/keys/nope", headers=_h(tokens["admin"])), 404, "not_found")
    assert_error(c.post("/v1/keys", json={"role": "root"}, headers=_h(tokens["admin"])), 422, "validation")
    # an admin limited to one collection cannot mint itself a key for every collection
    err = assert_error(c.post("/v1/keys", json={"role": "admin", "name": "wider"}, headers=_h(tokens["other"])),
                       403, "forbidden")
    assert "every collection" in err["message"]
    actions = [e["action"] for e in AuditLog(store.path.parent / "audit.log").tail()]
    assert actions.count("POST /v1/keys") == 3 and "DELETE /v1/keys/{key_id}" in actions


def test_a_route_that_takes_a_collection_is_checked_on_it(tmp_path: Path) -> None:
    from fastapi import Query

    from entrypoints.api.auth import requires

    settings = make_settings(data_dir=tmp_path / "dpr")
    store = KeyStore(keys_path(settings.data_dir))
    token = store.create("read", ["docs"])[1]
    app = create_app(settings, runtime=FakeRuntime(), warm_model=False)

    @app.get("/v1/count")  # type: ignore[untyped-decorator]
    @requires("read")
    def count(collection: str = Query("passages")) -> dict[str, str]:  # noqa: B008
        return {"collection": collection}

    @app.get("/v1/c/{collection}/count")  # type: ignore[untyped-decorator]
    @requires("read")
    def count_in(collection: str) -> dict[str, str]:
        return {"collection": collection}

    with TestClient(app) as c:
        assert c.get("/v1/count?collection=docs", headers=_h(token)).status_code == 200
        assert_error(c.get("/v1/count?collection=other", headers=_h(token)), 403, "forbidden")
        assert_error(c.get("/v1/count", headers=_h(token)), 403, "forbidden")  # the server's own: passages
        assert c.get("/v1/c/docs/count", headers=_h(token)).status_code == 200
        assert_error(c.get("/v1/c/other/count", headers=_h(token)), 403, "forbidden")
