"""The sources on ``/metrics``: a collector read at each scrape from the data dir's sources (their last sync's
record, ``services.sources.schedule.sources_status``), so every process serving the data dir reports the same,
whoever ran the sync (this server's schedule, a worker, `dpr sources sync`). Registered by `dpr serve`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

COUNTS = ("added", "changed", "removed", "failed")


class SourcesCollector(Collector):
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from services.sources.schedule import epoch, sources_status

        finished = GaugeMetricFamily("dpr_source_last_sync_timestamp_seconds",
                                     "When each source's last sync ended (Unix time).", labels=["source"])
        ok = GaugeMetricFamily("dpr_source_last_sync_ok", "1 when each source's last sync ended ok, 0 when it failed.",
                               labels=["source"])
        counts = GaugeMetricFamily("dpr_source_last_sync_items", "Items each source's last sync added, changed, "
                                   "removed (documents) or failed.", labels=["source", "change"])
        seconds = GaugeMetricFamily("dpr_source_last_sync_seconds", "How long each source's last sync took.",
                                    labels=["source"])
        next_run = GaugeMetricFamily("dpr_source_next_run_timestamp_seconds",
                                     "When each scheduled source is next due (Unix time).", labels=["source"])
        running = GaugeMetricFamily("dpr_source_running", "1 while a sync of the source runs.", labels=["source"])
        for source in sources_status(self.data_dir):
            name, last = source["name"], source.get("last") or {}
            running.add_metric([name], 1.0 if source.get("running") else 0.0)
            if (due := epoch(source.get("next_run"))) is not None:
                next_run.add_metric([name], due)
            if not last:
                continue
            if (end := epoch(last.get("finished"))) is not None:
                finished.add_metric([name], end)
            ok.add_metric([name], 1.0 if last.get("outcome") == "ok" else 0.0)
            seconds.add_metric([name], float(last.get("seconds") or 0))
            for change in COUNTS:
                counts.add_metric([name, change], float(last.get(change) or 0))
        yield from (finished, ok, counts, seconds, next_run, running)
