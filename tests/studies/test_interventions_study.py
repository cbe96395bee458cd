"""The interventions study: table / rows / report / model-card section on a known result, the
demo reading what it writes, the shipped study.json belonging to the shipped weights, and (slow) a
full run of every condition on an untrained model of the embedded architecture."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.models import tiny_vlm
from vlens.studies.interventions import (
    CARD_BEGIN,
    CARD_END,
    StudyResult,
    StudySettings,
    evaluation_sets,
    run_study,
    training_examples,
    write_model_card_section,
)
from vlens.utils.errors import UserInputError


def _known_result() -> StudyResult:
    settings = StudySettings(
        seeds=[0, 1], eval_sets=["synreal", "colour", "shape"], conditions=["baseline", "sft"]
    )
    rows = {
        0: {
            "baseline": {
                "synreal": {"accuracy": 0.5, "mae": 1.0},
                "colour": {"accuracy": 0.9},
                "shape": {"accuracy": 0.7},
            },
            "sft": {
                "synreal": {"accuracy": 0.6, "mae": 0.5},
                "colour": {"accuracy": 0.8},
                "shape": {"accuracy": 0.6},
            },
        },
        1: {
            "baseline": {
                "synreal": {"accuracy": 0.7, "mae": 0.5},
                "colour": {"accuracy": 1.0},
                "shape": {"accuracy": 0.8},
            },
            "sft": {
                "synreal": {"accuracy": 0.8, "mae": 0.25},
                "colour": {"accuracy": 0.8},
                "shape": {"accuracy": 0.6},
            },
        },
    }
    from dataclasses import asdict

    return StudyResult(settings=asdict(settings), results=rows)


def test_table_averages_seeds():
    table = _known_result().table().splitlines()
    assert table[0] == "| method | synreal (counting, not in the SFT data) | colour | shape | general mean |"
    assert table[2] == "| baseline | 60.0 / 0.75 | 95.0 | 75.0 | 85.0 |"
    assert table[3] == "| +SFT | 70.0 / 0.38 | 80.0 | 60.0 | 70.0 |"


def test_rows_average_seeds_and_the_demo_reads_them(tmp_path):
    from vlens.demo.interventions_stage import interventions_section

    result = _known_result()
    assert result.rows() == [
        {"setting": "baseline", "synreal accuracy": pytest.approx(0.6), "synreal MAE": pytest.approx(0.75),
         "colour accuracy": pytest.approx(0.95), "shape accuracy": pytest.approx(0.75)},
        {"setting": "+SFT", "synreal accuracy": pytest.approx(0.7), "synreal MAE": pytest.approx(0.375),
         "colour accuracy": pytest.approx(0.8), "shape accuracy": pytest.approx(0.6)},
    ]
    folder = result.save(tmp_path / "study")
    again = StudyResult.load(folder)
    assert again.table() == result.table() and (folder / "STUDY.md").is_file()
    assert again.provenance["vlens_version"] and again.provenance["written_at"]  # stamped when saved
    section = interventions_section(None, folder / "study.json")  # what `vlens demo --interventions` shows
    assert section.status == "ok" and [row["setting"] for row in section.table] == ["baseline", "+SFT"]
    assert section.numbers["+SFT: synreal accuracy"] == pytest.approx(0.7)
    assert len(result.plot().data) == 2  # one bar group per condition


def test_model_card_section_is_replaced_not_duplicated(tmp_path):
    card = tmp_path / "MODEL_CARD.md"
    card.write_text("# model\n\nintro\n")
    result = _known_result()
    write_model_card_section(result, card)
    write_model_card_section(result, card)
    text = card.read_text()
    assert text.startswith("# model\n\nintro\n") and text.count(CARD_BEGIN) == 1 and text.count(CARD_END) == 1
    assert "| +SFT | 70.0 / 0.38 |" in text and "Seeds: 0, 1" in text


def test_data_splits_are_balanced_and_disjoint():
    settings = StudySettings(n_train_per_style=10, n_eval=10, eval_sets=["synreal", "syndot", "colour"])
    train = training_examples(settings, seed=0)
    assert sorted(int(e.answer) for e in train) == sorted(list(range(1, 11)) * 2)
    assert all(e.objects and len(e.objects[0][0]) >= 1 for e in train)
    sets = evaluation_sets(settings)
    assert sorted(int(r["answer"]) for _, r in sets["synreal"]) == list(range(1, 11))
    train_seeds = {e.meta["seed"] for e in train}
    eval_seeds = {r["seed"] for samples in sets.values() for _, r in samples}
    assert not train_seeds & eval_seeds


@pytest.mark.slow
def test_full_study_on_an_untrained_embedded_architecture(tmp_path):
    from vlens import HookedVLM
    from vlens.recipes.embedded.recipe import build_untrained
    from vlens.studies.interventions import run_study

    def load():
        _, processor, hf = build_untrained(0)
        return HookedVLM.from_hf(hf.eval(), processor=processor)

    settings = StudySettings(n_train_per_style=4, n_eval=10, importance_examples=4, eval_batch_size=10)
    result = run_study(load, settings, tmp_path, progress=False)
    assert set(result.results[0]) == {"baseline", "sft", "sft_focus", "sft_focus_beta"}
    assert len(result.temperatures[0]["heads"]) == 4
    again = StudyResult.load(tmp_path / "study.json")
    assert again.table() == result.table() and (tmp_path / "STUDY.md").is_file()
    assert len(again.provenance["weights_fingerprint"]) == 16 and again.provenance["model"]["weights_digest"]


def test_more_beta_heads_than_the_model_has_fails_before_any_run(tmp_path):
    model = tiny_vlm("qwen2_5_vl")  # 2 layers x 4 heads
    settings = StudySettings(top_k_heads=1000, n_eval=1, n_train_per_style=1)
    with pytest.raises(UserInputError, match=r"top_k_heads must be an integer in \[1, 8\], got 1000"):
        run_study(lambda: model, settings, tmp_path, progress=False)
    assert not any(tmp_path.iterdir())


def test_the_shipped_study_is_of_the_shipped_weights_and_stores_each_image():
    """The embedded model's study.json (what `vlens demo` shows and its interventions finding tests)
    was measured on the weights beside it, and its per-image results add up to its accuracies: the
    demo's paired bootstrap reads those lists."""
    import vlens
    from vlens.demo.interventions_stage import interventions_section
    from vlens.zoo.embedded import WEIGHTS_FOLDER

    rerun = ("rerun: OMP_NUM_THREADS=1 vlens study --model tiny --out runs/study --seeds 0 1 2 --n-eval 200 "
             "--model-card vlens/zoo/weights/tiny-qwen2.5-vl/MODEL_CARD.md, then copy runs/study/study.json "
             "into the weights folder and benchmarks/study_tiny.json")
    section = interventions_section(WEIGHTS_FOLDER, model=vlens.load())
    assert section.status == "ok" and section.data["weights_match"] is True, rerun
    raw = section.data["stored"]
    settings = raw["settings"]
    assert sorted(raw["results"]) == sorted(str(s) for s in settings["seeds"])
    for rows in raw["results"].values():
        for condition in settings["conditions"]:
            for name in settings["eval_sets"]:
                cell = rows[condition][name]
                assert len(cell["correct"]) == cell["n"] == settings["n_eval"], rerun
                assert set(cell["correct"]) <= {0, 1}
                assert sum(cell["correct"]) / cell["n"] == pytest.approx(cell["accuracy"])
    baseline = [rows["baseline"][name]["correct"] for rows in raw["results"].values()
                for name in settings["eval_sets"]]
    per_seed = len(settings["eval_sets"])
    assert baseline[:per_seed] * len(raw["results"]) == baseline  # no training: the same answers on every seed
    benchmark = Path(__file__).resolve().parents[2] / "benchmarks" / "study_tiny.json"
    assert json.loads(benchmark.read_text()) == json.loads((WEIGHTS_FOLDER / "study.json").read_text()), rerun
