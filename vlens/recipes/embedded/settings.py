"""The recipe's settings, as plain dataclasses (no torch import: the CLI reads the defaults
when it builds its parser)."""

from __future__ import annotations

from dataclasses import dataclass, field

TRAINING_LOG = "training_log.jsonl"  # the JSONL training log of a model folder


@dataclass
class Schedule:
    """Optimisation hyper-parameters shared by the recipe's training loops."""

    steps: int = 3500
    batch_size: int = 48
    learning_rate: float = 2e-3
    warmup_steps: int = 200
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0
    log_every: int = 25
    stop_after: int | None = None  # stop early at this step; the schedule still spans `steps`

    @property
    def steps_to_run(self) -> int:
        return self.steps if self.stop_after is None else min(self.stop_after, self.steps)


@dataclass
class TrainSettings(Schedule):
    """A language stage's optimisation settings (defaults: the recipe's first language stage)."""

    vision_aux_weight: float = 0.0  # > 0: add the dense vision-token loss (vision_aux)
    freeze_vision: bool = False  # keep the vision tower and merger fixed


@dataclass
class RecipeSettings:
    """Everything that determines the trained model (with the torch thread count), and how
    the run is kept (checkpoints, resuming, overwriting)."""

    seed: int = 0
    n_examples: int = 30_000
    threads: int = 1
    held_out_per_source: int = 300
    checkpoint_every: int = 200  # steps between resumable checkpoints (with a quick evaluation)
    checkpoint_held_out_per_source: int = 40  # quick evaluations (at most held_out_per_source)
    mix: dict[str, float] | None = None  # source weights; default TRAINING_MIX
    init_from: str | None = None  # continue from a trained folder (a later stage) instead of scratch
    max_objects: int | None = None  # curriculum: cap the objects of non-counting tasks (None: up to 10)
    grow_vision_depth: int | None = None  # with init_from: add identity-initialised vision blocks first
    grow_text_layers: int | None = None  # with init_from: interleave identity-initialised decoder layers
    device: str = "cpu"  # e.g. "cuda": train and evaluate there (bitwise determinism: CPU only)
    image_size: int | None = None  # square input px; None: IMAGE_SIZE, or the continued folder's
    stage: str = "language"  # "vision": pretrain the tower alone on dense labels
    checkpoint_dir: str | None = None  # default: OUT.checkpoint next to the output folder
    resume: bool = False  # continue the saved state in checkpoint_dir
    overwrite: bool = False  # replace an existing output folder / discard a saved state
    probe_scenes: int = 600  # held-out scenes of the tower probes measured after the stage
    # the decoder's M-RoPE for a decoder built here (from scratch or --fresh-decoder); None: the
    # architecture's (theta 1e4, sections [2, 3, 3]: the width axis barely turns, RESULTS.md issue 40)
    rope_theta: float | None = None
    mrope_section: list[int] | None = None
    fresh_decoder: bool = False  # with init_from: keep its vision tower and merger, start a new decoder
    text_layers: int | None = None  # depth of a decoder built here (None: the architecture's 4)
    # with init_from: put this folder's vision tower and merger under init_from's decoder (a tower trained apart)
    vision_from: str | None = None
    minimal_pairs: bool = False  # binding samples with their minimal-pair partner in the same batch
    # with minimal_pairs: arithmetic samples paired too (the same image, the other operation: sum <-> difference)
    arithmetic_pairs: bool = False
    # probability that a training sample puts its question before the image (fixed per sample by its
    # seed; its minimal-pair partner keeps the order); 0: always after, the order of every stage before
    question_first: float = 0.0
    train: TrainSettings = field(default_factory=TrainSettings)
