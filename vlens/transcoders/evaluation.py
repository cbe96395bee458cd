"""How good a set of transcoders is on image-text prompts: reconstruction and what replacing every MLP costs.

Per covered layer, over every token (image and text) of the prompts: explained variance of the MLP
output (``1 - sum |y - y_hat|^2 / sum |y - mean(y)|^2``), mean L0 (active features per token) and the
share of features that never fired. With every covered MLP replaced by its transcoder (no error term),
the next-token loss over the prompts' text tokens and the KL divergence from the clean model's
next-token distribution at every real position; recovered as SAELens defines it against zeroing every
covered MLP's output: ``loss_recovered = (L_zero - L_tc) / (L_zero - L_clean)``,
``kl_recovered = 1 - KL_tc / KL_zero`` (1: nothing lost).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypedDict

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from vlens.core.loss import IGNORE_INDEX, next_token_targets
from vlens.core.model import HookedVLM
from vlens.sae.activations import as_prompt
from vlens.sae.metrics import explained_variance
from vlens.transcoders.activations import mlp_pairs
from vlens.transcoders.model import Transcoders
from vlens.transcoders.splice import check_model, splice_transcoders
from vlens.utils.errors import UserInputError
from vlens.utils.finite import json_safe
from vlens.utils.noise_floor import FloorRecord, GapFloor, floored_ratio, pooled_gap_floor
from vlens.utils.results import Result, own_fields
from vlens.utils.validation import check_count


class LayerEvaluation(TypedDict):
    """One transcoder layer's figures (checked when a file is read)."""

    layer: int
    explained_variance: float
    l0: float
    dead_fraction: float


@dataclass
class TranscoderEvaluation(Result):
    """Per layer: explained variance, L0, dead share; overall: loss and KL (clean / transcoders / zero) and
    the recovered fractions (see the module doc), None (null) where the denominator is within its noise floor;
    floors: "loss" / "kl" -> that denominator's `GapFloor` as a dict."""

    layers: list[LayerEvaluation] = field(default_factory=list)
    loss_clean: float = 0.0
    loss_transcoders: float = 0.0
    loss_zero: float = 0.0
    loss_recovered: float | None = None
    kl_transcoders: float = 0.0
    kl_zero: float = 0.0
    kl_recovered: float | None = None
    n_prompts: int = 0
    n_tokens: int = 0
    floors: dict[str, FloorRecord] = field(default_factory=dict)

    kind: ClassVar[str] = "transcoder_evaluation"

    def to_dict(self) -> dict:
        return {"kind": "transcoder_evaluation", "layers": self.layers, "loss_clean": self.loss_clean,
                "loss_transcoders": self.loss_transcoders, "loss_zero": self.loss_zero,
                "loss_recovered": self.loss_recovered, "kl_transcoders": self.kl_transcoders, "kl_zero": self.kl_zero,
                "kl_recovered": self.kl_recovered, "n_prompts": self.n_prompts, "n_tokens": self.n_tokens,
                **({"floors": json_safe(self.floors)} if self.floors else {})}

    @classmethod
    def from_dict(cls, data: dict) -> TranscoderEvaluation:
        return cls(**own_fields(cls, data))

    def plot(self, *args: Any, **kwargs: Any) -> Any:
        import plotly.graph_objects as go

        layers = [row["layer"] for row in self.layers]
        figure = go.Figure([go.Bar(x=layers, y=[row["explained_variance"] for row in self.layers], name="explained variance"),
                            go.Bar(x=layers, y=[row["dead_fraction"] for row in self.layers], name="dead share")])
        return figure.update_layout(title=f"Transcoders: loss recovered {self.loss_recovered}", xaxis_title="layer",
                                    xaxis={"dtick": 1}, barmode="group")


@contextmanager
def zero_mlps(model: HookedVLM, layers: Sequence[int]) -> Iterator[None]:
    """Every listed layer's MLP output zeroed (the baseline of loss recovered)."""
    with model.hooks(fwd_hooks=[(f"blocks.{layer}.hook_mlp_out", lambda out, hook: torch.zeros_like(out))
                                for layer in layers]):
        yield


def _loss_and_kl(logits: Tensor, clean_logp: Tensor, inputs: Any, model: HookedVLM
                 ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per prompt [batch]: (summed next-token loss, summed KL from clean, tokens predicted, positions compared)."""
    placeholders = tuple(t for t in (model.cfg.image_token_id, model.cfg.video_token_id) if t is not None)
    targets = next_token_targets(inputs.input_ids, inputs.attention_mask, placeholders).to(logits.device)
    losses = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), targets.flatten(), reduction="none",
                             ignore_index=IGNORE_INDEX).view(targets.shape).sum(-1)
    real = inputs.attention_mask.bool().to(logits.device)
    logp = logits.float().log_softmax(-1)
    kl = ((clean_logp.exp() * (clean_logp - logp)).sum(-1) * real).sum(-1)
    return (losses.double().cpu(), kl.double().cpu(), (targets != IGNORE_INDEX).sum(-1).cpu(),
            real.sum(-1).cpu())


def recovered(numerator: float, sums: Tensor, counts: Tensor, magnitude: float, what: str, score: str
              ) -> tuple[float | None, GapFloor]:
    """numerator / (pooled mean of `sums` per unit), or None (null) with a `NoiseFloorWarning` when that
    denominator is within its noise floor (`vlens.utils.noise_floor`, as the patch effect and an SAE's loss
    recovered): a ratio of noise is never reported. Also returns the floor."""
    floor = pooled_gap_floor(sums, counts, magnitude)
    value = floored_ratio(numerator, floor, what, score, stacklevel=3)
    return (value if math.isfinite(value) else None), floor


@torch.no_grad()
def evaluate_transcoders(model: HookedVLM, tc: Transcoders, examples: Sequence[Any], batch_size: int = 8,
                         chat: bool = True, progress: bool = False) -> TranscoderEvaluation:
    """Reconstruction per layer and loss / KL recovered with every covered MLP replaced (module doc).

    examples: dataset Records, vlens.data samples (dicts with "image" and "question"), (image, text) pairs.
    """
    check_model(model, tc)
    check_count(batch_size, "batch_size")
    examples = list(examples)
    if not examples:
        raise UserInputError("evaluate_transcoders needs at least one example.")
    m = tc.cfg.n_layers
    ys: list[list[Tensor]] = [[] for _ in range(m)]
    y_hats: list[list[Tensor]] = [[] for _ in range(m)]
    l0_sums = [0.0] * m
    fired = torch.zeros(m, tc.cfg.d_tc, dtype=torch.bool)
    parts: dict[str, list[Tensor]] = {"clean": [], "tc": [], "zero": [], "kl_tc": [], "kl_zero": [], "predicted": [],
                                      "positions": []}
    n_tokens = 0
    for start in tqdm(range(0, len(examples), batch_size), desc="evaluate", disable=not progress, unit="batch"):
        prompts = [as_prompt(example, start + i) for i, example in enumerate(examples[start:start + batch_size])]
        images = [p.images for p in prompts]
        inputs = model.prepare(images=images if any(images) else None, prompts=[p.text for p in prompts], chat=chat)
        real = inputs.attention_mask.bool()
        xs, outs = mlp_pairs(model, inputs, tc.cfg.layers)
        acts = [tc.encode(i, x) for i, x in enumerate(xs)]
        for j in range(m):
            ys[j].append(outs[j][real].float().cpu())
            y_hats[j].append(tc.decode(j, acts, xs[j])[real].float().cpu())
            active = acts[j][real] != 0
            l0_sums[j] += float(active.sum())
            fired[j] |= active.any(0).cpu()
        n_tokens += int(real.sum())
        clean = model(inputs)
        clean_logp = clean.float().log_softmax(-1)
        loss, _, predicted, positions = _loss_and_kl(clean, clean_logp, inputs, model)
        parts["clean"].append(loss)
        parts["predicted"].append(predicted)
        parts["positions"].append(positions)
        with splice_transcoders(model, tc, error="none"):
            loss, kl, _, _ = _loss_and_kl(model(inputs), clean_logp, inputs, model)
        parts["tc"].append(loss)
        parts["kl_tc"].append(kl)
        with zero_mlps(model, tc.cfg.layers):
            loss, kl, _, _ = _loss_and_kl(model(inputs), clean_logp, inputs, model)
        parts["zero"].append(loss)
        parts["kl_zero"].append(kl)
    per = {key: torch.cat(values).double() for key, values in parts.items()}  # per prompt
    n_predicted, n_positions = float(per["predicted"].sum()), float(per["positions"].sum())
    if n_predicted == 0:
        raise UserInputError("the prompts predict no text token: give prompts with text.")
    rows: list[LayerEvaluation] = [{"layer": layer, "explained_variance": explained_variance(torch.cat(ys[j]), torch.cat(y_hats[j])),
             "l0": l0_sums[j] / n_tokens, "dead_fraction": float((~fired[j]).float().mean())}
            for j, layer in enumerate(tc.cfg.layers)]
    clean, ours, zero = (float(per[k].sum()) / n_predicted for k in ("clean", "tc", "zero"))
    kl_tc, kl_zero = float(per["kl_tc"].sum()) / n_positions, float(per["kl_zero"].sum()) / n_positions
    # each ratio's denominator must clear its noise floor over the prompts (NaN / null and a warning otherwise)
    loss_recovered, loss_floor = recovered(zero - ours, per["zero"] - per["clean"], per["predicted"], clean,
                               "mean zero-ablation minus clean loss per token", "the transcoders' loss recovered")
    kl_share, kl_floor = recovered(kl_tc, per["kl_zero"], per["positions"], clean,
                         "mean KL of the zero-ablated model from the clean one", "the transcoders' KL recovered")
    return TranscoderEvaluation(layers=rows, loss_clean=clean, loss_transcoders=ours, loss_zero=zero,
                                loss_recovered=loss_recovered, kl_transcoders=kl_tc, kl_zero=kl_zero,
                                kl_recovered=None if kl_share is None else 1 - kl_share,
                                n_prompts=len(examples), n_tokens=n_tokens,
                                floors={"loss": loss_floor.to_dict(), "kl": kl_floor.to_dict()})
