"""What a set of transcoders is: kind, activation, the layers it covers, widths (`TranscoderConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from vlens.sae.config import torch_dtype
from vlens.utils.errors import UserInputError
from vlens.utils.validation import check_choice, check_count

KINDS = ("plt", "skip", "clt")
ACTIVATIONS = ("relu", "topk", "jumprelu")


@dataclass
class TranscoderConfig:
    """A set of MLP transcoders, one encoder per covered layer.

    Attributes:
        kind: "plt" (per-layer: layer l's features write only layer l's MLP output), "skip" (per-layer
            plus a linear skip connection ``x @ W_skip``), "clt" (cross-layer: layer l's features write
            every covered layer l' >= l).
        activation: "relu", "topk" (the k largest pre-activations per token, after ReLU), "jumprelu"
            (a pre-activation above its feature's learned threshold).
        layers: the decoder layers covered, ascending (every MLP of the model for a full replacement).
        d_model: width of the MLP's input (the block's second norm's output) and output (`hook_mlp_out`).
        d_tc: features per layer.
        k: TopK's active features per token and layer.
        dtype: of the parameters.
        metadata: free-form (model name, training settings, where it was read from).
    """

    kind: str
    activation: str
    layers: tuple[int, ...]
    d_model: int
    d_tc: int
    k: int = 0
    dtype: str = "float32"
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_choice(self.kind, "kind", KINDS)
        check_choice(self.activation, "activation", ACTIVATIONS)
        self.layers = tuple(int(layer) for layer in self.layers)
        if not self.layers or list(self.layers) != sorted(set(self.layers)) or self.layers[0] < 0:
            raise UserInputError(f"transcoder layers must be distinct ascending layer indices, got {list(self.layers)}.")
        check_count(self.d_model, "d_model")
        check_count(self.d_tc, "d_tc")
        if self.activation == "topk":
            check_count(self.k, "k", max=self.d_tc)
        torch_dtype(self.dtype)

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def index(self, layer: int) -> int:
        """Position of decoder layer `layer` among the covered ones."""
        if layer not in self.layers:
            raise UserInputError(f"layer {layer} has no transcoder (covered: {list(self.layers)}).")
        return self.layers.index(layer)

    def targets(self, i: int) -> range:
        """The covered-layer indices that layer index i's features write to."""
        return range(i, self.n_layers) if self.kind == "clt" else range(i, i + 1)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["layers"] = list(self.layers)
        out["metadata"] = dict(self.metadata)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TranscoderConfig:
        names = {f.name for f in fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise UserInputError(f"transcoder config has unknown field(s) {sorted(unknown)}; fields: {sorted(names)}.")
        return cls(**{**data, "layers": tuple(data.get("layers", ()))})
