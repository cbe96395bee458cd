"""A model in which one attention edge carries the answer: image tokens -> final position at one layer.

A tiny Qwen2.5-VL (d_model 48) whose residual stream holds a large constant in dimension 0 (no head
reads it; it pins every norm's scale), the image content in A = dims 1-15 (text tokens carry nothing
there) and the answer in C = dims 32-47:

- every q/k/v projection reads A only (biases zero), so text tokens have zero keys and values;
- every head's output and every MLP is zeroed except `carrier` layer's head 1, which writes into C;
- the unembedding reads C only; `plant_answers` points each example's answer row at its final C.

So the answer reaches the logits only through the carrier layer's final-position query reading image
keys: knocking out image -> final there leaves C = 0 at the final position (every logit exactly 0,
the answer's probability 1 / d_vocab); knocking out image -> final at another layer, or image ->
question anywhere, changes nothing at the final position; knocking out question -> final only
renormalises the carrier's pattern over the image keys (text values are zero), the answer stays.
"""

from __future__ import annotations

import torch
from PIL import Image

from tests.helpers.models import tiny_vlm
from vlens.flow.batch import FlowBatch, FlowExample

A, C = slice(1, 16), slice(32, 48)


def one_edge_model(carrier: int = 1, n_layers: int = 3, seed: int = 0, constant: float = 10.0):
    """The tiny HookedVLM of the module docstring (a fresh copy)."""
    model = tiny_vlm("qwen2_5_vl", seed=seed, fresh=True, n_layers=n_layers, d_model=48, n_heads=4, n_kv_heads=2,
                     d_mlp=64, initializer_range=0.2)
    d_head = model.cfg.d_head
    with torch.no_grad():
        embed = model.embed.embedding.weight
        embed.zero_()
        embed[:, 0] = constant
        merger = model.hf_model.model.visual.merger.mlp[2]  # the image features' last projection
        merger.weight[:A.start] = 0
        merger.weight[A.stop:] = 0
        merger.weight[A] *= 5.0
        merger.bias.zero_()
        merger.bias[0] = constant
        for block in model.blocks:
            for projection in (block.attn.q_proj, block.attn.k_proj, block.attn.v_proj):
                projection.weight[:, :A.start] = 0
                projection.weight[:, A.stop:] = 0
                if projection.bias is not None:
                    projection.bias.zero_()
            out = block.attn.o_proj.weight  # [d_model, n_heads * d_head]
            kept = out[:, d_head:2 * d_head].clone()
            out.zero_()
            if block.layer == carrier:
                out[C, d_head:2 * d_head] = 3.0 * kept[C]
            block.mlp.down_proj.weight.zero_()
        head = model.unembed.lm_head.weight
        head.zero_()
    return model


def plant_answers(model, inputs, answers: list[int], scale: float = 50.0) -> None:
    """Point each row's answer token at that row's final residual (C only); the answers must be distinct."""
    if len(set(answers)) != len(answers):
        raise ValueError("plant_answers needs distinct answer tokens")
    with torch.no_grad():
        resid = model(inputs, return_type="resid")
        weight = model.unembed.lm_head.weight
        for row, token in enumerate(answers):
            c = resid[row, int(inputs.regions.final[row]), C]
            weight[token, C] = scale * c / c.norm()


def flow_examples(answers=("red", "blue", "green"), scale: int = 1) -> FlowBatch:
    """Three random images asking for a colour, with distinct answers and a box each (the flow tests' batch)."""
    generator = torch.Generator().manual_seed(0)
    examples = []
    for i, answer in enumerate(answers):
        pixels = torch.randint(0, 256, (scale * (32 + 8 * i), scale * 40, 3), generator=generator, dtype=torch.uint8)
        examples.append(FlowExample(Image.fromarray(pixels.numpy()), "What colour is the circle?", answer,
                                    box=(4.0, 4.0, 20.0, 14.0 + 4 * i)))
    return FlowBatch("planted", examples)
