"""Print the project's frames on the stack at each step of a real `dpr ingest FILE` and a dense `dpr query`: the
walks of docs/architecture.md, shown rather than told (tests/unit/test_architecture_walks.py checks that every
frame the page names is still defined where it says).

    DPR_DATA_DIR=$(mktemp -d) .venv/bin/python scripts/walk_frames.py \
        /usr/share/doc/shared-mime-info/shared-mime-info-spec.pdf

Each step is recorded at its first call: the frames from `dpr`'s entry down to the step's own function, outermost
first, as ``path qualname``. A step that runs on a thread of its own (the in-process executor parses a batch's
files ahead on a pool thread) shows only that thread's frames."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "what is a MIME type glob"


def frames() -> list[str]:
    """``path qualname`` of each project frame on this thread's stack, outermost first (this script's left out)."""
    out = []
    frame = sys._getframe(2)
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if path.is_relative_to(ROOT) and ".venv" not in path.parts and path.parent.name != "scripts":
            out.append(f"{path.relative_to(ROOT)} {frame.f_code.co_qualname}")
        frame = frame.f_back  # type: ignore[assignment]
    return out[::-1]


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    sys.path.insert(0, str(ROOT))
    import encoders.onnx_towers as onnx_towers
    import entrypoints.cli.main as cli
    import services.ingest.chunking as chunking
    import services.ingest.files as files
    import services.store.sparse as sparse
    from services.store.edge.engine import EdgeEngine

    seen: dict[str, list[str]] = {}

    def record(owner: Any, attr: str, step: str) -> None:
        original = getattr(owner, attr)

        def recorded(*args: Any, **kwargs: Any) -> Any:
            code = original.__code__
            seen.setdefault(step, [*frames(), f"{Path(code.co_filename).relative_to(ROOT)} {code.co_qualname}"])
            return original(*args, **kwargs)

        setattr(owner, attr, recorded)

    record(files, "parse_files", "parse (a thread of the executor)")
    record(chunking, "chunk_sections", "chunk")
    record(onnx_towers.OnnxTowers, "encode_documents", "passage tower")
    record(sparse.Bm25Embedder, "embed_document", "BM25")
    record(EdgeEngine, "upsert", "engine write")
    record(onnx_towers.OnnxTowers, "encode_queries", "question tower")
    record(EdgeEngine, "query", "engine search")
    for argv in (["dpr", "ingest", sys.argv[1]], ["dpr", "query", QUESTION, "-k", "1", "--mode", "dense"]):
        sys.argv = argv
        try:
            cli.main()
        except SystemExit as e:
            if e.code:
                return int(e.code)
    for step, stack in seen.items():
        print(f"\n{step}:")
        print("\n".join(f"  {line}" for line in stack))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
