"""HeadLens: decode every attention head into vocabulary space.

For head i of layer l at a position,

    l_i(x) = W_U^T ( w_final * T_l^lin(c_i) / s_l ) ,   c_i = z_i @ W_O[i]

- ``c_i`` is the head's contribution to the residual (``vlens.lens.decomposition``; through the block's
  post-attention norm at the run's scale where there is one, Gemma 3).
- ``T_l`` is layer l's translator (``vlens.lens.translators``): heads of layer l are part of
  ``resid_post`` of l, which is what ``T_l`` was trained on. ``T_l`` is affine; a head gets
  its *linear* part ``T_l^lin(c) = c + A_l c``. The bias ``b_l`` is one constant per layer,
  shared by all components of the residual, so (like ``b_O`` in the head decomposition) it is
  attributed to no head: adding it to every head would count it n_heads times and push every
  head of a layer towards the same tokens. ``include_bias=True`` gives the literal
  ``U T_l(c_i)``.
- Norm handling: the final RMSNorm divides by ``s_l = sqrt(mean(T_l(resid_post_l)^2) + eps)``,
  the scale of the *full translated residual* at that position (TransformerLens's
  ``apply_ln_to_stack`` convention), then multiplies by its weight. A single head's vector
  is not re-normalised on its own: its norm says how much the head writes, and normalising
  it alone would inflate weak heads to the size of the whole residual. With this choice the
  heads' logits plus the other components' logits add up to the lens logits of the layer.
- ``b_U`` (zero for Qwen) is left out of per-head logits for the same reason as ``b_l``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, cast

import torch
from jaxtyping import Float, Int, Shaped
from torch import Tensor

from vlens.core.components.sandwich_block import post_norm_shares
from vlens.core.runtime import module_device
from vlens.core.token_labels import str_tokens
from vlens.lens.decomposition import attention_post_norm, head_contributions
from vlens.lens.translators import Translators, TunedLens
from vlens.utils.errors import UserInputError
from vlens.utils.finite import finite_rows
from vlens.utils.results import Result, nan_tensor
from vlens.viz.figures import layer_head_heatmap

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM


@dataclass
class HeadLensOutput(Result):
    """HeadLens decodings at chosen positions.

    Shapes (p = positions per row, L = decoded layers, H = heads, k = top-k):
        positions [batch, p]; top_ids / top_logits [batch, p, L, H, k];
        model_top1 [batch, p] (the model's own next-token prediction there; -1 where the model's
        logits are not finite); top_ids are -1 and top_logits NaN where a head's logits are not finite;
        image_attention [batch, p, L, H] attention mass from the position onto image tokens;
        image_share [batch, p] share of the visible keys that are image tokens (uniform baseline);
        layer_image_share [batch, p, L] that share per layer where layers see different keys (a
        sliding-window layer sees only its window: Gemma 3), else None;
        has_image [batch]; logits [batch, p, L, H, d_vocab] only with ``return_logits=True``.
    H is the widest layer's head count: where layers differ (a hybrid decoder, whose linear-attention
    layers' heads are their value heads), a layer's missing heads have top_ids -1 and NaN values.
    A linear-attention layer has no attention pattern: its image_attention is NaN.
    """

    layers: list[int]
    positions: Int[Tensor, "batch p"]
    top_ids: Int[Tensor, "batch p L H k"]
    top_logits: Float[Tensor, "batch p L H k"]
    model_top1: Int[Tensor, "batch p"]
    image_attention: Float[Tensor, "batch p L H"] | None
    image_share: Float[Tensor, "batch p"]
    has_image: Shaped[Tensor, " batch"]
    logits: Float[Tensor, "batch p L H d_vocab"] | None = None
    layer_image_share: Float[Tensor, "batch p L"] | None = None

    kind: ClassVar[str] = "headlens_output"
    saved_dims: ClassVar[dict[str, str]] = {"layers": "L"}  # checked when a file is read

    def shares_by_layer(self) -> Float[Tensor, "batch p L"]:
        """The image-token share of the keys each decoded layer sees, [batch, p, L]."""
        if self.layer_image_share is not None:
            return self.layer_image_share
        return self.image_share[..., None].expand(*self.image_share.shape, len(self.layers))

    def top_tokens(self, tokenizer, row: int, layer: int, head: int, position_index: int = 0) -> list[str]:
        """Decoded top-k tokens of one head (layer is a model layer index), as `to_str_tokens` labels them."""
        ids = self.top_ids[row, position_index, self.layers.index(layer), head].tolist()
        return cast(list[str], str_tokens(tokenizer, ids))  # a list of ids decodes to one label per id

    def plot(self, title: str = "HeadLens: attention from the decoded position onto the image"):
        """Layer x head heatmap of the mean image attention (the top-1 logit without attention)."""
        if self.image_attention is not None:
            values, label = self.image_attention.float().nanmean((0, 1)), "image attention"
        else:
            values, label = self.top_logits[..., 0].float().nanmean((0, 1)), "top-1 logit"
        grid = torch.full((max(self.layers) + 1, values.shape[-1]), float("nan"))
        grid[self.layers] = values
        return layer_head_heatmap(grid, title=title, value_label=label)

    def to_dict(self) -> dict:
        return {
            "layers": self.layers,
            "positions": self.positions.tolist(),
            "top_ids": self.top_ids.tolist(),
            "top_logits": self.top_logits.tolist(),
            "model_top1": self.model_top1.tolist(),
            "image_attention": None if self.image_attention is None else self.image_attention.tolist(),
            "image_share": self.image_share.tolist(),
            "layer_image_share": None if self.layer_image_share is None else self.layer_image_share.tolist(),
            "has_image": self.has_image.tolist(),
        }

    @classmethod
    def from_dict(cls, data: dict) -> HeadLensOutput:
        """The decodings `to_dict` wrote (without `logits`, which it does not write)."""
        def optional(key: str) -> Tensor | None:
            return None if data.get(key) is None else nan_tensor(data[key])

        return cls(layers=list(data["layers"]), positions=torch.tensor(data["positions"], dtype=torch.long),
                   top_ids=torch.tensor(data["top_ids"], dtype=torch.long), top_logits=nan_tensor(data["top_logits"]),
                   model_top1=torch.tensor(data["model_top1"], dtype=torch.long),
                   image_attention=optional("image_attention"), image_share=nan_tensor(data["image_share"]),
                   has_image=torch.tensor(data["has_image"], dtype=torch.bool),
                   layer_image_share=optional("layer_image_share"))


def _resolve_positions(inputs, positions) -> Tensor:
    """"final" -> [batch, 1]; LongTensor [batch] or [batch, p] -> [batch, p]."""
    if isinstance(positions, str):
        if positions != "final":
            raise UserInputError(f"positions must be 'final' or a LongTensor [batch] / [batch, p], got {positions!r}")
        return inputs.regions.final.view(-1, 1).long()
    positions = torch.as_tensor(positions).long()
    if positions.ndim == 1:
        positions = positions.view(-1, 1)
    if positions.ndim != 2 or positions.shape[0] != inputs.input_ids.shape[0]:
        raise UserInputError(f"positions must be [batch] or [batch, p] with batch {inputs.input_ids.shape[0]}, "
                         f"got {tuple(positions.shape)}")
    seq_len = inputs.input_ids.shape[1]
    if positions.min() < 0 or positions.max() >= seq_len:
        raise IndexError(f"positions must lie in [0, {seq_len}), got {positions.min()}..{positions.max()}")
    return positions


def _pad_heads(x: Tensor, width: int, fill: float, dim: int = 2) -> Tensor:
    """x with its head dimension `dim` padded to `width` with `fill` (a layer with fewer heads)."""
    missing = width - x.shape[dim]
    if not missing:
        return x
    shape = list(x.shape)
    shape[dim] = missing
    return torch.cat([x, x.new_full(shape, fill)], dim=dim)


def _gather(x: Tensor, positions: Tensor) -> Tensor:
    """x [batch, pos, ...] at positions [batch, p] -> [batch, p, ...]."""
    index = positions.to(x.device).view(*positions.shape, *([1] * (x.ndim - 2))).expand(-1, -1, *x.shape[2:])
    return x.gather(1, index)


class HeadLens(TunedLens):
    """Per-head decoding through learned translators, the final norm and the unembedding.

    As a `Lens`, ``forward(resid, layer)`` is the tuned lens of the whole residual;
    `decode_heads` and `run` decode each head's contribution on its own.

    Args:
        model: a `HookedVLM`.
        translators: a trained `Translators` for this model (checked by unembedding hash);
            None decodes without translation (``T_l`` = identity: the heads' logit lens).
        include_bias: add the translator bias ``b_l`` to every head (see module docstring).
    """

    model: HookedVLM  # set in __init__ outside nn.Module's registry

    def __init__(self, model: HookedVLM, translators: Translators | None = None, include_bias: bool = False):
        lens = TunedLens.from_model(model, translators)
        super().__init__(lens.translators, lens.readout)
        self.__dict__["model"] = model  # not a submodule: its parameters stay the model's
        self.include_bias = include_bias

    def decode_heads(
        self,
        z: Float[Tensor, "... n_heads d_head"],
        resid_post: Float[Tensor, "... d_model"],
        layer: int,
        attn_scale: Float[Tensor, "... 1"] | None = None,
    ) -> Float[Tensor, "... n_heads d_vocab"]:
        """Per-head logits of layer `layer` from its ``hook_z`` and ``hook_resid_post`` at the same positions.

        attn_scale: ``blocks.{layer}.ln1_post.hook_scale`` there, for a block that normalizes its attention
        output (Gemma 3): a head's contribution is then its share of that norm's output (`vlens.lens.decomposition`).
        """
        with torch.no_grad():
            contributions = head_contributions(z.float(), self.model.blocks[layer].attn.W_O.float())
            norm = attention_post_norm(self.model, layer)
            if norm is not None:
                if attn_scale is None:
                    raise UserInputError(f"block {layer} normalizes its attention output: pass attn_scale, its "
                                     f"blocks.{layer}.ln1_post.hook_scale at the same positions")
                contributions = post_norm_shares(contributions, norm, attn_scale.float())
            translated = self.translators.linear(contributions, layer)
            if self.include_bias:
                translated = translated + self.translators.b[layer]
            scale = self.readout.scale(self.transform(resid_post, layer)).unsqueeze(-2)  # [..., 1, 1]
            return self.readout.logits(translated, scale=scale, add_bias=False)

    def run(
        self,
        inputs,
        positions: str | Tensor = "final",
        k: int = 10,
        layers: Sequence[int] | None = None,
        image_attention: bool = True,
        return_logits: bool = False,
    ) -> HeadLensOutput:
        """One forward pass; decode every head of `layers` (default all) at `positions`."""
        model = self.model
        inputs = model.coerce_inputs(inputs)
        layers = list(range(model.cfg.n_layers)) if layers is None else [int(x) for x in layers]
        if any(not 0 <= x < model.cfg.n_layers for x in layers):
            raise IndexError(f"layers must lie in [0, {model.cfg.n_layers}), got {layers}")
        if not 1 <= k <= model.cfg.d_vocab:
            raise UserInputError(f"k must lie in [1, {model.cfg.d_vocab}], got {k}")
        pos = _resolve_positions(inputs, positions)
        image_keys = (inputs.input_ids == model.cfg.image_token_id) if model.cfg.image_token_id is not None \
            else torch.zeros_like(inputs.input_ids, dtype=torch.bool)
        store: dict[str, Tensor] = {}

        def keep(name):
            def hook(activation, hook):
                store[name] = _gather(activation, pos).detach()
            return hook

        def keep_image_mass(name):
            def hook(pattern, hook):  # [batch, H, q, k] -> mass on image keys from the chosen queries
                rows = _gather(pattern.transpose(1, 2), pos)  # [batch, p, H, k]
                store[name] = (rows.float() * image_keys.to(rows.device)[:, None, None, :]).sum(-1).detach()
            return hook

        hooks: list[tuple[str | Callable, Callable]] = []
        for layer in layers:
            hooks.append((f"blocks.{layer}.attn.hook_z", keep(f"z{layer}")))
            hooks.append((f"blocks.{layer}.hook_resid_post", keep(f"resid{layer}")))
            if attention_post_norm(model, layer) is not None:
                hooks.append((f"blocks.{layer}.ln1_post.hook_scale", keep(f"scale{layer}")))
            if image_attention and not model.cfg.is_linear_attention(layer):  # linear attention has no pattern
                hooks.append((f"blocks.{layer}.attn.hook_pattern", keep_image_mass(f"img{layer}")))
        with torch.no_grad():
            resid = model.run_with_hooks(inputs, fwd_hooks=hooks, return_type="resid")
            final_logits = model.unembed(_gather(resid, pos).to(module_device(model.unembed.lm_head)))  # only the read positions
        model_top1 = final_logits.argmax(-1).masked_fill(~finite_rows(final_logits), -1).cpu()

        tops, values, full = [], [], []
        width = max(model.cfg.heads_at(layer) for layer in layers)  # layers may differ (hybrid decoders)
        for layer in layers:
            head_logits = self.decode_heads(store[f"z{layer}"], store[f"resid{layer}"], layer,
                                            store.get(f"scale{layer}"))  # [b, p, H, V]
            top = head_logits.topk(k, dim=-1)
            broken = ~finite_rows(head_logits)[..., None]  # NaN logits: no token, no value
            tops.append(_pad_heads(top.indices.masked_fill(broken, -1).cpu(), width, -1))
            values.append(_pad_heads(top.values.masked_fill(broken, torch.nan).cpu(), width, torch.nan))
            if return_logits:
                full.append(_pad_heads(head_logits.cpu(), width, torch.nan))
        mass = None
        if image_attention:
            batch_size, n_pos = pos.shape
            mass = torch.stack([_pad_heads(store[f"img{x}"].cpu(), width, torch.nan, dim=-1) if f"img{x}" in store
                                else torch.full((batch_size, n_pos, width), torch.nan) for x in layers], 2)
        visible = inputs.attention_mask.bool().cpu()
        key_index = torch.arange(inputs.input_ids.shape[1])
        before = key_index[None, None, :] <= pos[:, :, None]  # causal: keys up to the position
        seen = before & visible[:, None, :]
        is_image_key = image_keys.cpu()[:, None, :]
        image_share = (seen & is_image_key).sum(-1) / seen.sum(-1).clamp(min=1)
        layer_share = None
        windows = [getattr(model.blocks[x].attn, "sliding_window", None) for x in layers]
        if any(w is not None for w in windows):  # a sliding-window layer sees its last `w` keys only
            shares = []
            for window in windows:
                seen_here = seen if window is None else seen & (key_index[None, None, :] > pos[:, :, None] - window)
                shares.append((seen_here & is_image_key).sum(-1) / seen_here.sum(-1).clamp(min=1))
            layer_share = torch.stack(shares, -1).float()
        return HeadLensOutput(
            layers=layers, positions=pos, top_ids=torch.stack(tops, 2), top_logits=torch.stack(values, 2),
            model_top1=model_top1, image_attention=mass, image_share=image_share.float(),
            has_image=image_keys.any(-1).cpu(), logits=torch.stack(full, 2) if return_logits else None,
            layer_image_share=layer_share,
        )
