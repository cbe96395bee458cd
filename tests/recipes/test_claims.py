"""Claims about the embedded model come from its evaluation.json: intervals, training exposure, chance."""

import json
import runpy
import sys
from pathlib import Path

import pytest

from vlens.recipes.embedded.claims import accuracy_text, exposure, held_out, readme_paragraph, sources_note
from vlens.zoo import WEIGHTS_FOLDER

ROOT = Path(__file__).resolve().parents[2]


def _evaluation(mixes: list[dict], per_task: dict) -> dict:
    """An evaluation.json shape: earlier stages under previous_stages, the last stage's mix under data."""
    return {"previous_stages": [{"mix": m} for m in mixes[:-1]], "data": {"mix": mixes[-1]},
            "evaluation": {"per_task": per_task, "per_objects": {"colour": {"1": {"accuracy": 1.0, "n": 20}}}}}


def test_a_source_is_held_out_only_when_no_stage_trains_on_it():
    evaluation = _evaluation([{"counting/syndot": 0.4, "counting/dot_variants": 0.1, "existence": 0.5},
                              {"counting/syndot": 0.5, "existence": 0.5}],
                             {"counting/syndot": {"accuracy": 0.9, "n": 100},
                              "counting/dot_variants": {"accuracy": 0.8, "n": 100},
                              "counting/synreal": {"accuracy": 0.4, "n": 100},
                              "existence": {"accuracy": 0.52, "n": 100}})
    assert held_out(evaluation, "counting/synreal")
    assert not held_out(evaluation, "counting/dot_variants")  # one stage had it: not unseen
    assert exposure(evaluation, "counting/dot_variants") == "in the training mix of 1 of 2 stages, 10%"
    assert exposure(evaluation, "counting/syndot") == "in the training mix of every stage, 40-50%"
    text = readme_paragraph(evaluation)
    assert "unseen renderer): shaded objects on textured backgrounds (SynReal-lite)." in text
    assert "existence 52.0% [42.3, 61.5] (chance 50%: yes/no)" in text
    assert "(SynReal-lite) 40.0%" in text and "held out of all training)" in text
    unknown = {**evaluation, "previous_stages": [{}]}  # a stage without a recorded mix: never "held out"
    assert not held_out(unknown, "counting/synreal") and "not recorded" in sources_note(unknown)


def test_subset_counting_is_not_held_out_while_synpoly_counting_trains():
    """counting/subset asks questions that SynPoly counting samples also ask: unseen only if neither trains."""
    per_task = {"counting/subset": {"accuracy": 0.6, "n": 100}}
    trained = _evaluation([{"counting/synpoly": 0.2, "colour": 0.8}], per_task)
    assert not held_out(trained, "counting/subset")
    assert exposure(trained, "counting/subset") == (
        "no source of its own in training, but counting/synpoly asks such questions"
        ": in the training mix of every stage, 20%")
    assert "(no source is held out)" in readme_paragraph(trained)
    neither = _evaluation([{"colour": 1.0}], per_task)
    assert held_out(neither, "counting/subset") and exposure(neither, "counting/subset") == "held out of all training"
    own = _evaluation([{"counting/subset": 0.1, "colour": 0.9}], per_task)
    assert exposure(own, "counting/subset") == "in the training mix of every stage, 10%"


def test_sources_beyond_the_task_suite_are_reported_with_their_accuracy_and_exposure():
    evaluation = _evaluation([{"counting/syndot": 1.0}],
                             {"counting/syndot": {"accuracy": 0.9, "n": 100},
                              "foreign/counting": {"accuracy": 0.5, "n": 100},
                              "foreign/colour": {"accuracy": 0.8, "n": 10}})
    text = readme_paragraph(evaluation)
    assert "colour questions on the foreign renderer 80.0% [49.0, 94.3] (held out of all training)" in text
    assert "(foreign) 50.0%" in text
    assert text.endswith("unseen renderer): shapes from a third, PIL-drawn renderer in plain CSS colours (foreign), "
                         "colour questions on the foreign renderer.")
    assert "foreign/colour: colour questions on the foreign renderer, held out of all training" in sources_note(
        evaluation)
    yes_no = _evaluation([{"counting/syndot": 1.0}], {"counting/syndot": {"accuracy": 0.9, "n": 100},
                                                      "foreign/spatial": {"accuracy": 0.6, "n": 10}})
    assert "spatial questions on the foreign renderer 60.0% [31.3, 83.2] (chance 50%, held out of all training)" in (
        readme_paragraph(yes_no))


def test_tasks_are_called_weaker_only_when_their_interval_reaches_below_the_solid_level():
    # 96/100: Wilson [90.2, 98.4], solid; 90/100: [82.6, 94.5], weaker; 50/300: weaker
    evaluation = _evaluation([{"counting/syndot": 1.0}],
                             {"counting/syndot": {"accuracy": 0.9, "n": 100},
                              "colour": {"accuracy": 0.96, "n": 100},
                              "shape": {"accuracy": 0.90, "n": 100},
                              "arithmetic": {"accuracy": 0.5, "n": 300}})
    text = readme_paragraph(evaluation)
    assert "it answers colour 96.0% [90.2, 98.4]." in text
    assert "It is weaker on shape 90.0% [82.6, 94.5], arithmetic 50.0% [44.4, 55.6]; treat circuits" in text
    all_weak = _evaluation([{"counting/syndot": 1.0}], {"existence": {"accuracy": 0.52, "n": 100}})
    assert "are weaker: existence 52.0% [42.3, 61.5] (chance 50%: yes/no); treat" in readme_paragraph(all_weak)
    all_solid = _evaluation([{"counting/syndot": 1.0}], {"colour": {"accuracy": 0.99, "n": 300}})
    assert "weaker" not in readme_paragraph(all_solid) and "it answers colour 99.0%" in readme_paragraph(all_solid)


def test_accuracy_text_is_a_wilson_interval():
    assert accuracy_text({"accuracy": 0.8, "n": 10}) == "80.0% [49.0, 94.3]"


def test_readme_and_model_card_agree_with_the_shipped_evaluation():
    evaluation = json.loads((WEIGHTS_FOLDER / "evaluation.json").read_text())
    readme = (ROOT / "README.md").read_text()
    assert readme_paragraph(evaluation) in readme, "run: python benchmarks/regenerate_claims.py"
    card = (WEIGHTS_FOLDER / "MODEL_CARD.md").read_text()
    assert sources_note(evaluation) in card
    for source, result in evaluation["evaluation"]["per_task"].items():  # every accuracy with its interval
        assert f"| {source} | {accuracy_text(result)} |" in card, f"{source}: rewrite the card (vlens zoo evaluate --write)"
    for claim in ("never saw", "OOD counting", "held-out SynReal-lite style"):
        assert claim not in readme and claim not in card



def test_the_regenerate_command_finds_the_readme_up_to_date(monkeypatch):
    # in this process (a subprocess would spend ~20 s importing torch again on a busy machine)
    monkeypatch.setattr(sys, "argv", ["regenerate_claims.py", "--check"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(ROOT / "benchmarks" / "regenerate_claims.py"), run_name="__main__")
    assert done.value.code == 0, "run: python benchmarks/regenerate_claims.py"
