"""Sources as data: the spec a `dpr sources add` records (kinds, intervals, globs, credentials only by name), the
registry under DATA_DIR/sources, and the sync lock that keeps two syncs of one source apart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.core.errors import ConfigError
from services.sources.registry import Registry, SourceNotFound, format_interval, kind_of, new_spec, parse_interval
from services.sources.state import SyncRunning, is_running, sync_lock

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("text", "seconds"), [("15m", 900.0), ("1h", 3600.0), ("90s", 90.0), ("2d", 172800.0),
                                               ("120", 120.0), (None, None), ("", None)])
def test_intervals(text: str | None, seconds: float | None) -> None:
    assert parse_interval(text) == seconds
    if seconds is not None:
        assert parse_interval(format_interval(seconds)) == seconds


@pytest.mark.parametrize("text", ["5x", "-1m", "10s", "m"])
def test_bad_intervals_name_the_fix(text: str) -> None:
    with pytest.raises(ConfigError, match="--every"):
        parse_interval(text)


def test_kinds_by_uri(tmp_path: Path) -> None:
    assert kind_of("s3://bucket/docs") == "s3"
    assert kind_of("git+https://example.org/repo.git") == "git"
    assert kind_of("/srv/repos/manual.git") == "git"
    assert kind_of(str(tmp_path)) == "folder"
    with pytest.raises(ConfigError, match="not a source"):
        kind_of("ftp://example.org/pub")


def test_specs_are_checked(tmp_path: Path) -> None:
    spec = new_spec("docs", str(tmp_path), every_s=900.0, include=("*.md",), exclude=("drafts/*",))
    assert spec.kind == "folder" and spec.uri == str(tmp_path.resolve())
    assert spec.selects("guide/intro.md") and not spec.selects("drafts/a.md") and not spec.selects("a.pdf")
    assert spec.doc_id("guide/intro.md") == "docs/guide/intro.md"
    with pytest.raises(ConfigError, match="no such folder"):
        new_spec("docs", str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="name"):
        new_spec("../etc", str(tmp_path))
    with pytest.raises(ConfigError, match="bucket"):
        new_spec("b", "s3://Not_A_Bucket/x")
    with pytest.raises(ConfigError, match="--branch is for git"):
        new_spec("docs", str(tmp_path), branch="main")
    with pytest.raises(ConfigError, match="go together"):
        new_spec("b", "s3://bucket/x", key_env="MY_KEY")


def test_credentials_are_named_never_stored(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="NAME of an environment variable"):
        new_spec("b", "s3://bucket/x", key_env="AKIA/SECRET+VALUE=", secret_env="S")
    for uri in ("git+https://me:tok3n@example.org/repo.git", "https://me:pw@docs.example.org/guide/"):
        with pytest.raises(ConfigError, match="holds a password") as refused:
            new_spec("r", uri)
        assert "tok3n" not in str(refused.value) and ":pw@" not in str(refused.value)
    registry = Registry(tmp_path)
    registry.add(new_spec("b", "s3://bucket/x", key_env="MY_KEY", secret_env="MY_SECRET"))
    stored = json.loads((tmp_path / "sources" / "b" / "source.json").read_text())
    assert stored["key_env"] == "MY_KEY" and stored["secret_env"] == "MY_SECRET"
    assert registry.get("b").kind == "s3"


def test_registry_add_list_remove(tmp_path: Path) -> None:
    registry = Registry(tmp_path / "data")
    folder = tmp_path / "docs"
    folder.mkdir()
    registry.add(new_spec("docs", str(folder)))
    with pytest.raises(ConfigError, match="exists already"):
        registry.add(new_spec("docs", str(folder)))
    assert [s.name for s in registry.all()] == ["docs"]
    registry.remove("docs")
    assert registry.all() == []
    with pytest.raises(SourceNotFound, match="dpr sources add"):
        registry.get("docs")


def test_a_second_sync_of_one_source_is_refused_naming_the_holder(tmp_path: Path) -> None:
    with sync_lock(tmp_path, "docs"):
        assert is_running(tmp_path)
        with pytest.raises(SyncRunning, match=r"source docs: a sync is already running \(pid \d+"):
            with sync_lock(tmp_path, "docs", wait_s=0.2):
                pass
    assert not is_running(tmp_path)
    with sync_lock(tmp_path, "docs"):  # free again
        pass


def test_the_beat_ticks_for_sources_only_when_one_has_an_interval(tmp_path: Path) -> None:
    from services.core.settings import Settings, SourceSettings
    from workers.beat import beat_schedule

    settings = Settings(data_dir=tmp_path)
    registry = Registry(tmp_path)
    registry.add(new_spec("manual", str(tmp_path)))
    assert beat_schedule(settings) == {}
    registry.add(new_spec("docs", str(tmp_path), every_s=900.0))
    tick = beat_schedule(settings)["dpr-sources-tick"]
    assert tick["task"] == "dpr.sources.tick" and tick["schedule"] == 30.0 and tick["options"]["queue"] == "ingest"
    assert beat_schedule(Settings(data_dir=tmp_path, sources=SourceSettings(tick_seconds=0))) == {}


@pytest.mark.parametrize("host", ["127.0.0.1", "10.1.2.3", "192.168.0.10", "172.16.5.4", "169.254.169.254", "::1",
                                  "fe80::1", "0.0.0.0", "224.0.0.1"])
def test_a_web_source_may_not_reach_private_addresses(host: str) -> None:
    from services.sources.web import Refused, check_host

    with pytest.raises(Refused, match="DPR_SOURCES__ALLOW_PRIVATE_ADDRESSES"):
        check_host(host, allow_private=False)
    check_host(host, allow_private=True)  # the setting allows it (the tests' own servers)


def test_a_public_address_is_reachable() -> None:
    from services.sources.web import check_host

    check_host("93.184.215.14", allow_private=False)  # a literal: resolved without a network
