"""The sources' schedule where `dpr serve` runs it (the embedded default): a ``SourceScheduler`` over the API's
kind of executor (background, one job at a time) syncs a source that is due, and a change is read on its next run;
the status and /metrics show each source's last sync."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from entrypoints.compose import executor_for
from services.core.settings import Settings
from services.runtime import Runtime
from services.sources.registry import Registry, new_spec
from services.sources.schedule import SourceScheduler, due_sources, sync_due

pytestmark = pytest.mark.integration


def test_due_sources_sync_on_the_serving_runtime(tmp_path: Path) -> None:
    folder, data = tmp_path / "notes", tmp_path / "data"
    folder.mkdir()
    (folder / "boiler.md").write_text("# Boiler\n\nTo reset the boiler, hold the red button for ten seconds.\n")
    registry = Registry(data)
    registry.add(new_spec("notes", str(folder), every_s=60.0))
    registry.add(new_spec("manual", str(folder)))  # no interval: synced only when asked
    assert due_sources(registry) == ["notes"]  # never synced: due now
    with Runtime(Settings(data_dir=data), serialize_store=True) as runtime:
        executor = executor_for(runtime, background=True)  # what `dpr serve` hands its syncs to
        scheduler = SourceScheduler(runtime, lambda: executor, tick_s=0.2).start()
        try:
            last = data / "sources" / "notes" / "last.json"
            deadline = time.monotonic() + 180
            while not (last.exists() and json.loads(last.read_text()).get("outcome") == "ok"):
                assert time.monotonic() < deadline, "the scheduler did not sync the due source"
                time.sleep(0.2)
        finally:
            scheduler.close()
        assert json.loads(last.read_text())["documents"] == 1
        assert not (data / "sources" / "manual" / "last.json").exists()
        assert due_sources(registry) == []  # synced just now: next due in a minute

        (folder / "boiler.md").write_text("# Boiler\n\nBleed the radiators before the winter.\n")
        assert sync_due(runtime, registry, executor, now=time.time() + 61) == {"notes": "ok"}
        assert json.loads(last.read_text())["read"] == ["boiler.md"]
        executor.close()

        # dpr status / GET /v1/status and /metrics show each source's last sync, outcome, counts and next run
        from entrypoints.status import collection_status

        shown = {s["name"]: s for s in collection_status(runtime.settings, runtime.store.info(wait=False),
                                                         runtime.store)["sources"]}
        assert shown["notes"]["last"]["outcome"] == "ok" and shown["notes"]["last"]["changed"] == 1
        assert shown["notes"]["next_run"] and shown["manual"]["next_run"] is None and not shown["manual"]["last"]
    from prometheus_client import CollectorRegistry, generate_latest

    from entrypoints.api.sources_metrics import SourcesCollector

    registry_ = CollectorRegistry()
    registry_.register(SourcesCollector(data))
    scraped = generate_latest(registry_).decode()
    assert 'dpr_source_last_sync_ok{source="notes"} 1.0' in scraped
    assert 'dpr_source_last_sync_items{change="changed",source="notes"} 1.0' in scraped
    assert 'dpr_source_next_run_timestamp_seconds{source="notes"}' in scraped
