"""Which experts image tokens use and which text tokens use, per mixture-of-experts layer.

For each MoE layer l, region r ("image": image placeholder tokens; "text": every other real token)
and expert e, over a set of inputs:

- ``counts[l, r, e]``: how many tokens of region r have e among their top-k experts;
- ``share(r)[l, e] = counts / tokens[r]``: the share of region r's tokens that chose e (it sums to k
  over the experts);
- ``weight_share(r)[l, e]``: the mean routing weight e receives over region r's tokens (0 where not
  chosen; it sums to 1 over the experts): region r's routing distribution;
- ``divergence()[l]``: the Jensen-Shannon divergence (bits, 0..1) between the image and the text
  routing distributions of layer l: 0 when both regions use the experts alike, 1 when they use
  disjoint experts;
- ``preference(e)``: log2 of the image share over the text share (with +1 token smoothing).

Padding positions are never counted. Counts are exact integers, so the statistics of several runs add up.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from vlens.core.inputs import VLMInputs
from vlens.utils.errors import UserInputError
from vlens.utils.results import Result
from vlens.viz.routing import routing_figure

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM


REGIONS: tuple[str, ...] = ("image", "text")


@dataclass
class RoutingStatistics(Result):
    """Expert routing by token region (module docstring).

    Attributes:
        layers: the MoE layers (rows of every [n_layers, ...] tensor here, in this order).
        n_experts, top_k: experts per layer, experts chosen per token.
        counts: [n_layers, n_regions, n_experts] tokens of each region whose top-k held the expert.
        weight_sums: [n_layers, n_regions, n_experts] the routing weights those tokens gave it.
        tokens: [n_regions] real tokens of each region; n_examples: inputs rows seen.
    """

    layers: list[int]
    n_experts: int
    top_k: int
    counts: Float[Tensor, "n_layers n_regions n_experts"]
    weight_sums: Float[Tensor, "n_layers n_regions n_experts"]
    tokens: Float[Tensor, "n_regions"]
    n_examples: int
    regions: tuple[str, ...] = REGIONS
    settings: dict = field(default_factory=dict)

    kind: ClassVar[str] = "routing_statistics"
    saved_dims: ClassVar[dict[str, str]] = {"layers": "n_layers", "regions": "n_regions"}  # checked when a file is read

    def _region(self, region: str) -> int:
        if region not in self.regions:
            raise UserInputError(f"unknown region {region!r}: use one of {self.regions}")
        return self.regions.index(region)

    def share(self, region: str) -> Float[Tensor, "n_layers n_experts"]:
        """Share of the region's tokens whose top-k holds each expert (NaN: the region had no token)."""
        r = self._region(region)
        total = float(self.tokens[r])
        return self.counts[:, r].double() / total if total else torch.full(self.counts[:, r].shape, math.nan)

    def weight_share(self, region: str) -> Float[Tensor, "n_layers n_experts"]:
        """The region's routing distribution: mean routing weight per expert (sums to 1 over experts)."""
        r = self._region(region)
        total = float(self.tokens[r])
        return self.weight_sums[:, r].double() / total if total else torch.full(self.counts[:, r].shape, math.nan)

    def divergence(self, a: str = "image", b: str = "text") -> Float[Tensor, "n_layers"]:
        """Jensen-Shannon divergence (bits) between two regions' routing distributions, per layer."""
        p, q = self.weight_share(a), self.weight_share(b)
        p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
        m = (p + q) / 2

        def kl(x: Tensor, y: Tensor) -> Tensor:
            return torch.where(x > 0, x * torch.log2(x / y.clamp(min=1e-300)), torch.zeros_like(x)).sum(-1)

        return (kl(p, m) + kl(q, m)) / 2

    def preference(self, a: str = "image", b: str = "text") -> Float[Tensor, "n_layers n_experts"]:
        """log2 of the share of region a's tokens choosing each expert over region b's (+1 token smoothing)."""
        ra, rb = self._region(a), self._region(b)
        share_a = (self.counts[:, ra].double() + 1) / (float(self.tokens[ra]) + 1)
        share_b = (self.counts[:, rb].double() + 1) / (float(self.tokens[rb]) + 1)
        return torch.log2(share_a / share_b)

    def top_experts(self, region: str, layer: int, n: int = 5) -> list[tuple[int, float]]:
        """The n experts of `layer` (a model layer index) most often chosen by the region: (expert, share)."""
        if layer not in self.layers:
            raise UserInputError(f"layer {layer} is not a MoE layer here ({self.layers})")
        share = self.share(region)[self.layers.index(layer)]
        order = torch.argsort(torch.nan_to_num(share, nan=-1.0), descending=True, stable=True)[:n]
        return [(int(e), float(share[e])) for e in order]

    def to_dict(self) -> dict:
        def grid(t: Tensor) -> list:
            return [[None if v != v else round(float(v), 6) for v in row] for row in t.tolist()]

        return {
            "layers": self.layers, "n_experts": self.n_experts, "top_k": self.top_k, "regions": list(self.regions),
            "n_examples": self.n_examples, "tokens": {r: int(t) for r, t in zip(self.regions, self.tokens, strict=True)},
            "counts": self.counts.long().tolist(), "weight_sums": grid(self.weight_sums.flatten(0, 1)),
            "share": {r: grid(self.share(r)) for r in self.regions},
            "weight_share": {r: grid(self.weight_share(r)) for r in self.regions},
            "divergence_bits": [None if v != v else round(float(v), 6) for v in self.divergence().tolist()]
            if {"image", "text"} <= set(self.regions) else None,
            "definitions": {
                "share": "share of the region's real tokens whose top-k experts include the expert (sums to top_k)",
                "weight_share": "mean routing weight of the expert over the region's tokens (sums to 1)",
                "divergence_bits": "Jensen-Shannon divergence (base 2) of the image and text weight_share, per layer",
            },
            "settings": self.settings,
        }

    @classmethod
    def from_dict(cls, data: dict) -> RoutingStatistics:
        regions = tuple(data["regions"])
        counts = torch.tensor(data["counts"], dtype=torch.float64)
        # [n_layers * n_regions, n_experts] as saved: its layers from its own rows, so that a layers list or counts
        # of another length is the one field that disagrees with the rest (`saved_dims`)
        sums = torch.tensor([[math.nan if v is None else v for v in row] for row in data["weight_sums"]],
                            dtype=torch.float64).view(-1, *counts.shape[1:])
        return cls(layers=list(data["layers"]), n_experts=data["n_experts"], top_k=data["top_k"],
                   counts=counts, weight_sums=sums,
                   tokens=torch.tensor([data["tokens"][r] for r in regions], dtype=torch.float64),
                   n_examples=data["n_examples"], regions=regions, settings=data.get("settings", {}))

    def plot(self, title: str = "Expert routing by token region"):
        """Per region a layer x expert heatmap of `share`, and the image-text divergence per layer."""
        shares = torch.stack([self.share(r) for r in self.regions]).float()
        divergence = self.divergence().float() if {"image", "text"} <= set(self.regions) else None
        return routing_figure(shares, self.regions, self.layers, divergence, title=title)

    def summary(self, n: int = 3) -> str:
        """Per layer: the image-text divergence and the regions' most chosen experts."""
        divergence = self.divergence()
        lines = [f"routing of {int(self.tokens.sum())} tokens ({', '.join(f'{r} {int(t)}' for r, t in zip(self.regions, self.tokens, strict=True))}) "
                 f"over {self.n_examples} examples; top-{self.top_k} of {self.n_experts} experts"]
        for i, layer in enumerate(self.layers):
            tops = "; ".join(f"{r}: " + ", ".join(f"E{e} {s:.2f}" for e, s in self.top_experts(r, layer, n))
                             for r in self.regions)
            lines.append(f"  L{layer}: JS(image, text) {float(divergence[i]):.3f} bits | {tops}")
        return "\n".join(lines)


def routing_statistics(model: HookedVLM, batches: Iterable[VLMInputs], progress: bool = True) -> RoutingStatistics:
    """Count, per MoE layer, which experts the image and the text tokens of `batches` are routed to.

    batches: `VLMInputs` (e.g. `model.prepare(images=..., prompts=...)`), each with token regions.
    """
    cfg = model.cfg
    layers = list(cfg.moe_layers)
    if not layers:
        raise UserInputError(f"{cfg.architecture} has no mixture-of-experts layer: routing statistics need a MoE "
                             "model (Qwen3-VL-MoE, Qwen3.5-MoE)")
    n_regions = len(REGIONS)
    counts = torch.zeros(len(layers), n_regions, cfg.n_experts, dtype=torch.float64)
    weight_sums = torch.zeros(len(layers), n_regions, cfg.n_experts, dtype=torch.float64)
    tokens = torch.zeros(n_regions, dtype=torch.float64)
    n_examples = 0
    store: dict[str, Tensor] = {}

    def keep(activation: Tensor, hook) -> None:
        store[hook.name] = activation.detach().cpu()

    names = [f"blocks.{layer}.mlp.hook_expert_{kind}" for layer in layers for kind in ("indices", "weights")]
    for inputs in tqdm(batches, desc="routing", disable=not progress):
        masks = [inputs.token_regions.mask(region, inputs.seq_len) for region in REGIONS]  # [batch, pos] each
        store.clear()
        with torch.no_grad():
            model.run_with_hooks(inputs, return_type=None, fwd_hooks=[(name, keep) for name in names])
        for i, layer in enumerate(layers):
            indices = store[f"blocks.{layer}.mlp.hook_expert_indices"]
            weights = store[f"blocks.{layer}.mlp.hook_expert_weights"].double()
            for r, mask in enumerate(masks):
                chosen, weight = indices[mask].flatten(), weights[mask].flatten()
                ok = (chosen >= 0) & (chosen < cfg.n_experts)
                counts[i, r] += torch.bincount(chosen[ok], minlength=cfg.n_experts).double()
                weight_sums[i, r].index_add_(0, chosen[ok], weight[ok])
        tokens += torch.tensor([float(mask.sum()) for mask in masks], dtype=torch.float64)
        n_examples += inputs.batch_size
    return RoutingStatistics(layers=layers, n_experts=cfg.n_experts, top_k=cfg.n_experts_per_token, counts=counts,
                             weight_sums=weight_sums, tokens=tokens, n_examples=n_examples,
                             settings={"model": cfg.model_name or cfg.architecture})
