"""Full held-out evaluation of a folder the recipe wrote, e.g. a checkpoint taken along
the way (`--checkpoint-every`): rewrites its evaluation.json, training log and card so they
describe exactly that model."""

from __future__ import annotations

import json
from pathlib import Path

from vlens.recipes.embedded.evaluate import evaluate_samples
from vlens.recipes.embedded.model_card import rewrite_model_card
from vlens.recipes.embedded.recipe import TRAINING_LOG
from vlens.recipes.embedded.training_set import held_out_samples
from vlens.zoo.processor import load_processor


def _trim_log(log_path: Path, last_step: int) -> dict:
    """Drop log records after `last_step`; returns the start event's settings."""
    records = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    kept = [r for r in records if r.get("step", 0) <= last_step and r.get("event") != "final"]
    log_path.write_text("".join(json.dumps(r) + "\n" for r in kept))
    starts = [r for r in kept if r.get("event") == "start"]
    if not starts:
        raise ValueError(f"{log_path} has no start event")
    losses = [r["smoothed_loss"] for r in kept if "smoothed_loss" in r]
    return {**starts[-1]["settings"], "last_smoothed_loss": losses[-1] if losses else float("nan")}


def finalize_folder(folder: str | Path, held_out_per_source: int = 300) -> dict:
    """Evaluate `folder` on `held_out_per_source` held-out samples per source and update
    evaluation.json, training_log.jsonl (cut at the folder's step) and MODEL_CARD.md."""
    from transformers import Qwen2_5_VLForConditionalGeneration


    folder = Path(folder)
    summary = json.loads((folder / "evaluation.json").read_text())
    training = summary["training"]
    settings = _trim_log(folder / TRAINING_LOG, training["steps"])
    training["schedule_steps"] = settings["steps"]
    if training.get("final_loss") is None or training["final_loss"] != training["final_loss"]:  # None or NaN
        training["final_loss"] = settings["last_smoothed_loss"]

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder).eval()
    evaluation = evaluate_samples(model, load_processor(folder), held_out_samples(held_out_per_source))
    evaluation["held_out_per_source"] = held_out_per_source
    summary["evaluation"] = evaluation
    summary["data"]["held_out_per_source"] = held_out_per_source
    if training["steps"] < training["schedule_steps"]:
        summary["status"] = (
            f"checkpoint at step {training['steps']} of a {training['schedule_steps']}-step schedule "
            f"(reproduce with --stop-after {training['steps']}); full held-out evaluation"
        )
    else:
        summary["status"] = "final"
    (folder / "evaluation.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    rewrite_model_card(folder)
    return summary
