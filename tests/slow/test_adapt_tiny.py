"""`dpr adapt` on a tiny generated corpus with a tiny randomly initialised model (seconds): every stage runs and
writes its output, the card records the recipe, the teacher and the dev figures, the corpus folder's queries and
qrels are never opened (an audit hook records every file the process opens), a re-run resumes from the last
finished stage, and a run without a dev gain leaves the active model alone."""

from __future__ import annotations

import json
import random
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from kit.tiny_models import tiny_sentence_model

pytestmark = pytest.mark.slow

TOPICS = {
    "volcano": "lava magma eruption crater ash basalt vent plume",
    "glacier": "ice snow melt valley moraine crevasse firn calving",
    "desert": "sand dune heat cactus dry oasis mirage dust",
    "ocean": "wave salt tide reef whale current trench kelp",
    "forest": "tree leaf moss fern canopy bark root fungus",
    "city": "street tower traffic subway crowd bridge market tram",
}
OPENED: list[str] = []
RECORDING = {"on": False}


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if RECORDING["on"] and event == "open" and isinstance(args[0], str | Path):
        OPENED.append(str(args[0]))


sys.addaudithook(_audit)  # audit hooks cannot be removed: it records only while RECORDING is on


def _corpus(root: Path) -> Path:
    """A BEIR folder: 60 documents (titles, bodies of four sentences) plus queries and qrels that adapt must not
    open."""
    rng = random.Random(7)
    root.mkdir(parents=True)
    with open(root / "corpus.jsonl", "w") as f:
        for t, (topic, vocab) in enumerate(TOPICS.items()):
            words = vocab.split()
            for j in range(10):
                pick = rng.sample(words, 4)
                sentences = [f"The {topic} study {j} looks at {' and '.join(rng.sample(words, 3))} closely."
                             for _ in range(4)]
                f.write(json.dumps({"_id": f"d{t}-{j}", "title": f"{topic.title()} {pick[0]} {pick[1]} note {j}",
                                    "text": " ".join(sentences)}) + "\n")
    (root / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "what about lava"}) + "\n")
    (root / "qrels").mkdir()
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td0-0\t1\n")
    return root


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from encoders.registry import activate
    from services.core.settings import Settings

    root = tmp_path_factory.mktemp("adapt")
    data_dir = root / "data"
    models = data_dir / "models"
    models.mkdir(parents=True)
    shutil.copytree(tiny_sentence_model(root), models / "tinybase")
    activate(models, "tinybase")
    settings = Settings(data_dir=data_dir, encoder={"backend": "torch", "question_backend": "torch"})
    return {"root": root, "data_dir": data_dir, "models": models, "settings": settings,
            "corpus": _corpus(root / "beir")}


def _config(**overrides: Any) -> Any:
    from services.lab.adaptation.recipe import AdaptConfig
    from services.lab.adaptation.teacher import TeacherConfig

    # a random tiny model puts every passage within cosine 0.9 of every other: the duplicate rule is checked on
    # vectors made by hand below, off here
    defaults: dict[str, Any] = dict(base="tinybase", queries=40, teacher=TeacherConfig(duplicate_similarity=1.01),
                                    epochs_grid=(1.0, 2.0), blend_grid=(0.5,), batch_size=8, learning_rate=5e-3,
                                    max_steps_per_epoch=2, max_query_tokens=32, train_passage_tokens=64,
                                    min_gain=-1.0)
    return AdaptConfig(**{**defaults, **overrides})


def _active(models: Path) -> str:
    return (models / "ACTIVE").read_text().strip()


def test_adapt_cli_runs_every_stage_and_never_opens_queries_or_qrels(world: dict[str, Any],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from entrypoints.cli.main import app

    for key, value in (("DPR_ENCODER__BACKEND", "torch"), ("DPR_ENCODER__QUESTION_BACKEND", "torch")):
        monkeypatch.setenv(key, value)
    corpus: Path = world["corpus"]
    OPENED.clear()
    RECORDING["on"] = True
    try:
        result = CliRunner().invoke(app, ["--data-dir", str(world["data_dir"]), "adapt", str(corpus), "--name", "cli",
                                          "--pseudo-queries", "40", "--epochs", "1", "--max-steps-per-epoch", "2",
                                          "--min-gain", "-1", "--json"])  # no --activate: saved, not activated
    finally:
        RECORDING["on"] = False
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["stages"] == {"pseudo-questions": "ran", "mining": "ran", "training": "ran", "dev evaluation": "ran"}
    opened = [Path(p).resolve() for p in OPENED]
    assert (corpus / "corpus.jsonl").resolve() in opened  # the hook sees the reads (this test can fail)
    read_from_folder = {p for p in opened if corpus.resolve() in p.parents}
    assert read_from_folder == {(corpus / "corpus.jsonl").resolve()}, read_from_folder
    assert out["gain_on_dev"] and not out["activated"] and _active(world["models"]) == "tinybase"
    again = CliRunner().invoke(app, ["--data-dir", str(world["data_dir"]), "adapt", str(corpus), "--name", "cli",
                                     "--pseudo-queries", "40", "--epochs", "1", "--max-steps-per-epoch", "2",
                                     "--min-gain", "-1", "--activate", "--json"])
    assert again.exit_code == 0, again.output
    activated = json.loads(again.stdout)
    assert set(activated["stages"].values()) == {"skipped"}  # the same run, resumed
    assert activated["activated"] and _active(world["models"]) == activated["model"]  # min gain -1: any wins
    run_dir = Path(out["run_dir"])
    for name in ("pseudo.json", "mining.json", "training.json", "dev.json", "result.json"):
        assert (run_dir / name).is_file(), name


def test_card_records_recipe_teacher_and_dev_figures(world: dict[str, Any]) -> None:
    from services.lab.adaptation.recipe import adapt

    result = adapt(world["settings"], world["corpus"], _config(name="card"))
    record = result.card["adaptation"]
    assert set(record["recipe"]["pseudo_questions"]) == {"title", "ict"}
    assert record["recipe"]["epochs_grid"] == [1.0, 2.0]
    teacher = record["teacher"]
    assert teacher["name"] == "hybrid-agreement" and teacher["stats"]["pairs"] > 0
    assert teacher["stats"]["negatives"] > 0
    assert set(teacher["stats"]) >= {"dropped_duplicate", "dropped_agreement", "source_top1_hybrid"}
    dev = record["dev"]
    assert set(dev["scores"]) == {"base", "epochs-1", "epochs-2", f"{_best(dev)}-blend-0.5"}
    assert all(set(s) == set(dev["queries"]) for s in dev["scores"].values())
    assert record["chosen"] in dev["scores"] and record["chosen"] != "base"
    assert set(record["stage_seconds"]) == {"pseudo-questions", "mining", "training", "dev evaluation"}
    assert record["peak_rss_mib"] > 0 and record["started_from"]["name"] == "tinybase"
    assert set(record["training"]) == {"epochs-1", "epochs-2"}
    assert result.card["name"] == result.model and (result.model_dir / "modules.json").is_file()
    # every dev pseudo-question's source is held out of training: no training question is a dev question
    mining = json.loads((result.run_dir / "mining.json").read_text())
    pseudo = json.loads((result.run_dir / "pseudo.json").read_text())
    trained = {row["question"] for row in mining["pairs"]}
    held = {pseudo["sets"][k]["queries"][q] for k in pseudo["split"] for q in pseudo["split"][k]["dev"]}
    assert held and not trained & held


def _best(dev: dict[str, Any]) -> str:
    return max(("epochs-1", "epochs-2"), key=lambda k: dev["mean"][k])


def test_a_rerun_resumes_from_the_last_finished_stage(world: dict[str, Any]) -> None:
    from services.lab.adaptation.recipe import adapt

    settings, models = world["settings"], world["models"]
    first = adapt(settings, world["corpus"], _config(name="resume", epochs_grid=(1.0,)))
    assert set(first.stages.values()) == {"ran"}
    mining_bytes = (first.run_dir / "mining.json").read_bytes()
    again = adapt(settings, world["corpus"], _config(name="resume", epochs_grid=(1.0,)))
    assert set(again.stages.values()) == {"skipped"} and again.model == first.model  # nothing saved twice
    # as if killed during training: the later stages' outputs are gone
    for name in ("training.json", "dev.json", "dev.partial.json", "result.json"):
        (first.run_dir / name).unlink(missing_ok=True)
    shutil.rmtree(first.run_dir / "training")
    resumed = adapt(settings, world["corpus"], _config(name="resume", epochs_grid=(1.0,)))
    assert resumed.stages == {"pseudo-questions": "skipped", "mining": "skipped", "training": "ran",
                              "dev evaluation": "ran"}
    assert (first.run_dir / "mining.json").read_bytes() == mining_bytes
    assert resumed.model != first.model and (models / resumed.model).is_dir()
    # other options are another run: nothing of this one is reused
    other = adapt(settings, world["corpus"], _config(name="resume", epochs_grid=(1.0,), seed=5))
    assert other.run_dir != first.run_dir and set(other.stages.values()) == {"ran"}


def test_no_dev_gain_leaves_the_active_model_alone(world: dict[str, Any]) -> None:
    from encoders.registry import activate
    from services.lab.adaptation.recipe import adapt

    models = world["models"]
    activate(models, "tinybase")
    result = adapt(world["settings"], world["corpus"], _config(name="nogain", epochs_grid=(1.0,), min_gain=1.0))
    assert _active(models) == "tinybase"  # unchanged
    assert not result.activated and result.choice is None
    assert (models / result.model / "model_card.json").is_file()  # saved all the same
    assert result.card["adaptation"]["gain_on_dev"] is False


def test_question_only_keeps_the_passage_tower(world: dict[str, Any]) -> None:
    from encoders.registry import activate
    from encoders.towers import passage_fingerprint
    from services.lab.adaptation.recipe import adapt

    models = world["models"]
    activate(models, "tinybase")
    result = adapt(world["settings"], world["corpus"], _config(name="qo", epochs_grid=(1.0,), question_only=True))
    assert result.card["question_only"] is True
    assert passage_fingerprint(result.model_dir) == passage_fingerprint(models / "tinybase")
    assert "-blend-" not in " ".join(result.card["adaptation"]["dev"]["scores"])  # a blend would move passages
    # the dev stage encoded each dev set's passages once, with the start's passage tower: the candidate scored
    # alone, its own passage tower encoding, gives the same figures
    from services.lab.adaptation.mining_stage import pseudo_sets
    from services.lab.adaptation.teacher import load_model
    from services.lab.evaluation.retrieval import evaluate_model_in_memory

    pseudo = json.loads((result.run_dir / "pseudo.json").read_text())
    training = json.loads((result.run_dir / "training.json").read_text())
    scores = result.card["adaptation"]["dev"]["scores"]
    for key, candidate in training["candidates"].items():
        model = load_model(Path(candidate["path"]))
        for kind, dataset in pseudo_sets(pseudo).items():
            if not pseudo["split"][kind]["dev"]:
                continue
            dev = dataset.subset(pseudo["split"][kind]["dev"])
            assert abs(evaluate_model_in_memory(model, dev)["ndcg@10"] - scores[key][kind]) < 1e-3


def test_question_only_recipe_distils_hybrid_search(world: dict[str, Any]) -> None:
    """The --question-only recipe: every training pseudo-question probes the corpus as it is, its source left out of
    its candidates, and the question tower learns the teacher's scores of them."""
    from encoders.registry import activate
    from encoders.towers import passage_fingerprint
    from services.lab.adaptation.recipe import AdaptConfig, adapt

    models = world["models"]
    activate(models, "tinybase")
    config = AdaptConfig.recipe(True, queries=30, name="qod", base="tinybase", epochs_grid=(1.0,), batch_size=8,
                                learning_rate=5e-3, max_steps_per_epoch=2, max_query_tokens=32, min_gain=-1.0)
    assert config.teacher.distill and config.kinds == ("title", "ict", "keywords")
    result = adapt(world["settings"], world["corpus"], config)
    assert passage_fingerprint(result.model_dir) == passage_fingerprint(models / "tinybase")
    teacher = result.card["adaptation"]["teacher"]
    assert teacher["name"] == "hybrid-distillation" and teacher["bm25_weight"] == 0.5
    mining = json.loads((result.run_dir / "mining.json").read_text())
    assert len(mining["soft"]) == len(mining["pairs"]) == teacher["stats"]["pairs"] > 0
    width = teacher["stats"]["candidates_per_probe"]
    assert width == 59  # 60 documents, the source left out: min(2 x 30 + 10, 59)
    for pair, (ids, scores) in zip(mining["pairs"], mining["soft"], strict=True):
        assert len(ids) == len(scores) == width == len(set(ids)) and pair["positive_id"] not in ids
    assert result.card["hyperparameters"]["soft_targets"] == len(mining["pairs"])
    assert "KL" in result.card["adaptation"]["recipe"]["training"]
    assert _active(models) == "tinybase"  # saved, not activated (no --activate)


def test_teacher_drops_duplicates_and_candidates_both_retrievers_put_above_the_source() -> None:
    import numpy as np

    from encoders.data import CorpusDoc, TrainPair
    from services.lab.adaptation.teacher import TeacherConfig, TeacherStats, label_with_teacher, rrf

    corpus = {d: CorpusDoc(d, "", f"text of {d}") for d in ("src", "dup", "both", "bm25only", "other")}
    vectors = np.eye(5, dtype=np.float32)
    vectors[1] = vectors[0]  # "dup" is the source's twin
    row = {d: i for i, d in enumerate(corpus)}
    pair = TrainPair("q", corpus["src"].passage, "src", relevant_ids=frozenset({"src"}))
    bm25 = [["both", "dup", "bm25only", "src", "other"]]
    dense = [["both", "dup", "src", "other", "bm25only"]]
    stats = TeacherStats()
    [labelled] = label_with_teacher([pair], corpus, bm25, dense, vectors, row, TeacherConfig(negatives=2), stats)
    assert labelled.negatives == (corpus["bm25only"].passage, corpus["other"].passage)
    assert stats.dropped_duplicate == 1 and stats.dropped_agreement == 1
    assert rrf([["a", "b"], ["b", "a"]]) == ["a", "b"] and rrf([["a"], ["b", "a"]])[0] == "a"


def test_bad_input_is_one_line_naming_it(world: dict[str, Any], tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from entrypoints.cli.main import app

    runner = CliRunner()
    base = ["--data-dir", str(world["data_dir"]), "adapt"]
    squad = tmp_path / "train.json"
    squad.write_text("{}")
    for args, words in (([str(tmp_path / "missing")], "no such file or folder"),
                        ([str(squad)], "corpus JSONL"),
                        ([str(world["corpus"]), "--format", "squad"], "carries its questions")):
        result = runner.invoke(app, [*base, *args])
        assert result.exit_code != 0 and words in result.output, result.output
        assert "Traceback" not in result.output


def _judge(data_dir: Path, collection: str, questions: int) -> None:
    """``questions`` judged questions: each names its document's title words; that document is relevant, the same
    note of the next topic is not."""
    from services.feedback import FeedbackStore

    topics = list(TOPICS)
    with FeedbackStore.in_data_dir(data_dir) as judgements:
        for n in range(questions):
            t, j = n % len(topics), n // len(topics)
            question = f"{topics[t]} note {j}: {' '.join(TOPICS[topics[t]].split()[j % 8:j % 8 + 2])}"
            judgements.record(collection, question, f"d{t}-{j}", 0, True)
            judgements.record(collection, question, f"d{(t + 1) % len(topics)}-{j}", 0, False)


def test_adapt_feedback_trains_on_judgements_and_chooses_on_held_out_ones(
    world: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`dpr adapt --feedback`: the judged questions are split as the pseudo-questions are; the training share joins
    the pairs (judged-not-relevant passages their negatives), the held-out share alone chooses the model; new
    judgements start a new run; a collection with no judgement of a relevant passage is refused naming it."""
    from typer.testing import CliRunner

    from entrypoints.cli.main import app
    from services.lab.adaptation.recipe import MIN_JUDGED_DEV, adapt

    for key, value in (("DPR_ENCODER__BACKEND", "torch"), ("DPR_ENCODER__QUESTION_BACKEND", "torch"),
                       ("DPR_COLLECTION", "judged")):
        monkeypatch.setenv(key, value)
    data_dir = world["data_dir"]
    runner = CliRunner()
    ingested = runner.invoke(app, ["--data-dir", str(data_dir), "ingest", str(world["corpus"]), "--json"])
    assert ingested.exit_code == 0, ingested.output
    args = ["--data-dir", str(data_dir), "adapt", str(world["corpus"]), "--name", "fb", "--feedback", "--epochs", "1",
            "--pseudo-queries", "40", "--max-steps-per-epoch", "2", "--min-gain", "-1", "--base", "tinybase"]
    refused = runner.invoke(app, args)
    assert refused.exit_code != 0 and "collection 'judged' has no judgement of a relevant passage" in refused.output
    _judge(data_dir, "judged", 36)
    settings = world["settings"].model_copy(update={"collection": "judged"})
    result = adapt(settings, world["corpus"], _config(name="fb", feedback=True, epochs_grid=(1.0,)))
    assert result.stages == {"pseudo-questions": "ran", "feedback": "ran", "mining": "ran", "training": "ran",
                             "dev evaluation": "ran"}
    record = json.loads((result.run_dir / "feedback.json").read_text())
    assert record["judgements"] == 72 and record["questions"] == 36
    assert record["train_questions"] + record["dev_questions"] == 36 and record["dev_questions"] >= MIN_JUDGED_DEV
    held = set(record["dev"]["queries"].values())
    trained = {row["question"] for row in record["pairs"]}
    assert len(held) == record["dev_questions"] and len(trained) == record["train_questions"] and not held & trained
    assert all(len(row["negatives"]) == 1 and row["positive_id"].endswith("#0") for row in record["pairs"])
    # the pool: every judged passage, relevant or not (each note is judged relevant once and not relevant once)
    assert sorted(d[0] for d in record["dev"]["corpus"]) == sorted(f"d{t}-{j}#0" for t in range(6) for j in range(6))
    card = result.card["adaptation"]
    assert card["feedback"] == {k: record[k] for k in ("collection", "judgements", "questions", "train_questions",
                                                        "dev_questions")}
    dev = card["dev"]
    assert dev["gate"] == ["judged"] and dev["queries"]["judged"] == record["dev_questions"]
    assert set(dev["queries"]) == {"title", "ict", "judged"}
    assert dev["mean"]["base"] == dev["scores"]["base"]["judged"]  # the judged questions alone choose
    # the pairs the candidates trained on: the mined pseudo-questions and the judged training share
    mining = json.loads((result.run_dir / "mining.json").read_text())
    trained_card = json.loads((Path(json.loads((result.run_dir / "training.json").read_text())["candidates"]
                                    ["epochs-1"]["path"]) / "model_card.json").read_text())
    data = trained_card["training_data"]
    assert data["pairs"] == len(mining["pairs"]) + len(record["pairs"]) and data["judged_pairs"] == len(record["pairs"])
    again = adapt(settings, world["corpus"], _config(name="fb", feedback=True, epochs_grid=(1.0,)))
    assert set(again.stages.values()) == {"skipped"}  # the same judgements: the same run
    _judge(data_dir, "judged", 37)  # one more judged question: a new run
    monkeypatch.setattr("services.lab.adaptation.recipe.MIN_JUDGED_DEV", 1000)  # too few held out to choose on alone
    more = adapt(settings, world["corpus"], _config(name="fb", feedback=True, epochs_grid=(1.0,)))
    assert more.run_dir != result.run_dir and more.stages["feedback"] == "ran"
    assert more.card["adaptation"]["dev"]["gate"] == ["title", "ict", "judged"]  # then every held-out kind does
