"""The trainer's settings: what to train (`SAETraining`) and how to run it (`TrainRun`)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from vlens.sae.schedule import DECAYS
from vlens.utils.errors import UserInputError
from vlens.utils.validation import check_choice, check_count, check_float

DEAD_FEATURE_MODES = ("auto", "aux", "resample", "none")


@dataclass(frozen=True)
class SAETraining:
    """What to train, and with which losses and schedule.

    Attributes:
        architecture: "standard" (ReLU, L1 on decoder-norm-weighted activations), "topk", "jumprelu".
        d_sae: number of features. k: TopK's active features per token.
        l1_coefficient: standard: weight of the L1 penalty. l0_coefficient, jumprelu_bandwidth,
            jumprelu_init_threshold: JumpReLU's L0 penalty, pseudo-derivative width, initial threshold.
        sparsity_warmup_steps: the sparsity penalty ramps from 0 over these steps.
        lr, warmup_steps, decay, lr_end_fraction: Adam's learning rate, its linear warm-up, then
            "cosine" / "linear" decay to lr_end_fraction * lr (or "constant").
        total_tokens, batch_size, buffer_size: activations seen in all, per step, held for shuffling.
        dead_features: "aux" (TopK's auxiliary loss: dead features reconstruct the residual),
            "resample" (re-initialise dead features on badly reconstructed inputs), "none"; "auto":
            aux for topk, resample otherwise. dead_window: tokens without firing that make a feature dead.
        aux_k, aux_coefficient: the auxiliary loss's number of dead features and weight.
        resample_every: steps between resampling checks.
        seed: initialisation, shuffling and resampling.
    """

    architecture: str = "topk"
    d_sae: int = 512
    k: int = 16
    l1_coefficient: float = 5.0
    l0_coefficient: float = 1.0
    jumprelu_bandwidth: float = 0.05
    jumprelu_init_threshold: float = 0.01
    sparsity_warmup_steps: int = 0
    lr: float = 1e-3
    warmup_steps: int = 50
    decay: str = "cosine"
    lr_end_fraction: float = 0.1
    total_tokens: int = 200_000
    batch_size: int = 512
    buffer_size: int = 8192
    dead_features: str = "auto"
    dead_window: int = 20_000
    aux_k: int = 64
    aux_coefficient: float = 1 / 32
    resample_every: int = 200
    seed: int = 0

    def __post_init__(self) -> None:
        check_choice(self.architecture, "architecture", ("standard", "topk", "jumprelu"))
        check_choice(self.decay, "decay", DECAYS)
        check_choice(self.dead_features, "dead_features", DEAD_FEATURE_MODES)
        for name in ("d_sae", "k", "total_tokens", "batch_size", "buffer_size", "dead_window", "aux_k", "resample_every"):
            check_count(getattr(self, name), name)
        for name in ("sparsity_warmup_steps", "warmup_steps"):
            check_count(getattr(self, name), name, min=0)
        for name in ("l1_coefficient", "l0_coefficient", "aux_coefficient"):
            check_float(getattr(self, name), name, min=0)
        for name in ("lr", "jumprelu_bandwidth"):
            check_float(getattr(self, name), name, min=0, min_open=True)
        check_float(self.lr_end_fraction, "lr_end_fraction", min=0, max=1)
        if self.architecture == "topk" and self.k > self.d_sae:
            raise UserInputError(f"k={self.k} is more than d_sae={self.d_sae}.")
        if self.buffer_size < 2 * self.batch_size:
            raise UserInputError(f"buffer_size ({self.buffer_size}) must be at least twice batch_size ({self.batch_size}).")
        if self.total_tokens < self.batch_size:
            raise UserInputError(f"total_tokens ({self.total_tokens}) is less than one batch ({self.batch_size}).")

    @property
    def steps(self) -> int:
        return self.total_tokens // self.batch_size

    @property
    def dead_mode(self) -> str:
        if self.dead_features != "auto":
            return self.dead_features
        return "aux" if self.architecture == "topk" else "resample"


@dataclass(frozen=True)
class TrainRun:
    """How a training run goes: checkpoints, resume, progress, logging.

    Attributes:
        checkpoint_dir: where the full state is saved every `checkpoint_every` steps (and at the end).
        resume: continue from the state in checkpoint_dir (identical weights to an uninterrupted run).
        stop_after: end after this many steps (the state is saved; continue with resume).
        progress: a tqdm bar. log_every: steps between logged metrics (only they are computed).
        final_checkpoint: save the state in checkpoint_dir at the end too (False: only when Ctrl-C or an
            error stops the run, so that resume continues it).
    """

    checkpoint_dir: str | os.PathLike | None = None
    checkpoint_every: int = 0
    resume: bool = False
    stop_after: int | None = None
    progress: bool = False
    log_every: int = 25
    final_checkpoint: bool = True

    def __post_init__(self) -> None:
        check_count(self.checkpoint_every, "checkpoint_every", min=0)
        check_count(self.log_every, "log_every")
        check_count(self.stop_after, "stop_after", allow_none=True)
        if (self.resume or self.stop_after is not None) and self.checkpoint_dir is None:
            raise UserInputError("resume and stop_after need a checkpoint_dir.")
