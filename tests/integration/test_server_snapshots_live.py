"""Server snapshots against a real Qdrant server (runs only with QDRANT_URL=http://host:6333; skipped otherwise: no
server binary installs here). The unit tests (tests/unit/test_server_snapshots.py) check the same calls against a
recording fake; this checks that a real server agrees: its snapshot is deleted after the download, the download
matched the server's size and checksum, a corrupt archive never reaches the server, and a restore answers as
before."""

from __future__ import annotations

import json
import os
import tarfile
import uuid
from pathlib import Path
from typing import Any

import pytest
from kit.fakes import ingest_items

from services.core.errors import SnapshotError
from services.core.settings import Settings
from services.ops.snapshots import create_snapshot, restore_snapshot
from services.query import QueryOptions
from services.readers import Document
from services.runtime import Runtime

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not os.environ.get("QDRANT_URL"), reason="needs a Qdrant server: set QDRANT_URL")]

TEXTS = ["Rivers carry sediment from the mountains to the sea.", "Cells divide by mitosis into two daughter cells.",
         "Glaciers carve U-shaped valleys into rock.", "Enzymes lower the activation energy of reactions.",
         "Sea level rises as land ice melts.", "Mitochondria produce most of the cell's ATP."]
QUESTIONS = ["what do rivers carry", "how do cells divide", "why does the sea level rise"]


def _answers(runtime: Runtime) -> dict[str, Any]:
    return {f"{mode}:{q}": [(h.passage.doc_id, round(h.score, 5)) for h in
                            runtime.search(q, QueryOptions(k=3, mode=mode))]  # type: ignore[arg-type]
            for mode in ("dense", "sparse") for q in QUESTIONS}


def test_a_real_server_snapshot_is_checked_cleaned_up_and_restores_as_before(tmp_path: Path, base_towers: Any
                                                                             ) -> None:
    name = f"snap{uuid.uuid4().hex[:8]}"
    settings = Settings(data_dir=tmp_path / "d", qdrant_url=os.environ["QDRANT_URL"], collection=name,
                        encoder={"backend": "torch"})
    with Runtime(settings, towers=base_towers) as runtime:
        ingest_items(runtime.pipeline, [Document(doc_id=f"d{i}", text=t) for i, t in enumerate(TEXTS)])
        before = _answers(runtime)
        engine = runtime.store.engine  # type: ignore[attr-defined]
        made = create_snapshot(settings, engine)
        generation = made["generation"]
        assert engine.client.list_snapshots(generation) == []  # deleted on the server after the download
        with tarfile.open(made["snapshot"]) as tar:
            member = tar.extractfile("data/server.json")
            assert member is not None
            record = json.loads(member.read())
        assert record["points"] == made["points"] == runtime.store.count() and len(record["sha256"]) == 64
        engine.client.delete_alias(alias_name=name)
        engine.client.delete_collection(generation)
        collections = {c.name for c in engine.client.get_collections().collections}

    corrupt = tmp_path / Path(made["snapshot"]).name
    data = bytearray(Path(made["snapshot"]).read_bytes())
    data[len(data) // 2] ^= 0x01
    corrupt.write_bytes(bytes(data))
    with pytest.raises(SnapshotError):
        restore_snapshot(corrupt, settings)
    restore_snapshot(Path(made["snapshot"]), settings)
    with Runtime(settings, towers=base_towers) as runtime:
        engine = runtime.store.engine  # type: ignore[attr-defined]
        assert {c.name for c in engine.client.get_collections().collections} == collections | {generation}
        assert runtime.store.count() == made["points"]
        assert _answers(runtime) == before
        engine.client.delete_alias(alias_name=name)
        engine.client.delete_collection(generation)
