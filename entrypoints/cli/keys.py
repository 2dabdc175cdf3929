"""`dpr keys create|list|revoke` (API keys with a role, stored hashed in DATA_DIR/keys.json; a running `dpr serve`
sees changes on its next request) and `dpr audit` (the write and admin actions the API logged)."""

from __future__ import annotations

import getpass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from dpr_client.wire import MAX_KEY_RATE, MIN_KEY_RATE
from entrypoints.cli.common import EXIT_USAGE, AsJson, cli_errors, console, emit_json, err_console, fail, get_settings
from services.access import ROLES, AuditLog, KeyStore, audit_path, keys_path

keys_app = typer.Typer(name="keys", help="API keys with a role (read < write < admin): create, list, revoke.",
                       no_args_is_help=True)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _store(ctx: typer.Context) -> KeyStore:
    return KeyStore(keys_path(get_settings(ctx).data_dir))


def _audit(data_dir: Path, action: str, target: dict[str, Any]) -> None:
    """Key changes made on the command line land in the same audit log as the API's admin actions."""
    AuditLog(audit_path(data_dir)).append({"who": {"id": "cli", "name": _user()}, "role": "admin", "action": action,
                                           "target": target, "status": "ok", "client": "cli"})


@keys_app.command("create")
def keys_create(
    ctx: typer.Context,
    role: Annotated[str, typer.Option(help=f"One of {', '.join(ROLES)} (each may do what the ones before may).")],
    collection: Annotated[list[str] | None, typer.Option(
        "--collection", help="Limit the key to this collection (repeat for several); default: every collection.")
    ] = None,
    name: Annotated[str | None, typer.Option(
        help="Who or what holds the key (shown in `dpr keys list` and the audit log); default: who made it, "
             "'USER (dpr keys create)'.")] = None,
    rate: Annotated[float | None, typer.Option(
        help=f"This key's requests per second, {MIN_KEY_RATE:g} to {MAX_KEY_RATE:,.0f} (default "
             "DPR_API__RATE_LIMIT).")] = None,
    as_json: AsJson = False,
) -> None:
    """Create a key and print its token once (only its SHA-256 is stored: a lost token cannot be shown again)."""
    if role not in ROLES:
        fail(f"--role {role!r} is not a role; use one of {', '.join(ROLES)}", code=EXIT_USAGE)
    # the rules the API's POST /v1/keys holds a key to (dpr_client.wire.KeyIn), so a key is the same however made
    if name is not None and not name.strip():
        fail("--name is blank; name who or what holds the key (e.g. --name ci-reader), or leave --name out",
             code=EXIT_USAGE)
    if rate is not None and not MIN_KEY_RATE <= rate <= MAX_KEY_RATE:
        fail(f"--rate {rate:g} is out of bounds; use {MIN_KEY_RATE:g} to {MAX_KEY_RATE:,.0f} requests per second, "
             "or leave it out for DPR_API__RATE_LIMIT", code=EXIT_USAGE)
    if name is None:
        name = f"{_user()} (dpr keys create)"
    store = _store(ctx)
    with cli_errors():
        key, token = store.create(role, collection, name=name, rate=rate)
        _audit(store.path.parent, "dpr keys create", {"key": key.id, "role": key.role, "name": key.name})
    if as_json:
        emit_json(key.to_json() | {"token": token, "file": str(store.path)})
        return
    console.print(token, highlight=False, soft_wrap=True)
    where = ", ".join(key.collections) if key.collections else "every collection"
    err_console.print(f"key {key.id} ({key.role}, {where}) added to {store.path}; the token above is shown once. "
                      "Send it as header 'X-API-Key: TOKEN'.", highlight=False, soft_wrap=True)


@keys_app.command("list")
def keys_list(ctx: typer.Context, as_json: AsJson = False) -> None:
    """Every key (revoked ones too): id, name, role, collections, rate, created, revoked. Never the tokens."""
    store = _store(ctx)
    with cli_errors():
        keys = store.keys()
    if as_json:
        emit_json({"file": str(store.path), "locked": store.exists(), "keys": [k.to_json() for k in keys]})
        return
    if not keys:
        console.print(f"no keys in {store.path}; create one with `dpr keys create --role read`", highlight=False)
        return
    table = Table(title=f"API keys in {store.path}")
    for col in ("id", "name", "role", "collections", "rate", "created", "revoked"):
        table.add_column(col)
    for k in keys:
        table.add_row(k.id, k.name, k.role, ", ".join(k.collections) if k.collections else "all",
                      f"{k.rate:g}/s" if k.rate else "default", k.created, k.revoked or "")
    console.print(table)


@keys_app.command("revoke")
def keys_revoke(
    ctx: typer.Context,
    key_id: Annotated[str, typer.Argument(help="The key's id (`dpr keys list`).")],
    as_json: AsJson = False,
) -> None:
    """Revoke a key: a running server refuses it from its next request (no restart)."""
    store = _store(ctx)
    with cli_errors():
        key = store.revoke(key_id)
        _audit(store.path.parent, "dpr keys revoke", {"key": key.id})
    if as_json:
        emit_json(key.to_json())
        return
    console.print(f"key {key.id} ({key.name or key.role}) revoked at {key.revoked}", highlight=False)


def audit(
    ctx: typer.Context,
    tail: Annotated[int, typer.Option(min=1, help="The last N entries.")] = 20,
    as_json: AsJson = False,
) -> None:
    """The API's audit log (DATA_DIR/audit.log): who did which write or admin action, when, with what outcome."""
    log = AuditLog(audit_path(get_settings(ctx).data_dir))
    entries = log.tail(tail)
    if as_json:
        emit_json({"file": str(log.path), "entries": entries})
        return
    if not entries:
        console.print(f"no audit entries in {log.path}", highlight=False)
        return
    table = Table(title=f"last {len(entries)} entries of {log.path}")
    for col in ("when", "who", "action", "collection", "target", "status"):
        table.add_column(col)
    for e in entries:
        who = e.get("who") or {}
        table.add_row(str(e.get("ts", "")), f"{who.get('id', '-')} {who.get('name', '')}".strip(),
                      str(e.get("action", e.get("unreadable", ""))), str(e.get("collection", "")),
                      " ".join(f"{k}={v}" for k, v in (e.get("target") or {}).items()), str(e.get("status", "")))
    console.print(table)
