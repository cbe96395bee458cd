"""The embedded model's recipe: build tokenizer, processor and tiny Qwen2.5-VL, pre-render
the task-suite mix, train, evaluate on held-out seeds, and write a Hugging Face model
folder with MODEL_CARD.md. `vlens zoo train` runs it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import GenerationConfig

from vlens.recipes.embedded import architecture as arch
from vlens.recipes.embedded.evaluate import evaluate_samples
from vlens.recipes.embedded.growth import grow_vision_tower
from vlens.recipes.embedded.model_card import training_stages, write_model_card
from vlens.recipes.embedded.tokenizer import build_tokenizer
from vlens.recipes.embedded.train import TrainSettings, train_model
from vlens.recipes.embedded.training_set import (
    DEFAULT_SIZE,
    TRAINING_MIX,
    held_out_samples,
    render_training_set,
)
from vlens.recipes.embedded.vocabulary import vocabulary_words
from vlens.zoo.processor import (
    CELL,
    IMAGE_SIZE,
    PATCH_SIZE,
    assemble_processor,
    build_image_processor,
    image_size_of,
    save_processor_files,
)

TRAINING_LOG = "training_log.jsonl"


@dataclass
class RecipeSettings:
    """Everything that determines the trained model (with the torch thread count)."""

    seed: int = 0
    n_examples: int = 30_000
    threads: int = 1
    held_out_per_source: int = 300
    checkpoint_every: int = 0  # steps; 0: no intermediate checkpoints
    checkpoint_held_out_per_source: int = 40
    mix: dict[str, float] | None = None  # source weights; default TRAINING_MIX
    init_from: str | None = None  # continue from a trained folder (a second stage) instead of scratch
    max_objects: int | None = None  # curriculum: cap the objects of non-counting tasks (None: up to 10)
    grow_vision_depth: int | None = None  # with init_from: add identity-initialised vision blocks first
    device: str = "cpu"  # e.g. "cuda": train and evaluate there (bitwise determinism: CPU only)
    image_size: int | None = None  # square input px; None: IMAGE_SIZE, or the continued folder's
    train: TrainSettings = field(default_factory=TrainSettings)


def build_untrained(seed: int, image_size: int = IMAGE_SIZE):
    """(tokenizer, processor, freshly initialised model) of the recipe."""
    tokenizer = build_tokenizer(vocabulary_words())
    processor = assemble_processor(tokenizer, build_image_processor(image_size))
    model = arch.build_model(arch.build_config(tokenizer), seed)
    return tokenizer, processor, model


def load_for_continuation(folder: str | Path, image_size: int | None = None):
    """(tokenizer, processor, model) of a folder the recipe wrote, to train it further, at
    the folder's image size or at `image_size` (Qwen's vision tower takes any grid).

    Raises ValueError if its vocabulary is not the recipe's current one (token ids would
    no longer match the data)."""
    from transformers import AutoImageProcessor, AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    tokenizer = build_tokenizer(vocabulary_words())
    if AutoTokenizer.from_pretrained(folder).get_vocab() != tokenizer.get_vocab():
        raise ValueError(f"{folder}: its tokenizer differs from the recipe's vocabulary; cannot continue it")
    if image_size is None:
        image_size = image_size_of(AutoImageProcessor.from_pretrained(folder))
    processor = assemble_processor(tokenizer, build_image_processor(image_size))
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
    return tokenizer, processor, model


def previous_stages(folder: str | Path) -> list[dict]:
    """Training stages (each a summary "training" dict with its data settings) behind a folder."""
    return training_stages(json.loads((Path(folder) / "evaluation.json").read_text()))


def save_model_folder(model, processor, folder: str | Path) -> None:
    """Write the model (safetensors, config, generation config) and processor files."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = processor.tokenizer
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=[tokenizer.eos_token_id, tokenizer.pad_token_id],
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
        max_new_tokens=8,
    )
    model.save_pretrained(folder, safe_serialization=True)
    save_processor_files(tokenizer, processor.image_processor, folder)


def describe_config(model, processor) -> dict:
    """The numbers MODEL_CARD.md reports about the architecture (read from the model's
    config: a grown vision tower is described as it is)."""
    vision, text = model.config.vision_config, model.config.text_config
    image_size = image_size_of(processor)
    return {
        "image_size": image_size,
        "patch_size": PATCH_SIZE,
        "merged_grid": image_size // CELL,
        "vision_depth": vision.depth,
        "vision_width": vision.hidden_size,
        "vision_heads": vision.num_heads,
        "vision_full_attention_blocks": list(vision.fullatt_block_indexes),
        "text_layers": text.num_hidden_layers,
        "text_width": text.hidden_size,
        "text_heads": text.num_attention_heads,
        "text_kv_heads": text.num_key_value_heads,
        "text_mlp": text.intermediate_size,
        "mrope_section": list(text.rope_parameters["mrope_section"]),
        "vocab_size": len(processor.tokenizer),
    }


def _normalised(mix: dict[str, float]) -> dict[str, float]:
    total = sum(mix.values())
    return {name: weight / total for name, weight in mix.items()}


def _summary(
    settings: RecipeSettings, model, processor, training: dict, evaluation: dict, status: str
) -> dict:
    return {
        "status": status,
        "config": describe_config(model, processor),
        "parameters": arch.parameter_count(model),
        "data": {
            "n_examples": settings.n_examples,
            "mix": _normalised(settings.mix or TRAINING_MIX),
            "max_objects": settings.max_objects,
            "held_out_per_source": evaluation.get("held_out_per_source", settings.held_out_per_source),
            "held_out_size": DEFAULT_SIZE,
        },
        "training": {
            "seed": settings.seed,
            "steps": training["steps"],
            "schedule_steps": settings.train.steps,
            "batch_size": settings.train.batch_size,
            "learning_rate": settings.train.learning_rate,
            "warmup_steps": settings.train.warmup_steps,
            "threads": settings.threads,
            "device": settings.device,
            "image_size": settings.image_size,
            "init_from": settings.init_from,
            "grow_vision_depth": settings.grow_vision_depth,
            "vision_aux_weight": settings.train.vision_aux_weight,
            "wall_time_s": training["wall_time_s"],
            "final_loss": training["final_loss"] if training["final_loss"] is not None else float("nan"),
        },
        "evaluation": evaluation,
        "previous_stages": previous_stages(settings.init_from) if settings.init_from else [],
    }


def _write_outputs(folder: Path, model, processor, summary: dict) -> None:
    save_model_folder(model, processor, folder)  # safetensors are written from any device
    write_model_card(summary, folder)
    (folder / "evaluation.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")


def run_recipe(out: str | Path, settings: RecipeSettings, progress: bool = True) -> dict:
    """Train the embedded model into the folder `out` and return the summary dict.

    `out` receives the HF model folder, MODEL_CARD.md, evaluation.json and the training log;
    with settings.checkpoint_every, the folder is refreshed (quick evaluation) along the way.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(settings.threads)
    settings.train.seed = settings.seed
    if settings.grow_vision_depth is not None and not settings.init_from:
        raise ValueError("growing the vision tower needs a trained folder to grow (--init-from)")
    if settings.init_from:
        tokenizer, processor, model = load_for_continuation(settings.init_from, settings.image_size)
        if settings.grow_vision_depth is not None:
            model = grow_vision_tower(model, settings.grow_vision_depth, settings.seed)
    else:
        tokenizer, processor, model = build_untrained(settings.seed, settings.image_size or IMAGE_SIZE)
    model.to(settings.device)
    rendered = render_training_set(
        processor, settings.n_examples, settings.seed, progress, settings.mix, settings.max_objects
    )
    log_path = out / TRAINING_LOG
    log_path.unlink(missing_ok=True)
    checkpoint_samples = (
        held_out_samples(settings.checkpoint_held_out_per_source) if settings.checkpoint_every else []
    )
    import time

    start = time.time()

    def on_checkpoint(step: int) -> dict:
        evaluation = evaluate_samples(model, processor, checkpoint_samples)
        evaluation["held_out_per_source"] = settings.checkpoint_held_out_per_source
        training = {"steps": step, "wall_time_s": round(time.time() - start, 1), "final_loss": None}
        status = f"intermediate checkpoint at step {step} of {settings.train.steps} (quick evaluation)"
        _write_outputs(
            out, model, processor, _summary(settings, model, processor, training, evaluation, status)
        )
        return {name: round(row["accuracy"], 3) for name, row in evaluation["per_task"].items()}

    training = train_model(
        model,
        rendered.examples,
        rendered.images,
        settings.train,
        pad_id=tokenizer.pad_token_id,
        image_token_id=processor.image_token_id,
        log_path=log_path,
        on_checkpoint=on_checkpoint,
        checkpoint_every=settings.checkpoint_every,
        progress=progress,
        cell_labels=rendered.cell_labels,
    )
    del rendered
    evaluation = evaluate_samples(model, processor, held_out_samples(settings.held_out_per_source))
    evaluation["held_out_per_source"] = settings.held_out_per_source
    summary = _summary(settings, model, processor, training, evaluation, "final")
    _write_outputs(out, model, processor, summary)
    with log_path.open("a") as log:
        log.write(json.dumps({"event": "final", **evaluation["per_task"]}) + "\n")
    return summary
