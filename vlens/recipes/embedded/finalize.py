"""Full held-out evaluation of a folder the recipe wrote, e.g. a snapshot taken along the
way (`--checkpoint-every`): rewrites its evaluation.json, training log and card so they
describe exactly that model. The log is cut at the folder's step and ends with a final event of
the new evaluation, as training writes it; the card keeps the sections other commands added
(the interventions study's).

Nothing in the folder changes until the model has loaded and the evaluation has finished;
the new files are then written into a copy that replaces the folder in one rename.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from transformers import Qwen2_5_VLForConditionalGeneration

from vlens.core.loading import from_pretrained_checked
from vlens.recipes.embedded.evaluate import evaluate_samples
from vlens.recipes.embedded.model_card import rewrite_model_card
from vlens.recipes.embedded.probe import probe_tower
from vlens.recipes.embedded.recipe import final_log_event
from vlens.recipes.embedded.settings import TRAINING_LOG
from vlens.recipes.embedded.training_set import held_out_samples
from vlens.utils.errors import UserInputError
from vlens.utils.fileio import atomic_folder
from vlens.zoo.processor import load_processor

# written anew into the copy; MODEL_CARD.md is copied and then re-rendered, which keeps its marked sections
REWRITTEN = (TRAINING_LOG, "evaluation.json")


def _trimmed_log(log_path: Path, last_step: int) -> tuple[list[dict], dict]:
    """Log records up to `last_step` (no final event) and the last start event's settings
    with "last_smoothed_loss"."""
    records = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    kept = [r for r in records if r.get("step", 0) <= last_step and r.get("event") != "final"]
    starts = [r for r in kept if r.get("event") == "start"]
    if not starts:
        raise UserInputError(f"{log_path} has no start event")
    losses = [r["smoothed_loss"] for r in kept if "smoothed_loss" in r]
    return kept, {**starts[-1]["settings"], "last_smoothed_loss": losses[-1] if losses else float("nan")}


def finalize_folder(folder: str | Path, held_out_per_source: int = 300) -> dict:
    """Evaluate `folder` on `held_out_per_source` held-out samples per source and update
    evaluation.json, training_log.jsonl (cut at the folder's step) and MODEL_CARD.md."""
    folder = Path(folder)
    summary = json.loads((folder / "evaluation.json").read_text())
    training = summary["training"]
    kept, settings = _trimmed_log(folder / TRAINING_LOG, training["steps"])
    model = from_pretrained_checked(Qwen2_5_VLForConditionalGeneration, str(folder)).eval()
    processor = load_processor(folder)
    if training.get("stage", "language") == "language":
        evaluation = evaluate_samples(model, processor, held_out_samples(held_out_per_source))
        evaluation["held_out_per_source"] = held_out_per_source
        summary["evaluation"] = evaluation
        summary["data"]["held_out_per_source"] = held_out_per_source
    training["probe"] = probe_tower(model, processor)

    # the evaluation succeeded: only now does anything change
    training["schedule_steps"] = settings["steps"]
    if training.get("final_loss") is None or training["final_loss"] != training["final_loss"]:  # None or NaN
        training["final_loss"] = settings["last_smoothed_loss"]
    if training["steps"] < training["schedule_steps"]:
        summary["status"] = (
            f"checkpoint at step {training['steps']} of a {training['schedule_steps']}-step schedule "
            f"(reproduce with --stop-after {training['steps']}); full held-out evaluation"
        )
    else:
        summary["status"] = "final"
    with atomic_folder(folder, overwrite=True, name="--model") as copy:
        for path in folder.iterdir():
            if path.is_file() and path.name not in REWRITTEN:
                shutil.copy2(path, copy / path.name)
        (copy / TRAINING_LOG).write_text("".join(json.dumps(r) + "\n" for r in [*kept, final_log_event(summary)]))
        (copy / "evaluation.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        rewrite_model_card(copy)
    return summary
