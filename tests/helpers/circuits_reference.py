"""An independent reference for edge effects and edge gradients, written with plain hooks only.

Nothing here uses `vlens.circuits`: node names are parsed with their own regexes, sender
outputs come from `run_with_cache` of the clean and corrupt inputs, and every patched or
differentiated run is `model.run_with_hooks(batch.clean, ...)` (the vision tower included).

- `exact_effect(model, batch, sender, receiver)`: the metric per pair when only the edge
  sender -> receiver is corrupted (the receiver reads its clean input + the sender's corrupt
  minus clean output), minus the clean metric. A head or Gated DeltaNet port's new value comes
  from a second run whose residual entering that layer is the corrected input; a head's output
  in a block with a post-attention norm P counts as P(A + its change) - P(A).
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
PART = re.compile(r"img(\d+)\.(tile\[r(\d+),c(\d+)\]|[a-z_]+)")
RECEIVER = re.compile(r"L(\d+)H(\d+)(?:-(\d+))?\.(q|k|v|beta|g|gate|b|c|x)")
PORT_HOOK = {"q": "q", "k": "k", "v": "v", "beta": "beta", "g": "g", "gate": "output_gate", "b": "b", "c": "c", "x": "x"}


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
        attn = model.blocks[layer].attn
        name = f"blocks.{layer}.attn.hook_z"
        change = (corrupt[name][:, :, h] - clean[name][:, :, h]) @ attn.W_O[h]
        post = getattr(model.blocks[layer], "ln1_post", None)
        if post is None:
            return change
        total = torch.einsum("bphe,hed->bpd", clean[name], attn.W_O) + attn.b_O  # the attention's own output
        return post(total + change) - post(total)
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
        post = getattr(block, "ln2_post", None)  # Gemma: hook_mlp_out is after the post-MLP norm

        def recompute(act, hook):
            out = block.mlp(block.ln2(make_input(store["x"])))
            return out if post is None else post(out)

        return [(f"blocks.{layer}.hook_resid_mid", lambda act, hook: store.__setitem__("x", act)),
                (f"blocks.{layer}.hook_mlp_out", recompute)]
    raise ValueError(f"{receiver} is a mixer port: see port_of")


def port_of(receiver: str) -> tuple[int, str, int] | None:
    """(layer, hook name, head index on dim 2) of a head / Gated DeltaNet port receiver, else None."""
    match = RECEIVER.fullmatch(receiver)
    if match is None:
        return None
    layer, first, kind = int(match[1]), int(match[2]), match[4]
    group = int(match[3]) - first + 1 if match[3] else 1
    return layer, f"blocks.{layer}.attn.hook_{PORT_HOOK[kind]}", first // group


def port_value(model, batch, layer: int, hook: str, x, extra_hooks=()):
    """The value of hook `hook` in a run whose residual entering layer `layer` is `x` (a second run)."""
    store = {}

    def capture(act, hook):
        store["value"] = act

    hooks = [*extra_hooks, (f"blocks.{layer}.hook_resid_pre", lambda act, hook: x.to(act.dtype)), (hook, capture)]
    model.run_with_hooks(batch.clean, fwd_hooks=hooks)
    return store["value"]


def receiver_layer(model, receiver: str) -> int:
    if receiver == "logits":
        return model.cfg.n_layers
    mlp = MLP.fullmatch(receiver)
    if mlp:
        return int(mlp[1])
    match = RECEIVER.fullmatch(receiver)
    assert match, receiver
    return int(match[1])


def exact_effect(model, batch, sender: str, receiver: str, references=None) -> torch.Tensor:
    """[n_pairs]: metric with only sender -> receiver corrupted, minus the clean metric."""
    clean, corrupt, clean_metric, _ = references or caches(model, batch)
    delta = sender_delta(model, batch, clean, corrupt, sender, receiver_layer(model, receiver))
    port = port_of(receiver)
    with torch.no_grad():
        if port is None:
            hooks = _receiver_hooks(model, receiver, lambda x: x + delta.to(x.dtype))
        else:
            layer, hook, index = port
            value = port_value(model, batch, layer, hook, clean[f"blocks.{layer}.hook_resid_pre"] + delta)

            def replace(act, hook):
                out = act.clone()
                out[:, :, index] = value[:, :, index]
                return out

            hooks = [(hook, replace)]
        logits = model.run_with_hooks(batch.clean, fwd_hooks=hooks)
    return metric(model, batch, logits) - clean_metric


def edge_integrand(model, batch, sender: str, receiver: str, alpha: float, references=None) -> float:
    """Mean over pairs of delta_sender . dM/dx_receiver in the run with inputs corrupt + alpha (clean - corrupt)."""
    clean, corrupt, _, _ = references or caches(model, batch)
    delta = sender_delta(model, batch, clean, corrupt, sender, receiver_layer(model, receiver)).detach()
    paths = [("hook_inputs_embeds", lambda act, hook: torch.lerp(corrupt["hook_inputs_embeds"], act, alpha))]
    for layer in range(model.cfg.n_layers):
        name = f"blocks.{layer}.hook_deepstack"
        if name in clean.cache_dict:
            paths.append((name, lambda act, hook, name=name: torch.lerp(corrupt[name], act, alpha)))
    port = port_of(receiver)
    with torch.enable_grad():
        if port is None:
            leaf = {}

            def make_input(x):
                leaf["x"] = x.detach().clone().requires_grad_(True)
                return leaf["x"]

            logits = model.run_with_hooks(batch.clean, fwd_hooks=[*paths, *_receiver_hooks(model, receiver,
                                                                                            make_input)])
            metric(model, batch, logits).sum().backward()
            return float((leaf["x"].grad * delta).sum() / batch.n_pairs)
        # a port: dM/d(port value) in this run, then back through the port alone in a second run
        layer, hook, index = port
        store = {}

        def keep(name):
            def fn(act, hook):
                store[name] = act
                if act.requires_grad:
                    act.retain_grad()
            return fn

        logits = model.run_with_hooks(batch.clean, fwd_hooks=[*paths, (f"blocks.{layer}.hook_resid_pre", keep("x")),
                                                              (hook, keep("port"))])
        metric(model, batch, logits).sum().backward()
        upstream = store["port"].grad[:, :, index]
        x = store["x"].detach().clone().requires_grad_(True)
        value = port_value(model, batch, layer, hook, x, paths)
        (grad,) = torch.autograd.grad(value[:, :, index], x, grad_outputs=upstream)
    return float((grad * delta).sum() / batch.n_pairs)


def integrated_reference(model, batch, sender: str, receiver: str, nodes: int = 24, references=None) -> float:
    """The integral over alpha in [0, 1] of `edge_integrand`, by Gauss-Legendre quadrature."""
    points, weights = np.polynomial.legendre.leggauss(nodes)
    refs = references or caches(model, batch)
    return float(sum(w / 2 * edge_integrand(model, batch, sender, receiver, float((t + 1) / 2), refs)
                     for t, w in zip(points, weights, strict=True)))
