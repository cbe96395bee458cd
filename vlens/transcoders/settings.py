"""What transcoder training does (`TranscoderTraining`); how a run goes is the SAE trainer's `TrainRun`."""

from __future__ import annotations

from dataclasses import dataclass

from vlens.sae.schedule import DECAYS
from vlens.transcoders.config import ACTIVATIONS, KINDS
from vlens.utils.errors import UserInputError
from vlens.utils.validation import check_choice, check_count, check_float


@dataclass(frozen=True)
class TranscoderTraining:
    """What to train, with which losses and schedule.

    Attributes:
        kind: "plt", "skip" (PLT + linear skip) or "clt" (cross-layer).
        activation: "relu" (L1 on decoder-norm-weighted activations), "topk", "jumprelu" (L0 penalty,
            straight-through threshold gradient as the SAE trainer's).
        d_tc: features per layer. k: TopK's active features per token and layer.
        l1_coefficient / l0_coefficient / jumprelu_bandwidth / jumprelu_init_threshold /
            sparsity_warmup_steps: the sparsity terms (as `vlens.sae.settings.SAETraining`).
        lr, warmup_steps, decay, lr_end_fraction: Adam and its schedule (`vlens.sae.schedule.lr_at`).
        total_tokens, batch_size, buffer_size: tokens in all, per step, held for shuffling.
        dead_window: tokens without firing that make a feature dead (reported, per layer).
        seed: initialisation and shuffling.
    """

    kind: str = "plt"
    activation: str = "relu"
    d_tc: int = 256
    k: int = 16
    l1_coefficient: float = 1e-3
    l0_coefficient: float = 1e-3
    jumprelu_bandwidth: float = 0.05
    jumprelu_init_threshold: float = 0.01
    sparsity_warmup_steps: int = 0
    lr: float = 1e-3
    warmup_steps: int = 20
    decay: str = "cosine"
    lr_end_fraction: float = 0.1
    total_tokens: int = 100_000
    batch_size: int = 256
    buffer_size: int = 4096
    dead_window: int = 20_000
    seed: int = 0

    def __post_init__(self) -> None:
        check_choice(self.kind, "kind", KINDS)
        check_choice(self.activation, "activation", ACTIVATIONS)
        check_choice(self.decay, "decay", DECAYS)
        for name in ("d_tc", "k", "total_tokens", "batch_size", "buffer_size", "dead_window"):
            check_count(getattr(self, name), name)
        for name in ("sparsity_warmup_steps", "warmup_steps"):
            check_count(getattr(self, name), name, min=0)
        for name in ("l1_coefficient", "l0_coefficient"):
            check_float(getattr(self, name), name, min=0)
        for name in ("lr", "jumprelu_bandwidth"):
            check_float(getattr(self, name), name, min=0, min_open=True)
        check_float(self.lr_end_fraction, "lr_end_fraction", min=0, max=1)
        if self.activation == "topk" and self.k > self.d_tc:
            raise UserInputError(f"k={self.k} is more than d_tc={self.d_tc}.")
        if self.buffer_size < 2 * self.batch_size:
            raise UserInputError(f"buffer_size ({self.buffer_size}) must be at least twice batch_size ({self.batch_size}).")
        if self.total_tokens < self.batch_size:
            raise UserInputError(f"total_tokens ({self.total_tokens}) is less than one batch ({self.batch_size}).")

    @property
    def steps(self) -> int:
        return self.total_tokens // self.batch_size
