"""An independent reference for edge effects and edge gradients, written with plain hooks only.

Nothing here uses `vlens.circuits`: node names are parsed with their own regexes, sender
outputs come from `run_with_cache` of the clean and corrupt inputs, and every patched or
differentiated run is `model.run_with_hooks(batch.clean, ...)` (the vision tower included).

- `exact_effect(model, batch, sender, receiver)`: the metric per pair when only the edge
  sender -> receiver is corrupted (the receiver reads its clean input + the sender's corrupt
  minus clean output), minus the clean metric.
- `edge_integrand(model, batch, sender, receiver, alpha)`: mean over pairs of
  (sender's corrupt - clean output) . dM/d(receiver input) in the run whose input embeddings
  (and DeepStack features) are corrupt + alpha (clean - corrupt): alpha = 1 is the EAP score,
  its integral over alpha in [0, 1] the exact integrated-gradients score.
"""

from __future__ import annotations

import re

import numpy as np
import torch

HEAD = re.compile(r"L(\d+)H(\d+)")
MLP = re.compile(r"MLP(\d+)")
IMAGE = re.compile(r"img(\d+)(?:\[r(\d+)(?:-(\d+))?,c(\d+)(?:-(\d+))?\])?")
PART = re.compile(r"img(\d+)\.(tile\[r(\d+),c(\d+)\]|[a-z]+)")
RECEIVER = re.compile(r"L(\d+)H(\d+)(?:-(\d+))?\.(q|k|v)")


def metric(model, batch, logits):
    """logit[corrupt answer] - logit[clean answer] at each row's final position."""
    rows = torch.arange(batch.n_pairs)
    final = logits[rows, batch.final]
    return final[rows, batch.corrupt_tokens] - final[rows, batch.clean_tokens]


def caches(model, batch):
    names = lambda n: (n == "hook_inputs_embeds" or n.endswith(("hook_resid_pre", "hook_resid_mid", "attn.hook_z",  # noqa: E731
                                                               "hook_mlp_out", "hook_deepstack", "hook_resid_post")))
    with torch.no_grad():
        clean_logits, clean = model.run_with_cache(batch.clean, names_filter=names)
        corrupt_logits, corrupt = model.run_with_cache(batch.corrupt, names_filter=names)
    return clean, corrupt, metric(model, batch, clean_logits), metric(model, batch, corrupt_logits)


def _positions(batch, sender: str, row: int) -> torch.Tensor:
    regions = batch.clean.token_regions
    if sender == "tokens":
        mask = torch.ones(batch.seq_len, dtype=torch.bool)
        mask[regions.image[row]] = False
        return mask.nonzero().flatten()
    records = regions.tiles[row][int(sender[3:].split("[")[0].split(".")[0])] if regions.tiles else []
    part = PART.fullmatch(sender)
    if part:  # a tile (by its layout cell), the newline or class tokens of a tiled image
        if part[3] is not None:
            return next(r.positions for r in records if r.kind == "tile" and tuple(r.layout) == (int(part[3]),
                                                                                              int(part[4])))
        return next(r.positions for r in records if r.kind == part[2])
    match = IMAGE.fullmatch(sender)
    assert match, sender
    image = int(match[1])
    positions = regions.images[row][image]
    if match[2] is None:
        return positions
    views = [r for r in records if r.kind in ("image", "base")]
    if views:  # the grid that covers the whole image
        positions = views[0].positions
    rows, cols = regions.image_grid[row][image]
    r0, c0 = int(match[2]), int(match[4])
    r1 = int(match[3] or match[2]) + 1
    c1 = int(match[5] or match[4]) + 1
    return positions[[r * cols + c for r in range(r0, r1) for c in range(c0, c1)]]


def sender_delta(model, batch, clean, corrupt, sender: str, receiver_layer: int) -> torch.Tensor:
    """[n, pos, d_model]: the sender's corrupt minus clean output as the receiver at `receiver_layer`
    (n_layers for the logits) sees it."""
    head = HEAD.fullmatch(sender)
    if head:
        layer, h = int(head[1]), int(head[2])
        w_o = model.blocks[layer].attn.W_O[h]
        name = f"blocks.{layer}.attn.hook_z"
        return (corrupt[name][:, :, h] - clean[name][:, :, h]) @ w_o
    mlp = MLP.fullmatch(sender)
    if mlp:
        name = f"blocks.{int(mlp[1])}.hook_mlp_out"
        return corrupt[name] - clean[name]
    delta = corrupt["hook_inputs_embeds"] - clean["hook_inputs_embeds"]
    for layer in range(receiver_layer):  # Qwen3-VL: image features added after early blocks
        name = f"blocks.{layer}.hook_deepstack"
        if name in clean.cache_dict:
            added = torch.zeros_like(delta)
            image = batch.clean.input_ids == model.cfg.image_token_id
            added[image] = corrupt[name] - clean[name]
            delta = delta + added
    mask = torch.zeros(delta.shape[:2], dtype=torch.bool)
    for row in range(batch.n_pairs):
        mask[row, _positions(batch, sender, row)] = True
    return delta * mask[..., None]


def _receiver_hooks(model, receiver: str, make_input):
    """Hooks replacing the receiver's output by its computation from `make_input(run_input)`."""
    n_layers = model.cfg.n_layers
    if receiver == "logits":
        return [(f"blocks.{n_layers - 1}.hook_resid_post", lambda act, hook: make_input(act))]
    mlp = MLP.fullmatch(receiver)
    store = {}
    if mlp:
        layer = int(mlp[1])
        block = model.blocks[layer]
        return [(f"blocks.{layer}.hook_resid_mid", lambda act, hook: store.__setitem__("x", act)),
                (f"blocks.{layer}.hook_mlp_out", lambda act, hook: block.mlp(block.ln2(make_input(store["x"]))))]
    match = RECEIVER.fullmatch(receiver)
    assert match, receiver
    layer, first, kind = int(match[1]), int(match[2]), match[4]
    block, d_head = model.blocks[layer], model.cfg.d_head
    groups = model.cfg.n_heads // model.cfg.n_key_value_heads
    index = first if kind == "q" else first // groups
    projection = getattr(block.attn, f"{kind}_proj")

    def replace(act, hook):
        new = projection(block.ln1(make_input(store["x"]))).view(*act.shape[:2], -1, d_head)
        out = act.clone()
        out[:, :, index] = new[:, :, index]
        return out

    return [(f"blocks.{layer}.hook_resid_pre", lambda act, hook: store.__setitem__("x", act)),
            (f"blocks.{layer}.attn.hook_{kind}", replace)]


def receiver_layer(model, receiver: str) -> int:
    if receiver == "logits":
        return model.cfg.n_layers
    mlp = MLP.fullmatch(receiver)
    return int(mlp[1]) if mlp else int(RECEIVER.fullmatch(receiver)[1])


def exact_effect(model, batch, sender: str, receiver: str, references=None) -> torch.Tensor:
    """[n_pairs]: metric with only sender -> receiver corrupted, minus the clean metric."""
    clean, corrupt, clean_metric, _ = references or caches(model, batch)
    delta = sender_delta(model, batch, clean, corrupt, sender, receiver_layer(model, receiver))
    hooks = _receiver_hooks(model, receiver, lambda x: x + delta.to(x.dtype))
    with torch.no_grad():
        logits = model.run_with_hooks(batch.clean, fwd_hooks=hooks)
    return metric(model, batch, logits) - clean_metric


def edge_integrand(model, batch, sender: str, receiver: str, alpha: float, references=None) -> float:
    """Mean over pairs of delta_sender . dM/dx_receiver in the run with inputs corrupt + alpha (clean - corrupt)."""
    clean, corrupt, _, _ = references or caches(model, batch)
    delta = sender_delta(model, batch, clean, corrupt, sender, receiver_layer(model, receiver))
    leaf = {}

    def make_input(x):
        leaf["x"] = x.detach().clone().requires_grad_(True)
        return leaf["x"]

    hooks = _receiver_hooks(model, receiver, make_input)
    hooks.append(("hook_inputs_embeds", lambda act, hook: torch.lerp(corrupt["hook_inputs_embeds"], act, alpha)))
    for layer in range(model.cfg.n_layers):
        name = f"blocks.{layer}.hook_deepstack"
        if name in clean.cache_dict:
            hooks.append((name, lambda act, hook, name=name: torch.lerp(corrupt[name], act, alpha)))
    with torch.enable_grad():
        logits = model.run_with_hooks(batch.clean, fwd_hooks=hooks)
        metric(model, batch, logits).sum().backward()
    return float((leaf["x"].grad * delta.detach()).sum() / batch.n_pairs)


def integrated_reference(model, batch, sender: str, receiver: str, nodes: int = 24, references=None) -> float:
    """The integral over alpha in [0, 1] of `edge_integrand`, by Gauss-Legendre quadrature."""
    points, weights = np.polynomial.legendre.leggauss(nodes)
    refs = references or caches(model, batch)
    return float(sum(w / 2 * edge_integrand(model, batch, sender, receiver, float((t + 1) / 2), refs)
                     for t, w in zip(points, weights, strict=True)))
