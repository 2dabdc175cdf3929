"""The reranker and two-stage training on tiny randomly initialised models (seconds): `dpr train-reranker`'s service
registers a reranker with a card and an ONNX export that reproduces torch; `dpr query --rerank N` on the onnx
backend reranks without importing torch; a recipe's `pretrain` runs both stages and records them."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from kit.tiny_beir import TOPICS, tiny_beir
from kit.tiny_models import tiny_sentence_model

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _long_passage(words: str, j: int) -> str:
    """Passages of ~30 words (the reranker here reads pairs of up to 64 tokens)."""
    w = words.split()
    return (f"{words} fact {j} is noted here. The {w[0]} is studied by many people here. Notes on the {w[1]} follow "
            f"in this part. Then the {w[2]} comes up again in the end.")


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("rerank")
    return tiny_sentence_model(root), tiny_beir(root / "beir", _long_passage), root / "data"


@pytest.fixture(scope="module")
def trained(setup: tuple[Path, Path, Path]):  # type: ignore[no-untyped-def]
    from services.core.settings import Settings
    from services.lab.reranker.recipe import train_reranker_model
    from services.lab.reranker.trainer import RerankConfig
    from services.lab.towers.recipe import TrainingData

    base, beir, data = setup
    settings = Settings(data_dir=data)
    config = RerankConfig(name="rr", max_steps=4, batch_size=4, max_length=64, candidates=6)
    return train_reranker_model(settings, TrainingData(data=beir, dev_queries=4), config, base=str(base))


def test_train_reranker_registers_a_model_with_a_card(trained, setup) -> None:  # type: ignore[no-untyped-def]
    from encoders.registry import ModelNotFound, activate, list_models
    from encoders.towers import model_fingerprint

    _, _, data = setup
    result, card = trained.result, trained.result.card
    assert card["kind"] == "reranker" and card["steps"] == 4 and card["train_seconds"] > 0
    assert card["fingerprint"] == model_fingerprint(result.model_dir)
    assert card["training_data"]["pairs"] == 20 and card["training_data"]["dev_queries"] == 4
    dev = card["dev_metrics"]
    assert dev["first_stage"] == "bm25" and dev["candidates"] == 6 and dev["queries"] == 4
    assert dev["gain"] == pytest.approx(dev["after"]["ndcg@10"] - dev["before"]["ndcg@10"], abs=1e-4)
    assert card["default_on"] == (dev["gain"] > 0) == trained.setting["enabled"]
    by_weight = dev["ndcg@10_by_weight"]  # the reranker's weight is chosen on the dev split, recorded with it
    assert len(by_weight) == 10 and by_weight[f"{dev['weight']:g}"] == max(by_weight.values())
    assert dev["after"]["ndcg@10"] == pytest.approx(by_weight[f"{dev['weight']:g}"], abs=1e-4)
    assert trained.setting["weight"] == dev["weight"]
    assert trained.stored_in is None  # no collection yet: nothing recorded
    assert (result.model_dir / "onnx" / "manifest.json").is_file()
    listed = {e.name: e.summary() for e in list_models(data / "models")}
    assert listed[result.name]["kind"] == "reranker"
    with pytest.raises(ModelNotFound, match="is a reranker"):
        activate(data / "models", result.name)


def test_pointwise_reranker_with_dense_negatives(setup, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`dpr train-reranker --recipe FILE` with ``train.loss = "bce"`` trains on (question, passage, label) rows, a
    batch of questions' rows in mini-batches of rows (gradient accumulation); negatives may come from towers
    (``negatives.source = "dense"``)."""
    from typer.testing import CliRunner

    from entrypoints.cli.main import app
    from services.lab.shared.recipe_files import recipe_text

    base, beir, _ = setup
    recipe = tmp_path / "bce.toml"
    recipe.write_text(recipe_text(
        data={"dev_queries": 4}, dev={"candidates": 6},
        train={"loss": "bce", "max_steps": 2, "batch_size": 4, "mini_batch_size": 5, "max_length": 64},
        negatives={"num_negatives": 2, "source": "dense", "model": str(base), "denoise": 0.95}))
    result = CliRunner().invoke(app, ["--data-dir", str(tmp_path / "data"), "train-reranker", str(beir), "--base",
                                      str(base), "--name", "bce", "--recipe", str(recipe), "--json"])
    assert result.exit_code == 0, result.output
    card = json.loads(result.stdout)["card"]
    assert card["hyperparameters"]["loss"] == "cross_encoder.BinaryCrossEntropyLoss"
    assert card["training_data"]["hard_negatives_per_pair"] == 2
    assert card["training_data"]["mining"]["source"] == "dense" and card["training_data"]["mining"]["denoise"] == 0.95
    assert card["steps"] == 2 and np.isfinite(card["final_loss"])
    assert card["dev_metrics"]["queries"] == 4 and card["dev_metrics"]["candidates"] == 6


def test_onnx_reranker_scores_match_torch(trained, setup) -> None:  # type: ignore[no-untyped-def]
    from encoders.rerank import load_reranker

    _, _, data = setup
    passages = [f"{w} fact {j}" for w in TOPICS for j in range(2)] + ["word " * 300]
    torch_scores = load_reranker("rr", data / "models", "torch").score("what about lava", passages)
    onnx = load_reranker("rr", data / "models", "onnx")
    np.testing.assert_allclose(onnx.score("what about lava", passages, batch_size=5), torch_scores, atol=1e-4)
    int8 = load_reranker("rr", data / "models", "onnx-int8").score("what about lava", passages)
    assert int8.shape == torch_scores.shape and np.isfinite(int8).all()
    assert onnx.manifest["variants"]["onnx"]["agrees_with_torch"]  # type: ignore[attr-defined]


def test_dpr_query_rerank_never_imports_torch(trained, setup, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    base, _, data = setup
    docs = tmp_path / "docs"
    docs.mkdir()
    for t, words in enumerate(TOPICS):
        (docs / f"doc{t}.txt").write_text(f"{words} fact")
    env = {"DPR_DATA_DIR": str(data), "DPR_ENCODER__MODEL": str(base), "DPR_ENCODER__BACKEND": "onnx",
           "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "DPR_COLLECTION": "tiny"}
    run = [sys.executable, "-m", "entrypoints.cli.main"]
    subprocess.run([*run, "ingest", str(docs), "--json"], env=env, check=True, capture_output=True, timeout=300)
    probe = (
        "import sys\nfrom entrypoints.cli.main import app\n"
        "for n in ('5', '0'):\n"
        "    try:\n        app(['query', 'what about lava', '--json', '-k', '3', '--rerank', n])\n"
        "    except SystemExit as e:\n        assert not e.code, e.code\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', "
        "'sentence_transformers')))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    reranked, plain = json.loads(lines[0]), json.loads(lines[1])
    assert len(reranked) == 3 and all("rerank_score" in h for h in reranked)
    scores = [h["rerank_score"] for h in reranked]
    assert scores == sorted(scores, reverse=True)
    assert len(plain) == 3 and all("rerank_score" not in h for h in plain)
    assert lines[2] == "[]"


def test_pretrain_runs_both_stages_and_base_continues(setup, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from encoders.towers import model_fingerprint, read_model_card
    from services.core.settings import Settings
    from services.lab.towers.recipe import TrainingData, train_model
    from services.lab.towers.trainer import TrainConfig

    base, beir, _ = setup
    settings = Settings(data_dir=tmp_path / "data")
    config = TrainConfig(name="two", max_steps=2, batch_size=4, max_query_tokens=32, max_passage_tokens=64)
    data = TrainingData(data=beir, dev_queries=4, pretrain="both", pretrain_max_pairs=12)
    result = train_model(settings, data, config, base=str(base))
    stages = read_model_card(result.model_dir)["stages"]
    assert [s["stage"] for s in stages] == ["pretrain", "finetune"]
    assert stages[0]["data"]["self_supervised"] == "both" and stages[0]["data"]["pairs"] == 12
    assert stages[1]["data"]["pairs"] == 20 and stages[1]["model"] == result.name
    assert all(s["steps"] == 2 and s["train_seconds"] > 0 and s["peak_rss_mib"] > 0 for s in stages)
    assert result.card["base"]["path"] == str(settings.models_dir / stages[0]["model"])
    # --base an earlier model: its two towers go on (no Router inside a Router)
    again = train_model(settings, TrainingData(data=beir, dev_queries=4), config, base=result.name)
    assert [type(m).__name__ for m in again.model] == ["Router", "Normalize"]
    assert again.card["base"]["fingerprint"] == result.fingerprint
    # `dpr train-reranker --base <towers>`: the reranker's encoder starts as the towers' passage tower
    from services.lab.reranker.recipe import train_reranker_model
    from services.lab.reranker.trainer import RerankConfig

    rr = train_reranker_model(settings, TrainingData(data=beir, dev_queries=4),
                              RerankConfig(name="rrtowers", max_steps=1, batch_size=4, max_length=64, candidates=6),
                              base=result.name)
    started = Path(rr.result.card["base"]["path"])
    assert started.parent == result.model_dir and started.name.startswith("document_")
    assert rr.result.card["base"]["fingerprint"] == model_fingerprint(started) != model_fingerprint(base)
    assert rr.result.card["base"]["head"] == "fresh 1-logit classifier"
    # `dpr train-reranker --base <a reranker>`: that reranker goes on, its trained head included
    more = train_reranker_model(settings, TrainingData(data=beir, dev_queries=4),
                                RerankConfig(name="rrmore", max_steps=1, batch_size=4, max_length=64, candidates=6),
                                base=rr.result.name)
    assert more.result.card["base"]["path"] == str(rr.result.model_dir)
    assert more.result.card["base"]["fingerprint"] == model_fingerprint(rr.result.model_dir)
    assert more.result.card["base"]["head"].startswith("continued")


def test_dense_second_round_negatives_and_denoising(setup, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Recipe negatives.source = "dense", denoise = F: negatives ranked by the starting towers, none of them labelled
    relevant, none scored at F x the positive or above; the card says which towers mined them."""
    from services.core.settings import Settings
    from services.lab.shared.mining import DenseIndex, MiningConfig
    from services.lab.towers.recipe import TrainingData, _mining_towers, build_training_set, train_model
    from services.lab.towers.trainer import TrainConfig

    base, beir, _ = setup
    settings = Settings(data_dir=tmp_path / "data")
    towers = _mining_towers(settings, str(base))  # the backend mining runs on: near-ties rank alike
    mining = MiningConfig(num_negatives=2, rank_end=8, source="dense", model=str(base))
    plain = build_training_set(settings, TrainingData(data=beir, dev_queries=4, mining=mining))
    assert plain.info["mining"]["source"] == "dense" and "bm25" not in plain.info["mining"]
    assert plain.info["mining"]["model_fingerprint"] == towers.fingerprint
    scorer = DenseIndex(list(plain.corpus.values()), towers)
    corpus_ids = {d.passage: i for i, d in plain.corpus.items()}
    for pair in plain.pairs:  # the towers' top 2 that are not labelled relevant
        ranked = [d for d, _ in scorer.search([pair.question], k=8)[0] if d not in pair.relevant_ids]
        assert [corpus_ids[n] for n in pair.negatives] == ranked[:2]
    denoised = build_training_set(settings, TrainingData(data=beir, dev_queries=4, mining=replace(
        mining, denoise=0.99)))
    assert denoised.info["mining"]["denoise"] == 0.99
    for pair in denoised.pairs:  # exactly: the towers' ranking, minus the relevant, minus those at the ceiling
        ceiling = 0.99 * scorer.scores([pair.question], [pair.positive])[0]
        ranked = [d for d, s in scorer.search([pair.question], k=8)[0] if d not in pair.relevant_ids and s < ceiling]
        assert [corpus_ids[n] for n in pair.negatives] == ranked[:2]
    config = TrainConfig(name="ance", max_steps=1, batch_size=4, max_query_tokens=32, max_passage_tokens=64)
    result = train_model(settings, TrainingData(data=beir, dev_queries=4, mining=MiningConfig(
        num_negatives=1, source="dense")), config, base=str(base))  # the model defaults to --base
    assert result.card["training_data"]["mining"]["model"] == str(base)
