"""The embedded model's recipe: build tokenizer, processor and tiny Qwen2.5-VL, pre-render
the task-suite mix, train one stage, evaluate on held-out seeds, and write a Hugging Face
model folder with MODEL_CARD.md. `vlens zoo train` runs it.

A stage is either the vision pretraining stage (`stage="vision"`: the tower and merger
alone, on dense cell labels) or a language stage (answer tokens; the tower trained along
or frozen). Each stage is resumable: its state lives in a checkpoint folder next to the
output until the output folder is complete, and the output folder is written whole or not
at all (vlens.utils.fileio.atomic_folder).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from transformers import GenerationConfig

from vlens.core.loading import from_pretrained_checked
from vlens.recipes.embedded import architecture as arch
from vlens.recipes.embedded.appearance import id_map_of
from vlens.recipes.embedded.batches import to_model_image
from vlens.recipes.embedded.evaluate import evaluate_samples
from vlens.recipes.embedded.growth import grow_decoder, grow_vision_tower
from vlens.recipes.embedded.image_store import ImageStore
from vlens.recipes.embedded.loop import TrainingState
from vlens.recipes.embedded.model_card import training_stages, write_model_card
from vlens.recipes.embedded.probe import probe_tower
from vlens.recipes.embedded.settings import TRAINING_LOG, RecipeSettings
from vlens.recipes.embedded.tokenizer import build_tokenizer
from vlens.recipes.embedded.train import train_model
from vlens.recipes.embedded.training_set import (
    DEFAULT_SIZE,
    TRAINING_MIX,
    PairOptions,
    RenderedSet,
    held_out_samples,
    render_training_set,
)
from vlens.recipes.embedded.vision_aux import dense_labels
from vlens.recipes.embedded.vision_pretrain import pretrain_vision
from vlens.recipes.embedded.vocabulary import vocabulary_words
from vlens.utils.errors import UserInputError
from vlens.utils.fileio import atomic_folder, atomic_write, load_tensor_file
from vlens.utils.validation import check_float, check_output_folder
from vlens.zoo.image_sizes import folder_image_size
from vlens.zoo.processor import (
    CELL,
    IMAGE_SIZE,
    PATCH_SIZE,
    assemble_processor,
    build_image_processor,
    image_size_of,
    save_processor_files,
)

logger = logging.getLogger(__name__)

STAGES = ("vision", "language")
SNAPSHOT = "snapshot"  # the checkpoint folder's model folder of the last checkpoint
RENDERED_FILE = "rendered.pt"  # the checkpoint folder's copy of the stage's training set


# Settings that do not change the trained weights (a resumed run may change them).
NOT_IN_FINGERPRINT = (
    "held_out_per_source",
    "checkpoint_every",
    "checkpoint_held_out_per_source",
    "checkpoint_dir",
    "resume",
    "overwrite",
    "probe_scenes",
)


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def fingerprint(settings: RecipeSettings) -> dict:
    """The settings that determine the trajectory, and the weights a later stage starts from."""
    values = {k: v for k, v in asdict(settings).items() if k not in NOT_IN_FINGERPRINT}
    values["train"] = {k: v for k, v in values["train"].items() if k not in ("stop_after", "log_every")}
    if not settings.question_first:  # the states saved before the option (all image-first) still resume
        del values["question_first"]
    if not settings.arithmetic_pairs:  # likewise for the states saved before arithmetic pairs
        del values["arithmetic_pairs"]
    if settings.init_from:
        values["init_from"] = _file_digest(Path(settings.init_from) / "model.safetensors")
    if settings.vision_from:
        values["vision_from"] = _file_digest(Path(settings.vision_from) / "model.safetensors")
    else:  # the states saved before the option still resume
        del values["vision_from"]
    return json.loads(json.dumps(values, default=str))


def checkpoint_folder(out: str | Path, settings: RecipeSettings) -> Path:
    out = Path(out)
    return Path(settings.checkpoint_dir) if settings.checkpoint_dir else out.parent / f"{out.name}.checkpoint"


def check_settings(settings: RecipeSettings) -> None:
    """UserInputError for combinations that cannot run (before anything is built or rendered)."""
    if settings.stage not in STAGES:
        raise UserInputError(f"--stage must be one of {STAGES}, got {settings.stage!r}")
    if settings.grow_vision_depth is not None and not settings.init_from:
        raise UserInputError(
            "--grow-vision-depth: growing the vision tower needs a trained folder to grow (--init-from)"
        )
    if settings.grow_text_layers is not None and not settings.init_from:
        raise UserInputError(
            "--grow-text-layers: growing the decoder needs a trained folder to grow (--init-from)"
        )
    if settings.stage == "vision" and (settings.train.freeze_vision or settings.train.vision_aux_weight):
        raise UserInputError(
            "the vision stage trains the tower on dense labels: --freeze-vision and "
            "--vision-aux-weight belong to language stages"
        )
    if settings.fresh_decoder and not settings.init_from:
        raise UserInputError("--fresh-decoder keeps the vision tower of a trained folder: it needs --init-from")
    built_here = settings.fresh_decoder or not settings.init_from
    if not built_here and (settings.rope_theta is not None or settings.mrope_section is not None
                           or settings.text_layers is not None):
        raise UserInputError(
            "--rope-theta / --mrope-section / --text-layers shape a decoder built by this stage: use them "
            "without --init-from, or with --init-from and --fresh-decoder"
        )
    if settings.vision_from and not (settings.init_from and settings.stage == "language"):
        raise UserInputError("--vision-from puts a tower under a trained decoder: it needs --init-from (a language stage)")
    if settings.vision_from and (settings.fresh_decoder or settings.grow_vision_depth is not None):
        raise UserInputError(
            "--vision-from takes FOLDER's tower as it is: not with --fresh-decoder (use --init-from FOLDER "
            "--fresh-decoder) or --grow-vision-depth"
        )
    if settings.fresh_decoder and (settings.grow_text_layers is not None or settings.grow_vision_depth is not None):
        raise UserInputError("--fresh-decoder builds a new decoder: use --text-layers, not --grow-* flags")
    check_float(settings.question_first, "--question-first", min=0, max=1)
    if settings.arithmetic_pairs and not settings.minimal_pairs:
        raise UserInputError("--arithmetic-pairs adds arithmetic to the minimal pairs: give --minimal-pairs too")
    if settings.stage == "vision" and settings.question_first:
        raise UserInputError("--question-first orders the prompts of a language stage; the vision stage has none")
    if settings.train.stop_after is not None and settings.train.stop_after < 1:
        raise UserInputError(f"--stop-after must be a positive step, got {settings.train.stop_after}")


def build_untrained(
    seed: int,
    image_size: int = IMAGE_SIZE,
    rope_theta: float = arch.ROPE_THETA,
    mrope_section: list[int] | None = None,
    text_layers: int | None = None,
):
    """(tokenizer, processor, freshly initialised model) of the recipe (the decoder's M-RoPE
    and depth as `arch.build_config` takes them)."""
    tokenizer = build_tokenizer(vocabulary_words())
    processor = assemble_processor(tokenizer, build_image_processor(image_size))
    model = arch.build_model(arch.build_config(tokenizer, rope_theta, mrope_section, text_layers), seed)
    return tokenizer, processor, model


def build_decoder_on_tower(donor, tokenizer, settings: RecipeSettings):
    """A fresh model (a decoder seeded by settings.seed, with the settings' M-RoPE and depth)
    whose vision tower and merger are `donor`'s, weights copied."""
    config = arch.build_config(tokenizer, settings.rope_theta or arch.ROPE_THETA, settings.mrope_section,
                               settings.text_layers)
    config.vision_config = donor.config.vision_config
    return with_tower_of(arch.build_model(config, settings.seed), donor)


def with_tower_of(model, donor):
    """`model` with `donor`'s vision tower and merger, weights copied (the decoder untouched).

    Raises UserInputError when the two vision architectures differ."""
    ours, theirs = model.config.vision_config.to_dict(), donor.config.vision_config.to_dict()
    differ = sorted(k for k in ours.keys() | theirs.keys() if k != "_name_or_path" and ours.get(k) != theirs.get(k))
    if differ:
        raise UserInputError(
            f"--vision-from: its vision tower differs from --init-from's in {', '.join(differ)}; "
            "give a folder whose tower has the same architecture"
        )
    model.model.visual.load_state_dict(donor.model.visual.state_dict())
    return model


def load_for_continuation(folder: str | Path, image_size: int | None = None):
    """(tokenizer, processor, model) of a folder the recipe wrote, to train it further, at
    the folder's image size or at `image_size` (Qwen's vision tower takes any grid).

    Raises ValueError if its vocabulary is not the recipe's current one (token ids would
    no longer match the data)."""
    from transformers import AutoImageProcessor, AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    tokenizer = build_tokenizer(vocabulary_words())
    if AutoTokenizer.from_pretrained(folder).get_vocab() != tokenizer.get_vocab():
        raise UserInputError(f"{folder}: its tokenizer differs from the recipe's vocabulary; cannot continue it")
    if image_size is None:
        image_size = image_size_of(AutoImageProcessor.from_pretrained(folder))
    processor = assemble_processor(tokenizer, build_image_processor(image_size))
    model = from_pretrained_checked(Qwen2_5_VLForConditionalGeneration, str(folder), dtype=torch.float32)
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
        "rope_theta": float(text.rope_parameters.get("rope_theta", arch.ROPE_THETA)),
        "vocab_size": len(processor.tokenizer),
    }


def _normalised(mix: dict[str, float]) -> dict[str, float]:
    total = sum(mix.values())
    return {name: weight / total for name, weight in mix.items()}


def data_record(settings: RecipeSettings, held_out_per_source: int | None = None) -> dict:
    """A stage summary's "data": the training set's settings and the held-out evaluation's size."""
    return {
        "n_examples": settings.n_examples,
        "mix": _normalised(settings.mix or TRAINING_MIX),
        "max_objects": settings.max_objects,
        "held_out_per_source": settings.held_out_per_source if held_out_per_source is None else held_out_per_source,
        "held_out_size": DEFAULT_SIZE,
    }


def training_record(settings: RecipeSettings, training: dict, extra: dict) -> dict:
    """A stage summary's "training": every setting that changes the trained weights (the model
    card writes each one back as a `vlens zoo train` flag: model_card.stage_command), then what
    the run measured (`training`: steps done, wall time, final loss; `extra`: probes, dense)."""
    return {
        "stage": settings.stage,
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
        "grow_text_layers": settings.grow_text_layers,
        "vision_aux_weight": settings.train.vision_aux_weight,
        "freeze_vision": settings.train.freeze_vision,
        "fresh_decoder": settings.fresh_decoder,
        "vision_from": settings.vision_from,
        "text_layers": settings.text_layers,
        "rope_theta": settings.rope_theta,
        "mrope_section": settings.mrope_section,
        "minimal_pairs": settings.minimal_pairs,
        "arithmetic_pairs": settings.arithmetic_pairs,
        "question_first": settings.question_first,
        "wall_time_s": training["wall_time_s"],
        "final_loss": training["final_loss"] if training["final_loss"] is not None else float("nan"),
        **extra,
    }


def _tower_lineage(settings: RecipeSettings) -> dict:
    """For a --vision-from stage, the stages that trained the tower it took (the card's commands
    reproduce them too)."""
    return {"vision_from_stages": previous_stages(settings.vision_from)} if settings.vision_from else {}


def _summary(
    settings: RecipeSettings, model, processor, training: dict, evaluation: dict, status: str, extra: dict
) -> dict:
    return {
        "status": status,
        "config": describe_config(model, processor),
        "parameters": arch.parameter_count(model),
        "data": data_record(settings, evaluation.get("held_out_per_source")),
        "training": training_record(settings, training, extra | _tower_lineage(settings)),
        "evaluation": evaluation,
        "previous_stages": previous_stages(settings.init_from) if settings.init_from else [],
    }


def write_outputs(folder: Path, model, processor, summary: dict, log_path: Path | None = None) -> None:
    """The model folder's files: HF model and processor, MODEL_CARD.md, evaluation.json and
    (when given) the training log."""
    save_model_folder(model, processor, folder)  # safetensors are written from any device
    write_model_card(summary, folder)
    (folder / "evaluation.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    if log_path is not None and log_path.is_file():
        shutil.copy2(log_path, folder / TRAINING_LOG)


def _dense_held_out(per_source: int, size: int) -> tuple[ImageStore, torch.Tensor, list[int]]:
    """Held-out images of every training source (the data module's renderer) with their
    dense labels and object counts, for the vision stage's measurements."""
    store, labels, counts = ImageStore(size), [], []
    for image, record in held_out_samples(per_source, list(TRAINING_MIX)):
        store.append(to_model_image(image, size))
        labels.append(dense_labels(id_map_of(record), record["objects"], size // CELL))
        counts.append(len(record["objects"]))
    return store, torch.from_numpy(np.stack(labels)), counts


def _prepare_state(out: Path, settings: RecipeSettings) -> TrainingState:
    """The run's checkpoint folder, after deciding what to do with a state already there."""
    directory = checkpoint_folder(out, settings)
    state = TrainingState(directory, fingerprint(settings), settings.checkpoint_every)
    exists = state.path is not None and state.path.is_file()
    if exists and not settings.resume:
        if not settings.overwrite:
            raise UserInputError(
                f"{directory} holds the saved state of an unfinished run; pass --resume to continue it "
                "or --overwrite to discard it and start afresh"
            )
        shutil.rmtree(directory)
    if settings.resume:
        state.load()  # a state of another run is an error now, before anything is rendered
        if not exists:
            logger.info("no saved state in %s: starting from step 0", directory)
    return state


def render_key(settings: RecipeSettings, processor) -> dict:
    """What the rendered training set depends on: the data settings and the processor (its image
    size; the tokenizer is the recipe's vocabulary). Not the weights a stage starts from, so a
    stage's set can be rendered while the stage before it still trains (`render_only`)."""
    vocabulary = json.dumps(sorted(processor.tokenizer.get_vocab().items()))
    values = {
        "format": 1,
        "n_examples": settings.n_examples,
        "seed": settings.seed,
        "mix": settings.mix,
        "max_objects": settings.max_objects,
        "minimal_pairs": settings.minimal_pairs,
        "question_first": settings.question_first,
        "image_size": image_size_of(processor),
        "vocabulary": hashlib.sha256(vocabulary.encode()).hexdigest()[:16],
    }
    if settings.arithmetic_pairs:  # absent when off: sets rendered before the option keep their keys
        values["arithmetic_pairs"] = True
    return json.loads(json.dumps(values, default=str))


def cached_training_set(directory: Path, settings: RecipeSettings, processor, progress: bool,
                        fingerprint_of_run: dict | None = None):
    """The stage's pre-rendered training set, kept in the checkpoint folder `directory` so that a
    resumed run does not render it again (rendering is deterministic, so either way it is the
    same). A saved set is used when its render key matches (or, for a set saved before render
    keys, the run's whole fingerprint); otherwise it is rendered again and replaced."""
    path = directory / RENDERED_FILE
    if path.is_file():
        fix = "delete it (it is rendered again) or pass --overwrite"
        saved = load_tensor_file(path, "the rendered training set", fix)  # plain data only: never runs code
        if not isinstance(saved, dict) or not ({"fingerprint", "render_key"} & set(saved)):
            raise UserInputError(f"the rendered training set {path} is not one this recipe writes: {fix}")
        same_run = fingerprint_of_run is not None and saved.get("fingerprint") == fingerprint_of_run
        if same_run or saved.get("render_key") == render_key(settings, processor):
            try:
                return RenderedSet.from_plain(saved["rendered"])
            except (KeyError, TypeError, ValueError) as error:
                raise UserInputError(f"the rendered training set {path} is damaged ({error!r}): {fix}") from None
    rendered = render_training_set(
        processor, settings.n_examples, settings.seed, progress, settings.mix, settings.max_objects,
        PairOptions(settings.minimal_pairs, settings.arithmetic_pairs), settings.question_first,
    )
    directory.mkdir(parents=True, exist_ok=True)
    key = render_key(settings, processor)
    atomic_write(path, lambda staging: torch.save({"render_key": key, "rendered": rendered.to_plain()}, staging))
    return rendered


def render_only(out: str | Path, settings: RecipeSettings, progress: bool = True) -> Path:
    """Render the training set of the stage `out` into its checkpoint folder and stop; the stage's
    run later reads it (same data settings and image size) instead of rendering. The processor is
    the recipe's at settings.image_size, else at the image size of settings.init_from, which may
    be any folder with the stage's image size (the stage it will start from need not exist yet)."""
    check_settings(settings)
    for flag, given in (("--resume", settings.resume), ("--stop-after", settings.train.stop_after is not None)):
        if given:
            raise UserInputError(f"--render-only renders and trains nothing: drop {flag}")
    image_size = settings.image_size
    if image_size is None and settings.init_from:
        image_size = folder_image_size(settings.init_from)
        if image_size is None:
            raise UserInputError(
                f"--render-only reads the image size from --init-from, but {settings.init_from} holds no "
                "processor config that pins a square size: pass --image-size, or --init-from a model folder of "
                "the stage's size"
            )
    processor = assemble_processor(build_tokenizer(vocabulary_words()),
                                   build_image_processor(image_size or IMAGE_SIZE))
    directory = checkpoint_folder(out, settings)
    cached_training_set(directory, settings, processor, progress)
    return directory / RENDERED_FILE


def run_recipe(out: str | Path, settings: RecipeSettings, progress: bool = True) -> dict:
    """Train one stage of the embedded model into the folder `out`; returns the summary.

    `out` receives the HF model folder, MODEL_CARD.md, evaluation.json and the training
    log, all at once at the end (an existing folder only with settings.overwrite). Until
    then the run's resumable state, log and latest snapshot live in the checkpoint folder
    (`checkpoint_folder`), which is removed once the schedule is complete and written.
    Raises loop.Interrupted when stopped by Ctrl-C / SIGTERM (state saved).
    """
    out = Path(out)
    check_settings(settings)
    check_output_folder(out, "--out", overwrite=settings.overwrite, model_folder=True)
    state = _prepare_state(out, settings)
    checkpoints = state.directory
    assert checkpoints is not None  # _prepare_state always names the folder
    torch.set_num_threads(settings.threads)
    settings.train.seed = settings.seed
    if settings.init_from:
        tokenizer, processor, model = load_for_continuation(settings.init_from, settings.image_size)
        if settings.fresh_decoder:
            model = build_decoder_on_tower(model, tokenizer, settings)
        if settings.vision_from:
            model = with_tower_of(model, load_for_continuation(settings.vision_from, settings.image_size)[2])
        if settings.grow_vision_depth is not None:
            model = grow_vision_tower(model, settings.grow_vision_depth, settings.seed)
        if settings.grow_text_layers is not None:
            model = grow_decoder(model, settings.grow_text_layers, settings.seed)
    else:
        tokenizer, processor, model = build_untrained(
            settings.seed, settings.image_size or IMAGE_SIZE, settings.rope_theta or arch.ROPE_THETA,
            settings.mrope_section, settings.text_layers,
        )
    model.to(settings.device)
    rendered = cached_training_set(checkpoints, settings, processor, progress, state.fingerprint)
    log_path = checkpoints / TRAINING_LOG
    start = time.time()
    quick = min(settings.checkpoint_held_out_per_source, settings.held_out_per_source)  # per source

    def snapshot(step: int, evaluation: dict, extra: dict) -> None:
        training = {"steps": step, "wall_time_s": round(time.time() - start, 1), "final_loss": None}
        status = f"intermediate checkpoint at step {step} of {settings.train.steps} (quick evaluation)"
        summary = _summary(settings, model, processor, training, evaluation, status, extra)
        with atomic_folder(checkpoints / SNAPSHOT, overwrite=True, name="snapshot") as folder:
            write_outputs(folder, model, processor, summary, log_path)

    if settings.stage == "vision":
        held_out = _dense_held_out(quick, image_size_of(processor))
        training = pretrain_vision(
            model,
            rendered.images,
            rendered.cell_labels,
            settings.train,
            log_path,
            state,
            held_out,
            progress,
            snapshot=lambda step, numbers: snapshot(step, {}, {"dense": numbers}),
        )
        evaluation, extra = {}, {"dense": training["held_out"]}
    else:
        samples = held_out_samples(quick) if settings.checkpoint_every else []

        def on_checkpoint(step: int) -> dict:
            evaluation = evaluate_samples(model, processor, samples)
            evaluation["held_out_per_source"] = quick
            snapshot(step, evaluation, {})
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
            progress=progress,
            cell_labels=rendered.cell_labels,
            state=state,
            partners=rendered.partners,
        )
        del rendered
        evaluation = evaluate_samples(model, processor, held_out_samples(settings.held_out_per_source))
        evaluation["held_out_per_source"] = settings.held_out_per_source
        extra = {}
    extra["probe"] = probe_tower(model, processor, settings.probe_scenes)
    status = (
        "final"
        if training["steps"] == settings.train.steps
        else (
            f"checkpoint at step {training['steps']} of a {settings.train.steps}-step schedule "
            "(continue it: the same command with --resume --overwrite and without --stop-after)"
        )
    )
    summary = _summary(settings, model, processor, training, evaluation, status, extra)
    with log_path.open("a") as log:
        log.write(json.dumps(final_log_event(summary)) + "\n")
    with atomic_folder(out, overwrite=settings.overwrite, name="--out") as folder:
        write_outputs(folder, model, processor, summary, log_path)
    if training["steps"] == settings.train.steps:
        shutil.rmtree(checkpoints, ignore_errors=True)
    return summary


def final_log_event(summary: dict) -> dict:
    """The training log's last record: the held-out accuracy per source and the tower's probes."""
    numbers = {name: row["accuracy"] for name, row in summary["evaluation"].get("per_task", {}).items()}
    return {
        "event": "final",
        **numbers,
        "probe": summary["training"]["probe"],
        **({"dense": summary["training"]["dense"]} if "dense" in summary["training"] else {}),
    }
