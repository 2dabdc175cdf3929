"""The mining stage of `dpr adapt` (``services.lab.adaptation.recipe``): the teacher over the training pseudo-questions,
written to ``mining.json``.

- ``mining_stage`` (full training): hybrid candidates (BM25 + the current towers, RRF) labelled by the
  hybrid-agreement teacher: the source is the positive, high candidates that are not it are hard negatives unless
  they look like false negatives.
- ``distill_stage`` (`--question-only`): every training pseudo-question probes the corpus as it is; its candidates
  and hybrid search's scores of them, the soft targets the question tower learns.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from services.core.errors import ConfigError
from services.core.settings import Settings
from services.lab.shared.stages import StageProgress, write_json

if TYPE_CHECKING:
    from services.lab.adaptation.teacher import TeacherConfig


def pseudo_sets(pseudo: dict[str, Any]) -> dict[str, Any]:
    from services.lab.adaptation.teacher import dataset_from_json

    return {kind: dataset_from_json(row) for kind, row in pseudo["sets"].items()}


def mining_stage(pseudo: dict[str, Any], base_path: Path, teacher: TeacherConfig, language: str | None,
                 run_dir: Path, notify: StageProgress, settings: Settings) -> None:
    """The hybrid-agreement teacher labels each training pseudo-question's candidates (``language``: the BM25
    side's, None to detect it on each pseudo-question set's corpus)."""
    from encoders.data import labelled_pairs
    from services.ingest.language import corpus_language
    from services.lab.adaptation.teacher import (
        TeacherStats,
        dense_rankings,
        label_with_teacher,
        load_model,
        pair_to_json,
    )
    from services.lab.evaluation.retrieval import encode
    from services.lab.shared.mining import BM25Config, BM25Index

    model = load_model(base_path)
    stats = TeacherStats()
    pairs_out: list[dict[str, Any]] = []
    sets = pseudo_sets(pseudo)
    languages: dict[str, str] = {}
    for n, (kind, dataset) in enumerate(sets.items()):
        notify("mining", n, len(sets), f"{kind}: encoding {len(dataset.corpus)} passages")
        pairs = labelled_pairs(dataset.subset(pseudo["split"][kind]["train"]))
        doc_ids = sorted(dataset.corpus)
        docs = [dataset.corpus[d] for d in doc_ids]
        doc_vectors = encode(model, [d.passage for d in docs], "document", settings.encoder.batch_size)
        questions = [p.question for p in pairs]
        question_vectors = encode(model, questions, "query", settings.encoder.batch_size)
        languages[kind] = corpus_language(language, dataset.corpus)
        bm25 = BM25Index(docs, BM25Config.for_language(languages[kind]))
        by_bm25 = [[d for d, _ in hits] for hits in bm25.search(questions, k=teacher.window)]
        by_dense = dense_rankings(question_vectors, doc_vectors, doc_ids, teacher.window)
        before = stats.pairs
        labelled = label_with_teacher(pairs, dataset.corpus, by_bm25, by_dense, doc_vectors,
                                      {d: i for i, d in enumerate(doc_ids)}, teacher, stats)
        stats.by_mode[kind] = stats.pairs - before
        pairs_out += [{"kind": kind, **pair_to_json(p)} for p in labelled]
    if not pairs_out:
        raise ConfigError("no pseudo-question was left for training after holding out the dev slice; the corpus is "
                          "too small (give more documents)")
    write_json(run_dir / "mining.json", {"pairs": pairs_out, "teacher": teacher.describe(),
                                          "stats": stats.to_json(), "language": languages})
    notify("mining", len(sets), len(sets), f"{stats.negatives} hard negatives for {stats.pairs} pseudo-questions")


DISTILL_CHUNK = 256  # probes scored against the whole corpus at a time (two chunk x documents float32 matrices)


def distill_stage(source: Path, pseudo: dict[str, Any], base_path: Path, teacher: TeacherConfig,
                  language: str | None, seed: int, run_dir: Path, notify: StageProgress, settings: Settings) -> None:
    """The distillation teacher: every training pseudo-question probes the corpus as it is (what real questions
    will search); its candidates and hybrid search's scores of them
    (``services.lab.adaptation.teacher.distill_targets``)."""
    import numpy as np

    from encoders.data import labelled_pairs
    from services.ingest.language import corpus_language
    from services.lab.adaptation.teacher import bm25_matrix, distill_targets, distill_width, load_model, pair_to_json
    from services.lab.evaluation.retrieval import encode
    from services.lab.shared.mining import BM25Config, BM25Index
    from services.readers.beir import load_corpus

    corpus = load_corpus(source)
    doc_ids = sorted(corpus)
    if distill_width(teacher, len(doc_ids)) < 2:
        raise ConfigError(f"{source} has {len(doc_ids)} documents: too few to distil a ranking (give at least 3)")
    col = {d: i for i, d in enumerate(doc_ids)}
    probes: list[tuple[str, Any]] = []
    for kind, dataset in pseudo_sets(pseudo).items():
        probes += [(kind, p) for p in labelled_pairs(dataset.subset(pseudo["split"][kind]["train"]))]
    if not probes:
        raise ConfigError("no pseudo-question was left for training after holding out the dev slice; the corpus is "
                          "too small (give more documents)")
    model = load_model(base_path)
    notify("mining", 0, len(probes), f"encoding {len(doc_ids)} passages")
    doc_vectors = encode(model, [corpus[d].passage for d in doc_ids], "document", settings.encoder.batch_size)
    chosen = corpus_language(language, corpus)
    bm25 = BM25Index([corpus[d] for d in doc_ids], BM25Config.for_language(chosen))
    rng = np.random.default_rng(seed)
    soft: list[list[Any]] = []
    moved = 0
    for start in range(0, len(probes), DISTILL_CHUNK):
        chunk = probes[start:start + DISTILL_CHUNK]
        questions = [p.question for _, p in chunk]
        cos0 = encode(model, questions, "query", settings.encoder.batch_size) @ doc_vectors.T  # (chunk, docs)
        sources = [col.get(p.positive_id or "") for _, p in chunk]
        cand, targets = distill_targets(cos0, bm25_matrix(bm25, questions, doc_ids), sources, teacher, rng)
        for row, scores in zip(cand, targets, strict=True):
            soft.append([[doc_ids[int(i)] for i in row], [round(float(x), 5) for x in scores]])
            moved += int(int(np.argmax(scores)) != 0)  # the teacher's best is not the towers' own best
        notify("mining", min(start + DISTILL_CHUNK, len(probes)), len(probes), "hybrid scores of the candidates")
    by_mode: dict[str, int] = {}
    for kind, _ in probes:
        by_mode[kind] = by_mode.get(kind, 0) + 1
    stats = {"pairs": len(probes), "candidates_per_probe": len(soft[0][0]),
             "sources_left_out": sum(1 for _, p in probes if (p.positive_id or "") in col),
             "teacher_changes_top1": round(moved / len(probes), 4), "documents": len(doc_ids),
             "pairs_by_mode": by_mode}
    write_json(run_dir / "mining.json", {"pairs": [{"kind": k, **pair_to_json(p)} for k, p in probes],
                                          "soft": soft, "teacher": teacher.describe(), "stats": stats,
                                          "language": {kind: chosen for kind in by_mode}})
    notify("mining", len(probes), len(probes), f"hybrid scores for {len(probes)} pseudo-questions")
