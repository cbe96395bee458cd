"""SAE configurations: the fields SAELens writes in ``cfg.json``, one dataclass per architecture.

The base fields are SAELens's (``d_in``, ``d_sae``, ``dtype``, ``device``, ``apply_b_dec_to_input``,
``normalize_activations``, ``reshape_activations``) plus ``hook_name`` (SAELens 6 keeps it in
``metadata``; older layouts at the top level: `vlens.sae.saelens_format` reads and writes both).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import torch

from vlens.utils.errors import UserInputError

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}
# what an SAE does to its input at run time (SAELens's names); "expected_average_only_in" is a
# training-time scale SAELens folds into the weights, so inference treats it as "none"
NORMALIZATIONS = ("none", "expected_average_only_in", "constant_norm_rescale", "layer_norm")


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a config's ``dtype`` ("float32" or "torch.float32")."""
    key = str(name).removeprefix("torch.")
    if key not in DTYPES:
        raise UserInputError(f"Unknown SAE dtype {name!r}: use one of {', '.join(DTYPES)}.")
    return DTYPES[key]


@dataclass
class SAEConfig:
    """What every SAE architecture shares.

    Attributes:
        d_in: width of the activation it reads (for ``hook_z``: n_heads * d_head).
        d_sae: number of features.
        dtype, device: of its parameters ("float32", "cpu").
        apply_b_dec_to_input: subtract ``b_dec`` from the input before encoding.
        normalize_activations: one of `NORMALIZATIONS` (run-time input normalization).
        reshape_activations: "hook_z" when the hook's heads are flattened into ``d_in``, else "none".
        hook_name: the hook it was trained on (e.g. "blocks.2.hook_resid_post"), or None.
        metadata: SAELens's metadata (model_name, context_size, ...) and vlens's own (positions,
            trained_with), kept as read.
    """

    architecture: ClassVar[str] = ""

    d_in: int
    d_sae: int
    dtype: str = "float32"
    device: str = "cpu"
    apply_b_dec_to_input: bool = True
    normalize_activations: str = "none"
    reshape_activations: str = "none"
    hook_name: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("d_in", "d_sae"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserInputError(f"SAE config: {name} must be a positive int, got {value!r}.")
        torch_dtype(self.dtype)
        if self.normalize_activations not in NORMALIZATIONS:
            raise UserInputError(f"SAE config: normalize_activations {self.normalize_activations!r} is not supported "
                                 f"(vlens runs {', '.join(NORMALIZATIONS)}).")
        if self.reshape_activations not in ("none", "hook_z"):
            raise UserInputError(f"SAE config: reshape_activations must be 'none' or 'hook_z', "
                                 f"got {self.reshape_activations!r}.")

    def to_dict(self) -> dict[str, Any]:
        """Every field, plus ``architecture``."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["metadata"] = dict(self.metadata)
        out["architecture"] = self.architecture
        return out

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}


@dataclass
class StandardSAEConfig(SAEConfig):
    """ReLU SAE (trained with an L1 penalty on decoder-norm-weighted activations)."""

    architecture: ClassVar[str] = "standard"


@dataclass
class TopKSAEConfig(SAEConfig):
    """TopK SAE: the `k` largest pre-activations per token (after ReLU), the rest zero.

    rescale_acts_by_decoder_norm: select and report activations as if the decoder rows had unit norm
        (SAELens's field; activations are divided by the norms again before decoding).
    """

    architecture: ClassVar[str] = "topk"

    k: int = 100
    rescale_acts_by_decoder_norm: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.k, bool) or not isinstance(self.k, int) or not 1 <= self.k <= self.d_sae:
            raise UserInputError(f"TopK SAE config: k must be an int in [1, d_sae={self.d_sae}], got {self.k!r}.")


@dataclass
class JumpReLUSAEConfig(SAEConfig):
    """JumpReLU SAE: a feature is its ReLU pre-activation where that exceeds its learned threshold, else 0."""

    architecture: ClassVar[str] = "jumprelu"
