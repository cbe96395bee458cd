"""A model card's commands reproduce its model: each stage's `vlens zoo train` line, read back by
the real parser, gives the settings the stage recorded (no training here: the records are built
by the recipe's own functions from settings chosen to differ from every default)."""

from __future__ import annotations

import importlib.util
import json
import shlex
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest

from vlens.cli import build_parser
from vlens.recipes.embedded.cli import settings_from_args
from vlens.recipes.embedded.model_card import MIX_TOLERANCE, mix_text, training_lines, training_stages
from vlens.recipes.embedded.recipe import NOT_IN_FINGERPRINT, check_settings, data_record, training_record
from vlens.recipes.embedded.settings import RecipeSettings, TrainSettings
from vlens.recipes.embedded.training_set import parse_mix

# Options that change no weight (where the run is kept, how it reports); a new option must be
# listed here or round-trip through the card below.
NOT_THE_MODEL = {
    "out", "held_out", "log_every", "checkpoint_every", "checkpoint_dir", "resume", "overwrite",
    "probe_scenes", "render_only",
}
# Settings with no flag: fixed by the recipe, so every card's command gets them by default.
NO_FLAG = {"weight_decay", "grad_clip", "checkpoint_held_out_per_source"}


def _lineage() -> list[RecipeSettings]:
    """Three stages that together set every weight-changing option away from its default (the
    combinations the recipe refuses, e.g. --fresh-decoder with --grow-*, are split across stages)."""
    return [
        RecipeSettings(
            stage="vision", seed=5, n_examples=123, threads=2, device="cuda", image_size=112,
            mix={"colour": 1.0, "shape": 2.0}, rope_theta=50.0, mrope_section=[3, 3, 2], text_layers=3,
            train=TrainSettings(steps=77, stop_after=40, batch_size=5, learning_rate=3e-4, warmup_steps=7),
        ),
        RecipeSettings(
            seed=6, n_examples=50, threads=1, init_from="stage1", fresh_decoder=True, text_layers=6,
            rope_theta=30.0, mrope_section=[2, 2, 4], minimal_pairs=True, arithmetic_pairs=True, question_first=0.35,
            max_objects=3,
            mix={"existence": 1.0, "spatial": 1.0, "counting/synpoly": 1.0},
            train=TrainSettings(steps=20, batch_size=4, learning_rate=1e-3, warmup_steps=2, freeze_vision=True),
        ),
        RecipeSettings(
            seed=7, n_examples=60, threads=3, init_from="stage2", grow_vision_depth=5, grow_text_layers=8,
            held_out_per_source=17, mix={"colour": 0.1, "counting/syndot": 0.3, "arithmetic": 0.6},
            train=TrainSettings(steps=30, batch_size=6, learning_rate=2.5e-3, warmup_steps=3, vision_aux_weight=0.5),
        ),
        RecipeSettings(  # stage 3's decoder on a tower trained apart (TOWER), as the card names its folder
            seed=8, n_examples=70, threads=2, init_from="stage3", vision_from="stage4-tower-stage1",
            held_out_per_source=17, mix={"shape": 1.0},
            train=TrainSettings(steps=40, batch_size=7, learning_rate=4e-4, warmup_steps=4, freeze_vision=True),
        ),
    ]


# The tower stage 4 takes (--vision-from): its own one-stage lineage.
TOWER = RecipeSettings(stage="vision", seed=9, n_examples=90, threads=2, image_size=112, mix={"colour": 1.0},
                       train=TrainSettings(steps=50, batch_size=8, learning_rate=1e-3, warmup_steps=5))


def _summaries(stages: list[RecipeSettings]) -> list[dict]:
    """Each stage's summary as run_recipe records it (its earlier stages read from the last one)."""
    summaries: list[dict] = []
    for settings in stages:
        check_settings(settings)  # a combination the recipe runs
        steps = settings.train.steps_to_run
        tower = {"vision_from_stages": training_stages(_summaries([TOWER])[-1])} if settings.vision_from else {}
        summaries.append({
            "data": data_record(settings),
            "training": training_record(settings, {"steps": steps, "wall_time_s": 60.0, "final_loss": 0.1}, tower),
            "previous_stages": training_stages(summaries[-1]) if summaries else [],
        })
    return summaries


def _compared(settings: RecipeSettings) -> dict:
    """The settings that determine the weights (recipe.fingerprint's, with --stop-after), the mix
    normalised (the card writes shares)."""
    values = {k: v for k, v in asdict(settings).items() if k not in NOT_IN_FINGERPRINT}
    values["train"] = {k: v for k, v in values["train"].items() if k not in ("log_every", "seed")}
    if values["mix"] is not None:
        total = sum(values["mix"].values())
        values["mix"] = {name: pytest.approx(weight / total, abs=1e-12) for name, weight in values["mix"].items()}
    return values


def _commands(summary: dict) -> list[str]:
    return [line for line in training_lines(summary) if line.startswith("vlens zoo train ")]


def test_every_card_command_reads_back_as_the_recorded_settings():
    stages = _lineage()
    summary = _summaries(stages)[-1]
    commands = _commands(summary)
    expected = [*stages[:3], TOWER, stages[3]]  # the tower's command comes before the stage that takes it
    outs = ["stage1", "stage2", "stage3", "stage4-tower-stage1", "DIR"]
    parser = build_parser()
    for out, command, settings in zip(outs, commands, expected, strict=True):
        args = parser.parse_args(shlex.split(command)[1:])
        assert str(args.out) == out
        assert _compared(settings_from_args(args)) == _compared(settings), command
    assert "--held-out 17" in commands[-1]  # the size of the evaluation the card reports


def test_the_lineage_sets_every_option_that_changes_the_weights():
    """So a new setting (or flag) fails the round trip above until the card writes it."""
    parsed = vars(build_parser().parse_args(["zoo", "train", "--out", "x"]))
    dests = set(parsed) - {"command", "zoo_command", "command_prog", "func", "quiet", "verbose"}
    flag_of = {"examples": "n_examples", "lr": "learning_rate", "warmup": "warmup_steps"}
    model_flags = {flag_of.get(dest, dest) for dest in dests - NOT_THE_MODEL}
    compared = _compared(RecipeSettings())
    top, train = set(compared) - {"train"}, set(compared["train"])  # train.seed is the stage's seed
    assert model_flags == (top | train) - NO_FLAG, "a new option: round-trip it below or list it in NOT_THE_MODEL"
    for name in sorted((top | train) - NO_FLAG):
        on_train = name not in top
        values = [getattr(s.train if on_train else s, name) for s in _lineage()]
        default = getattr(TrainSettings() if on_train else RecipeSettings(), name)
        assert any(value != default for value in values), name


def test_a_fresh_decoder_stage_says_what_it_started_from():
    text = "\n".join(training_lines(_summaries(_lineage())[-1]))
    assert "- stage 2 (a new 6-layer decoder on stage 1's vision tower and merger)" in text
    assert "- stage 3 (continuing stage 2)" in text
    assert ("- stage 4 (stage 3's decoder on the vision tower and merger of another run (1 stage(s), listed "
            "below as stage 4's tower))") in text
    assert "\n  - stage 4's tower, stage 1 (from scratch): seed 9, 50 steps" in text
    assert "total training wall time 5.0 min" in text  # four stages and the tower's, a minute each
    assert "decoder M-RoPE theta 30, sections [2, 2, 4]" in text and "a 3-layer decoder" in text
    assert "minimal pairs: each binding question" in text
    assert "question before the image with probability 0.35 per sample" in text
    assert text.count("question before the image") == 1  # stages 1 and 3 ask it after the image
    assert "counting/subset" not in text  # no stage's mix names it


def test_minimal_pairs_of_subset_counting_are_named_where_the_mix_has_it():
    summary = _summaries(_lineage())[-1]
    summary["training"]["minimal_pairs"] = True
    summary["data"]["mix"] = {"counting/subset": 0.2, "colour": 0.8}
    last = training_lines(summary)[len(training_stages(summary)) - 1]
    assert "(existence, spatial, colour, shape; counting/subset's counts among other objects) also asked" in last


def _shares(mix: dict[str, float]) -> dict[str, float]:
    total = sum(mix.values())
    return {name: weight / total for name, weight in mix.items()}


@pytest.mark.parametrize(("given", "written"), [
    # stage 4's balanced mix plus counting/groups=0.15 (training/v5/run.sh's stage lang5): not 0.0434782608696, ...
    ({"counting/syndot": 0.05, "counting/synpoly": 0.18, "counting/synreal": 0.03, "colour": 0.08, "shape": 0.16,
      "spatial": 0.18, "arithmetic": 0.14, "existence": 0.18, "counting/groups": 0.15},
     "counting/syndot=0.05,counting/synpoly=0.18,counting/synreal=0.03,colour=0.08,shape=0.16,spatial=0.18,"
     "arithmetic=0.14,existence=0.18,counting/groups=0.15"),
    ({"counting/syndot": 0.06, "counting/synpoly": 0.2, "colour": 0.74}, "counting/syndot=0.06,counting/synpoly=0.2,colour=0.74"),
    ({"colour": 1.0, "shape": 2.0}, "colour=1,shape=2"),
    ({"colour": 1.2, "shape": 0.3, "existence": 0.0}, "colour=0.8,shape=0.2,existence=0"),
    ({"colour": 0.123456789, "shape": 0.876543211}, "colour=0.123456789,shape=0.876543211"),
    ({"colour": 1.0, "shape": 3.14159265358979}, "colour=0.241453007005,shape=0.758546992995"),
])
def test_a_card_writes_a_mix_as_short_as_reads_back_as_its_shares(given, written):
    shares = _shares(given)
    assert mix_text(shares) == written
    read = _shares(parse_mix(written))
    assert list(read) == list(shares)
    assert all(abs(read[name] - shares[name]) <= MIX_TOLERANCE for name in shares)


ROOT = Path(__file__).parents[2]
V4 = ROOT / "training" / "v4"


def _backfill_script():
    spec = importlib.util.spec_from_file_location("backfill_card", V4 / "backfill_card.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _v4_folders() -> list[Path]:
    return sorted(p.parent for p in V4.glob("stage*/evaluation.json"))


def _v4_cards(lineage_before_v4: int) -> list[tuple[Path, int]]:
    """(folder, which v4 stage it holds): the trained v4 folders, and the shipped folder when it is
    a v4 stage (its last stage continued a training/v4 folder; v5 and v6 stages continue their own)."""
    cards = [(folder, int(folder.name.removeprefix("stage"))) for folder in _v4_folders()]
    shipped = ROOT / "vlens" / "zoo" / "weights" / "tiny-qwen2.5-vl"
    if (shipped / "evaluation.json").is_file():
        summary = json.loads((shipped / "evaluation.json").read_text())
        if str(summary["training"].get("init_from") or "").startswith("training/v4/"):
            cards.append((shipped, len(training_stages(summary)) - lineage_before_v4))
    return cards


def test_the_v4_cards_rebuild_what_run_sh_trained():
    """Each trained v4 folder's card (and the shipped one's, once it is a v4 stage): its v4 stages'
    commands (lineage stages 8...) read back as run.sh's stage lines. A record trained before the
    recipe recorded every flag: `python training/v4/backfill_card.py` (--folder DIR --as stageN for
    a copy elsewhere) completes it."""
    script = _backfill_script()
    trained = script.run_sh_settings(V4 / "run.sh")
    assert _v4_folders(), "no trained v4 stage"
    parser = build_parser()
    for folder, number in _v4_cards(script.LINEAGE_BEFORE_V4):
        commands = [line for line in (folder / "MODEL_CARD.md").read_text().splitlines()
                    if line.startswith("vlens zoo train ")]
        assert len(commands) == script.LINEAGE_BEFORE_V4 + number, folder
        for k in range(1, number + 1):
            command = commands[script.LINEAGE_BEFORE_V4 + k - 1]
            read = settings_from_args(parser.parse_args(shlex.split(command)[1:]))
            assert read.init_from == f"stage{script.LINEAGE_BEFORE_V4 + k - 1}", command
            read.init_from = trained[f"stage{k}"].init_from  # a path in run.sh, the earlier stage in a card
            assert _compared(read) == _compared(trained[f"stage{k}"]), (
                f"{folder}: {command!r} does not rebuild run.sh's stage{k}: complete its record with "
                f"`python training/v4/backfill_card.py` (a copy elsewhere: --folder DIR --as stage{number})"
            )
        assert "on stage 7's vision tower and merger" in (folder / "MODEL_CARD.md").read_text()


def test_the_backfill_is_idempotent_and_refuses_a_folder_run_sh_did_not_train(tmp_path):
    script = _backfill_script()
    trained = script.run_sh_settings(V4 / "run.sh")
    folder = _v4_folders()[-1]
    copy = tmp_path / folder.name
    copy.mkdir()
    shutil.copy(folder / "evaluation.json", copy)
    script.backfill(copy, trained)  # the committed record is already complete: the same bytes
    assert (copy / "evaluation.json").read_text() == (folder / "evaluation.json").read_text()
    assert (copy / "MODEL_CARD.md").read_text() == (folder / "MODEL_CARD.md").read_text()
    summary = json.loads((copy / "evaluation.json").read_text())
    summary["training"]["seed"] += 1
    (copy / "evaluation.json").write_text(json.dumps(summary))
    with pytest.raises(SystemExit, match="was not trained by run.sh's line: seed"):
        script.backfill(copy, trained)
    assert json.loads((copy / "evaluation.json").read_text()) == summary  # nothing written


def test_a_tower_that_continues_the_models_own_first_stage_is_reproduced_once():
    """v6's case: the tower under the last stage continues the model's own vision stage (stage 1),
    so the card rebuilds stage 1 once, continues it for the tower, and counts its time once."""
    first = _lineage()[0]
    decoder = _lineage()[1]
    tower = RecipeSettings(stage="vision", seed=9, n_examples=90, threads=2, image_size=112, init_from="stage1",
                           mix={"colour": 1.0}, train=TrainSettings(steps=50, batch_size=8, learning_rate=1e-3,
                                                                    warmup_steps=5))
    last = RecipeSettings(seed=8, n_examples=70, init_from="stage2", vision_from="stage3-tower-stage2",
                          mix={"shape": 1.0}, train=TrainSettings(steps=40, batch_size=7, freeze_vision=True))
    tower_stages = training_stages(_summaries([first, tower])[-1])
    model = _summaries([first, decoder])
    summary = {
        "data": data_record(last),
        "training": training_record(last, {"steps": 40, "wall_time_s": 60.0, "final_loss": 0.1},
                                    {"vision_from_stages": tower_stages}),
        "previous_stages": training_stages(model[-1]),
    }
    commands = _commands(summary)
    parser = build_parser()
    for out, command, settings in zip(["stage1", "stage2", "stage3-tower-stage2", "DIR"], commands,
                                      [first, decoder, tower, last], strict=True):
        args = parser.parse_args(shlex.split(command)[1:])
        assert str(args.out) == out
        assert _compared(settings_from_args(args)) == _compared(settings), command
    text = "\n".join(training_lines(summary))
    assert "\n  - stage 3's tower, stage 1: stage 1 above\n  - stage 3's tower, stage 2 (continuing stage 1)" in text
    assert "total training wall time 4.0 min" in text  # stage 1, 2, the tower's stage 2, stage 3: a minute each
