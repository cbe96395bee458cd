"""Backfill the v4 stage folders' records with the run.sh flags the recipe did not record when they
were trained, and rewrite each folder's MODEL_CARD.md from the completed record.

    python training/v4/backfill_card.py             # every finished stage (training/v4/stageN/model.safetensors)
    python training/v4/backfill_card.py stage2      # only the named stages
    python training/v4/backfill_card.py --folder vlens/zoo/weights/tiny-qwen2.5-vl --as stage4
                                                    # a copy of a stage's folder elsewhere (the shipped one)

Run from the repository root. Until issue 42 the recipe recorded neither --fresh-decoder, --text-layers,
--rope-theta, --mrope-section nor --minimal-pairs, so the cards of training/v4/stage1..3 said
"continuing stage 7" and their commands did not rebuild the model. This script reads each v4 stage's
flags from its `stage stageN ...` line in run.sh with the real `vlens zoo train` parser, checks them
against what the folder did record (seed, schedule, batch, rate, warm-up, examples, mix, frozen tower,
init-from; a mismatch means another command trained the folder, and nothing is written), adds the
missing values to evaluation.json ("training", and the matching "previous_stages" entries: v4 stage k
is stage 7 + k of the lineage; stages 1-7 are the shipped v2 lineage, which used none of these flags
and keeps its records), and rewrites MODEL_CARD.md with vlens.recipes.embedded.model_card (sections
that studies appended after the rendered card are kept).
Idempotent: a second run writes the same bytes.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's vlens, not another install
from vlens.cli import build_parser  # noqa: E402
from vlens.recipes.embedded.cli import settings_from_args  # noqa: E402
from vlens.recipes.embedded.model_card import rewrite_model_card  # noqa: E402
from vlens.recipes.embedded.settings import RecipeSettings  # noqa: E402

HERE = Path("training/v4")
RUN_SH = HERE / "run.sh"
LINEAGE_BEFORE_V4 = 7  # stages of the shipped model the v4 decoder was put on (its vision tower's)
BACKFILLED = ("fresh_decoder", "text_layers", "rope_theta", "mrope_section", "minimal_pairs")


def run_sh_settings(run_sh: Path = RUN_SH) -> dict[str, RecipeSettings]:
    """{"stage1": settings, ...}: each `stage NAME FLAGS` line of run.sh, its shell variables
    ($FULL_MIX, ...) filled in, read by the `vlens zoo train` parser."""
    text = run_sh.read_text().replace("\\\n", " ")
    variables = dict(re.findall(r"^([A-Z_]+)=(\S+)$", text, flags=re.M))
    parser, stages = build_parser(), {}
    for name, flags in re.findall(r"^stage (stage\d+) (.+)$", text, flags=re.M):
        tokens = [variables[t[1:]] if t.startswith("$") else t for t in shlex.split(flags)]
        stages[name] = settings_from_args(parser.parse_args(["zoo", "train", "--out", str(HERE / name), *tokens]))
    if not stages:
        raise SystemExit(f"{run_sh}: no `stage stageN ...` lines")
    return stages


def _normalised(mix: dict[str, float]) -> dict[str, float]:
    total = sum(mix.values())
    return {name: weight / total for name, weight in mix.items()}


def check_record(record: dict, settings: RecipeSettings, where: str) -> None:
    """SystemExit unless the folder's record of a stage is what run.sh's line trains."""
    expected = {
        "seed": settings.seed,
        "schedule_steps": settings.train.steps,
        "batch_size": settings.train.batch_size,
        "learning_rate": settings.train.learning_rate,
        "warmup_steps": settings.train.warmup_steps,
        "n_examples": settings.n_examples,
        "freeze_vision": settings.train.freeze_vision,
        "init_from": settings.init_from,
    }
    wrong = [f"{key} {record.get(key)!r} (run.sh: {value!r})" for key, value in expected.items()
             if record.get(key) != value]
    mix = _normalised(settings.mix) if settings.mix else None
    if mix is None or record["mix"].keys() != mix.keys() or any(
        abs(record["mix"][name] - share) > 1e-9 for name, share in mix.items()
    ):
        wrong.append(f"mix {record['mix']} (run.sh: {mix})")
    if wrong:
        raise SystemExit(f"{where} was not trained by run.sh's line: " + "; ".join(wrong) + ". Nothing written.")


def _with_flags(record: dict, settings: RecipeSettings) -> dict:
    """The record with the backfilled values after "freeze_vision" (where the recipe now puts them)."""
    values = {name: getattr(settings, name) for name in BACKFILLED}
    out = {}
    for key, value in record.items():
        if key not in BACKFILLED:
            out[key] = value
        if key == "freeze_vision":
            out.update(values)
    out.update({k: v for k, v in values.items() if k not in out})
    return out


def backfill(folder: Path, stages: dict[str, RecipeSettings], name: str | None = None) -> None:
    """Complete folder/evaluation.json from run.sh's stage lines and rewrite its MODEL_CARD.md
    (`name`: which v4 stage the folder holds; default its own name, e.g. "stage2")."""
    path = folder / "evaluation.json"
    summary = json.loads(path.read_text())
    name = name or folder.name
    if name not in stages:
        raise SystemExit(f"{folder}: {name} is not a stage of {RUN_SH} ({', '.join(stages)})")
    number = int(name.removeprefix("stage"))
    previous = summary["previous_stages"]
    if len(previous) != LINEAGE_BEFORE_V4 + number - 1:
        raise SystemExit(f"{path}: {len(previous)} earlier stages, expected {LINEAGE_BEFORE_V4 + number - 1}")
    current = {**summary["training"], **{k: summary["data"][k] for k in ("n_examples", "mix")}}
    check_record(current, stages[name], f"{folder} (as {name})")
    for k in range(1, number):
        check_record(previous[LINEAGE_BEFORE_V4 + k - 1], stages[f"stage{k}"], f"{folder}'s lineage stage {7 + k}")
    for k in range(1, number):
        index = LINEAGE_BEFORE_V4 + k - 1
        previous[index] = _with_flags(previous[index], stages[f"stage{k}"])
    summary["training"] = _with_flags(summary["training"], stages[name])
    card = folder / "MODEL_CARD.md"
    old = card.read_text() if card.is_file() else ""
    path.write_text(json.dumps(summary, indent=2, default=str) + "\n")  # as recipe.write_outputs writes it
    text = rewrite_model_card(folder).read_text()
    end = text.rstrip("\n").rsplit("\n", 1)[-1] + "\n"  # the rendered card's last line
    if end in old and old.split(end, 1)[1].strip():  # sections added after the card (studies): kept
        card.write_text(text + old.split(end, 1)[1])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stages", nargs="*", help="v4 stages to complete (default: every finished one)")
    parser.add_argument("--folder", type=Path, help="a folder holding a copy of the stage named by --as")
    parser.add_argument("--as", dest="as_stage", help="with --folder: the v4 stage it holds, e.g. stage4")
    args = parser.parse_args(argv)
    if not RUN_SH.is_file():
        raise SystemExit(f"run this from the repository root ({RUN_SH} not found)")
    if (args.folder is None) != (args.as_stage is None) or (args.folder and args.stages):
        raise SystemExit("give stage names, or --folder DIR with --as stageN")
    stages = run_sh_settings()
    if args.folder:
        jobs = [(args.folder, args.as_stage)]
    else:
        folders = [HERE / name for name in args.stages] or sorted(
            (p.parent for p in HERE.glob("stage*/model.safetensors")), key=lambda p: int(p.name[5:])
        )
        jobs = [(folder, folder.name) for folder in folders]
    for folder, name in jobs:
        if not (folder / "evaluation.json").is_file():
            raise SystemExit(f"{folder}: no evaluation.json (not a trained model folder)")
        backfill(folder, stages, name)
        sys.stdout.write(f"{folder}: evaluation.json and MODEL_CARD.md updated\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
