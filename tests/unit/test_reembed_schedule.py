"""The beat schedule (off by default), the re-embed check's decision, and the single-beat guard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.core.errors import ConfigError
from services.core.settings import ReembedSettings, Settings
from services.lifecycle import ReembedState, check_needed, save_state
from services.store import Store
from services.store.edge.engine import EdgeEngine
from services.store.points import CollectionSpec
from workers.beat import beat_schedule, run_beat

pytestmark = pytest.mark.unit


def test_the_schedule_is_off_by_default_and_configurable() -> None:
    assert beat_schedule(Settings()) == {}
    entry = beat_schedule(Settings(reembed=ReembedSettings(schedule_seconds=60)))["dpr-reembed-check"]
    assert entry["task"] == "dpr.reembed.check" and entry["schedule"] == 60.0
    assert entry["options"]["queue"] == "reembed" and entry["kwargs"] == {"collection": "passages"}


def test_the_beat_refuses_to_run_without_a_broker_or_a_schedule(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="broker"):
        run_beat(Settings(data_dir=tmp_path, reembed=ReembedSettings(schedule_seconds=5)))
    with pytest.raises(ConfigError, match="SCHEDULE_SECONDS"):
        run_beat(Settings(data_dir=tmp_path, broker_url="redis://127.0.0.1:1/0"))


def fake_model(models_dir: Path, name: str, content: str) -> Path:
    path = models_dir / name
    path.mkdir(parents=True)
    (path / "modules.json").write_text("[]")
    (path / "config.json").write_text(json.dumps({"content": content}))
    return path


def test_the_check_starts_a_reembed_only_when_the_active_model_differs(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    store = Store(EdgeEngine(settings.store_dir, settings.collection, lock_timeout=5, idle_release=0.05))
    try:
        assert check_needed(settings)["needed"] is False  # no collection yet
        store.ensure_collection(CollectionSpec(dim=4, distance="cosine", model="old-model"))
        assert check_needed(settings)["needed"] is True  # the base model is not "old-model"

        fake_model(settings.models_dir, "m1", "one")
        (settings.models_dir / "ACTIVE").write_text("m1\n")
        decision = check_needed(settings)
        assert decision["needed"] is True and decision["model_name"] == "m1"

        # the gate rejected m1 for this source: the beat must not loop on it
        source = store.info().active.name
        target = store.create_generation(CollectionSpec(dim=4, distance="cosine", model=decision["model"]))
        save_state(store, ReembedState(source=source, target=target, model=decision["model"], model_name="m1",
                                       started="t", status="rejected"))
        assert check_needed(settings)["needed"] is False
    finally:
        store.close()


def test_the_finalize_task_may_poll_for_as_long_as_the_batches_take() -> None:
    # Celery's retry(max_retries=None) falls back to the task's max_retries (default 3): the finalize task polls
    # by retrying, so under load it gave up after 3 polls and the re-embed never finished.
    from workers.app import create_app
    from workers.reembed_tasks import FINALIZE_TASK

    app = create_app(Settings(broker_url="redis://127.0.0.1:1/0"))
    assert app.tasks[FINALIZE_TASK].max_retries is None
