"""The embedding libraries a user would reach for instead of ``dpr ingest``, as one process each over given passages.

Run by ``benchmarks/bench_peers.py`` with the *peers'* venv's python (never the product's: they pin their own
versions), each pointed at one local ONNX export of the product's model (nothing from a model hub):

``peer_embedders.py fastembed PASSAGES.json MODEL_DIR OUT_DIR``: fastembed's ``TextEmbedding`` with the export
registered as a custom model (``add_custom_model``: mean pooling, normalised, ``model.onnx``) and read from
``specific_model_path=MODEL_DIR``; ``embed`` on its defaults (batch 256, ONNX Runtime's threads).
``peer_embedders.py infinity PASSAGES.json MODEL_DIR OUT_DIR``: Infinity's Python API (``AsyncEmbeddingEngine``,
``engine="optimum"``, ``device="cpu"``, mean pooling) on ``model_name_or_path=MODEL_DIR``; every passage handed to
``embed`` at once (its batch handler batches them, 32 at a time by length); its defaults otherwise (warm-up, the
ORTOptimizer pass it caches beside the model).

Each saves ``vectors.npy`` (normalised float32, in the passages' order) and prints JSON: passages, the seconds of
the encoding alone, the seconds to load the model, and the library's version.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")  # Infinity's anonymous usage statistics
os.environ.setdefault("INFINITY_ANONYMOUS_USAGE_STATS", "0")


def fastembed(texts: list[str], model_dir: str) -> tuple[object, float, float, str]:
    import fastembed as fe
    import numpy as np
    from fastembed import TextEmbedding
    from fastembed.common.model_description import ModelSource, PoolingType

    t0 = time.perf_counter()
    TextEmbedding.add_custom_model(model="local/all-MiniLM-L6-v2", pooling=PoolingType.MEAN, normalization=True,
                                   sources=ModelSource(hf="local/all-MiniLM-L6-v2"), dim=384,
                                   model_file="model.onnx")
    model = TextEmbedding("local/all-MiniLM-L6-v2", specific_model_path=model_dir)
    t1 = time.perf_counter()
    vectors = np.stack(list(model.embed(texts)))  # (n, 384)
    return vectors, time.perf_counter() - t1, t1 - t0, fe.__version__


def infinity(texts: list[str], model_dir: str) -> tuple[object, float, float, str]:
    import asyncio

    import infinity_emb
    import numpy as np
    from infinity_emb import AsyncEmbeddingEngine, EngineArgs

    # Infinity 0.0.78 names the ONNX file by the path its glob of the folder returns (the folder's path included),
    # and optimum-onnx 0.1 looks that name up inside the folder: no file is found for any path but "." (the
    # folder as the current directory), so the process runs in the model's folder
    os.chdir(model_dir)

    async def go() -> tuple[object, float, float]:
        t0 = time.perf_counter()
        engine = AsyncEmbeddingEngine.from_args(EngineArgs(model_name_or_path=".", engine="optimum",
                                                           device="cpu", pooling_method="mean"))
        async with engine:
            t1 = time.perf_counter()
            embeddings, _ = await engine.embed(sentences=texts)
            t2 = time.perf_counter()
        return np.stack(embeddings), t2 - t1, t1 - t0  # (n, 384)

    vectors, seconds, load = asyncio.run(go())
    return vectors, seconds, load, infinity_emb.__version__


def main(argv: list[str]) -> int:
    import numpy as np

    peer, passages, model_dir, out = argv
    texts = json.loads(Path(passages).read_text())
    vectors, seconds, load, version = {"fastembed": fastembed, "infinity": infinity}[peer](texts, model_dir)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    np.save(out_dir / "vectors.npy", np.asarray(vectors, dtype=np.float32))
    print(json.dumps({"peer": peer, "version": version, "passages": len(texts), "seconds": seconds,
                      "load_seconds": load}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
