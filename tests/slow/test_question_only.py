"""`dpr train --question-only` on a tiny randomly initialised model (seconds): only the question tower learns, the
passage tower stays its partner's byte for byte, the new model carries its partner's passage fingerprint, serves
the partner's stored points at once when activated (no re-embed, no new generation), and rollback is the ACTIVE
pointer. Points of an incompatible passage tower are still refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kit.tiny_beir import TOPICS, tiny_beir
from kit.tiny_models import tiny_sentence_model

from services.lab.shared.recipe_files import recipe_text

pytestmark = pytest.mark.slow

QUESTION = "what about lava"


def _folder(root: Path) -> Path:
    root.mkdir(parents=True)
    for t, words in enumerate(TOPICS):
        (root / f"topic{t}.txt").write_text(f"{words.split()[0].title()}\nA note on {words} and more {words}.\n")
    return root


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A data dir whose active model is a tiny partner (``tinybase``), a question-only model trained from it
    (``qo``), and an incompatible pair: a fully trained model (``full``) and a question-only model of that one."""
    from encoders.registry import activate
    from services.core.settings import Settings
    from services.lab.towers.recipe import TrainingData, train_model
    from services.lab.towers.trainer import TrainConfig

    root = tmp_path_factory.mktemp("qo")
    data_dir = root / "data"
    partner = data_dir / "models" / "tinybase"
    partner.parent.mkdir(parents=True)
    shutil.copytree(tiny_sentence_model(root), partner)
    activate(data_dir / "models", "tinybase")
    settings = Settings(data_dir=data_dir, encoder={"backend": "torch", "question_backend": "torch"})
    beir = tiny_beir(root / "beir")
    what = TrainingData(data=beir, dev_queries=4)
    qo = train_model(settings, what, TrainConfig(name="qo", question_only=True, max_steps=6, batch_size=4,
                                                 learning_rate=5e-3, warmup_ratio=0.0, max_query_tokens=32),
                     base="active")  # the active model is the partner, as `dpr train --question-only` defaults
    full = train_model(settings, what, TrainConfig(name="full", max_steps=2, batch_size=4, learning_rate=5e-3,
                                                   max_query_tokens=32), base="tinybase")
    other = train_model(settings, what, TrainConfig(name="otherqo", question_only=True, max_steps=2, batch_size=4,
                                                    max_query_tokens=32), base=full.name)
    return {"root": root, "data_dir": data_dir, "partner": partner, "settings": settings, "qo": qo, "full": full,
            "other": other, "beir": beir}


def test_question_only_keeps_the_partners_passage_tower_and_fingerprint(world: dict[str, Any]) -> None:
    from safetensors.torch import load_file

    from encoders.towers import SentenceTransformerTowers, model_fingerprint, passage_fingerprint

    qo, partner = world["qo"], world["partner"]
    card = qo.card
    assert card["question_only"] is True and card["steps"] == 6 and np.isfinite(card["final_loss"])
    assert card["partner"]["name"] == "tinybase" and card["partner"]["fingerprint"] == model_fingerprint(partner)
    assert card["training_data"]["passage_table"] == 16  # every corpus passage is a negative: nothing mined
    assert card["dev_metrics"]["before"] is not None and card["dev_metrics"]["after"] is not None
    # the fingerprint rule: its own files differ, its passage fingerprint is the partner's
    assert passage_fingerprint(qo.model_dir) == model_fingerprint(partner) == card["passage_fingerprint"]
    assert model_fingerprint(qo.model_dir) == qo.fingerprint != model_fingerprint(partner)
    # the passage weights are the partner's, tensor for tensor; the question tower moved
    before = load_file(str(partner / "model.safetensors"))
    document = load_file(str(qo.model_dir / "document_0_Transformer" / "model.safetensors"))
    query = load_file(str(qo.model_dir / "query_0_Transformer" / "model.safetensors"))
    assert set(document) == set(before) == set(query)
    for name, tensor in before.items():
        assert np.array_equal(document[name].numpy(), tensor.numpy()), name
    assert any(not np.allclose(query[name].numpy(), tensor.numpy()) for name, tensor in before.items())
    # the towers as the product loads them: same passage vectors, other question vectors, same fingerprint
    mine, theirs = SentenceTransformerTowers(qo.model_dir), SentenceTransformerTowers(partner)
    texts = ["Volcano\nA note on volcano lava magma.", QUESTION]
    np.testing.assert_allclose(mine.encode_documents(texts), theirs.encode_documents(texts), atol=1e-6)
    assert not np.allclose(mine.encode_queries(texts), theirs.encode_queries(texts), atol=1e-4)
    assert mine.fingerprint == theirs.fingerprint and mine.model_fingerprint != theirs.model_fingerprint


def test_settings_that_would_move_the_passage_tower_are_refused(world: dict[str, Any]) -> None:
    from typer.testing import CliRunner

    from entrypoints.cli.main import app

    runner = CliRunner()
    args = ["--data-dir", str(world["data_dir"]), "train", str(world["beir"]), "--question-only", "--recipe"]
    recipe = world["root"] / "refused.toml"
    for tables, message in (({"train": {"max_steps": 1, "shared": True}}, "shared = false"),
                            ({"train": {"max_steps": 1, "blend": 0.5}}, "cannot blend"),
                            ({"train": {"max_steps": 1}, "data": {"pretrain": "ict"}}, "drop one of them")):
        recipe.write_text(recipe_text(**tables))
        refused = runner.invoke(app, [*args, str(recipe)])
        assert refused.exit_code == 2 and message in refused.stderr, refused.output
    gone = runner.invoke(app, [*args[:-1], "--distill", "rr"])  # distillation left the product (research/distillation)
    assert gone.exit_code == 2 and "No such option" in gone.output


def test_a_question_only_model_queries_its_partners_points_and_an_incompatible_tower_is_refused(
    world: dict[str, Any],
) -> None:
    from encoders.registry import model_for_fingerprint
    from encoders.towers import SentenceTransformerTowers, model_fingerprint
    from services.core.errors import ModelMismatch
    from services.query import check_towers
    from services.store.points import CollectionSpec

    partner = world["partner"]
    stored = CollectionSpec(dim=32, distance="cosine", model=model_fingerprint(partner))  # what ingest records
    check_towers(stored, SentenceTransformerTowers(world["qo"].model_dir), "docs")  # its partner's points: served
    check_towers(stored, SentenceTransformerTowers(partner), "docs")
    for incompatible in (world["full"], world["other"]):  # another passage tower, or a question-only model of it
        with pytest.raises(ModelMismatch, match="re-embed"):
            check_towers(stored, SentenceTransformerTowers(incompatible.model_dir), "docs")
    assert world["other"].card["passage_fingerprint"] == world["full"].fingerprint
    # the points' model is the partner: a lookup by their fingerprint finds it, not the question-only model
    assert model_for_fingerprint(stored.model, world["data_dir"] / "models")[1] == "tinybase"


def test_activation_serves_the_stored_points_at_once_and_rollback_is_the_pointer(
    world: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from entrypoints.cli.main import app
    from services.lifecycle.models import check_needed

    for key, value in (("DPR_ENCODER__BACKEND", "torch"), ("DPR_ENCODER__QUESTION_BACKEND", "torch")):
        monkeypatch.setenv(key, value)
    runner = CliRunner()
    data_dir = ["--data-dir", str(world["data_dir"])]
    qo, full = world["qo"], world["full"]

    def run(*args: str) -> Any:
        result = runner.invoke(app, [*data_dir, *args, "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    assert run("models", "activate", "tinybase")["passage_tower"]["same"] is None  # no collection yet
    run("ingest", str(_folder(world["root"] / "docs")))
    generation = run("status")["generation"]
    partner_hits = run("query", QUESTION, "-k", "3", "--mode", "dense")

    listed = {m["name"]: m for m in run("models", "list")["models"]}
    assert listed[qo.name]["question_only"] and listed[qo.name]["partner"] == "tinybase"
    assert not listed[full.name]["question_only"] and listed[full.name]["partner"] is None
    shown = run("models", "show", qo.name)["passage_tower"]
    assert shown["same"] is True and shown["reembed_needed"] is False
    other = run("models", "show", full.name)["passage_tower"]
    assert other["same"] is False and other["reembed_needed"] is True
    human = runner.invoke(app, [*data_dir, "models", "show", qo.name])
    assert "passage tower: same as the stored points of 'passages' — no re-embed" in human.stdout

    activated = run("models", "activate", qo.name)
    assert activated["active"] == qo.name and activated["passage_tower"]["same"] is True
    settings = world["settings"].model_copy(update={"collection": "passages"})
    assert check_needed(settings)["needed"] is False  # the beat starts no re-embed
    qo_hits = run("query", QUESTION, "-k", "3", "--mode", "dense")
    assert run("status")["generation"] == generation  # no new generation: the stored vectors serve
    assert {h["model"] for h in qo_hits} == {h["model"] for h in partner_hits} == {qo.card["passage_fingerprint"]}
    assert [h["score"] for h in qo_hits] != [h["score"] for h in partner_hits]  # the new question tower answered

    run("models", "activate", "tinybase")  # rollback: the pointer
    assert [h["score"] for h in run("query", QUESTION, "-k", "3", "--mode", "dense")] == pytest.approx(
        [h["score"] for h in partner_hits])


def test_train_feedback_learns_from_the_collections_judgements(
    world: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`dpr train --feedback` (with --question-only: no re-embed after it): the judgements stored with the collection
    become pairs, a passage judged relevant the positive and those judged not relevant its negatives."""
    from typer.testing import CliRunner

    from entrypoints.cli.main import app
    from services.feedback import FeedbackStore

    for key, value in (("DPR_ENCODER__BACKEND", "torch"), ("DPR_ENCODER__QUESTION_BACKEND", "torch"),
                       ("DPR_COLLECTION", "judged")):
        monkeypatch.setenv(key, value)
    runner = CliRunner()
    data_dir = ["--data-dir", str(world["data_dir"])]
    assert runner.invoke(app, [*data_dir, "ingest", str(_folder(world["root"] / "judged"))]).exit_code == 0
    unjudged = runner.invoke(app, [*data_dir, "train", "--feedback", "--question-only", "--base", "tinybase"])
    assert unjudged.exit_code != 0 and "no judgement of a relevant passage" in unjudged.stderr, unjudged.output
    with FeedbackStore.in_data_dir(world["data_dir"]) as judgements:
        for t, words in enumerate(TOPICS):
            question = f"tell me about {words.split()[1]}"
            judgements.record("judged", question, f"judged/topic{t}.txt", 0, True)
            judgements.record("judged", question, f"judged/topic{(t + 1) % len(TOPICS)}.txt", 0, False)
    recipe = world["root"] / "fb.toml"
    recipe.write_text(recipe_text(train={"max_steps": 2, "batch_size": 4}))
    trained = runner.invoke(app, [*data_dir, "train", "--feedback", "--question-only", "--base", "tinybase",
                                  "--recipe", str(recipe), "--name", "fb", "--json"])
    assert trained.exit_code == 0, trained.output
    card = json.loads(trained.stdout)["card"]
    assert card["training_data"]["feedback"] == {"collection": "judged", "judgements": 16, "pairs": 8,
                                                 "questions": 8, "judged_negatives": 8}
    assert card["training_data"]["dataset"] == "feedback:judged" and card["question_only"] is True
    assert card["passage_fingerprint"] == world["qo"].card["passage_fingerprint"]
