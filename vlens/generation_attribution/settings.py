"""`GenerationAttributionSettings`: what a per-generated-token attribution over the image computes."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from vlens.utils.errors import UserInputError
from vlens.utils.validation import check_choice, check_count

BASELINES = ("mean", "blank", "zero")  # or a VLMInputs of the same prompt with another image
METRICS = ("logprob", "logit")


@dataclass(frozen=True)
class GenerationAttributionSettings:
    """How each generated token is attributed to the image (docs/generation.md, "Which image tokens
    each generated token used").

    max_new_tokens: tokens generated (greedy, stopping at the end token) when no continuation is given.
    metric: what is attributed for generated token k: "logprob" (log p(y_k | prompt, y_<k)) or "logit"
        (its logit), read at the position that predicts it, teacher-forced over prompt + output.
    baseline: what an image token is patched to: "mean" (the mean of its image's tokens: mean-ablated
        image tokens), "blank" (the same prompt with every pixel at the processor's normalisation mean: a
        uniform image of the same size and token layout), "zero" (zero inputs).
        `attribute_generation` also takes the VLMInputs of the same prompt with another image.
    region_size: exact patching patches square blocks of region_size x region_size tokens of each
        image's grid (1: every token on its own); the estimates are summed over the same blocks.
    exact: also patch each region exactly (one forward row per region), the ground truth of the
        estimates.
    lens: also read the logit lens of each generated token through depth.
    max_batch: rows per forward of the exact patching.
    """

    max_new_tokens: int = 16
    metric: str = "logprob"
    baseline: str = "mean"
    region_size: int = 1
    exact: bool = True
    lens: bool = True
    max_batch: int = 8

    def check(self) -> GenerationAttributionSettings:
        """Refuse settings that cannot run, naming the fix."""
        check_count(self.max_new_tokens, "max_new_tokens")
        check_choice(self.metric, "metric", METRICS)
        check_choice(self.baseline, "baseline", BASELINES)
        check_count(self.region_size, "region_size")
        check_count(self.max_batch, "max_batch")
        for name in ("exact", "lens"):
            if not isinstance(getattr(self, name), bool):
                raise UserInputError(f"{name} must be True or False, got {getattr(self, name)!r}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
