"""A model built so that one two-hop path carries the image into the answer: image -> L0H1 -> L1H2 -> logits.

The residual stream of a tiny Qwen2.5-VL (d_model 48) is split into four parts: dimension 0
holds a large constant on every token (so every norm's scale is all but fixed), A = dims 1-15
the input embeddings (text and image), B = 16-31, C = 32-47. Every head's output and every MLP
is zeroed except:

- L0H1 (reads everything, so A: the image) writes into B only;
- L1H2 reads B only (its query and its key/value head's weights on the other dimensions are
  zero) and writes into C only;
- the unembedding reads C only.

So the image reaches the logits only through L0H1's keys / values / queries, L0H1 -> L1H2's
query, key and value, and L1H2 -> logits: `PLANTED_EDGES` (whole-image input node). Every
other edge moves the metric only through the norms' scales, which the constant dimension pins
down (their exact effects are a small fraction of the planted ones; the test measures how small).
"""

from __future__ import annotations

import torch

from tests.helpers.models import tiny_vlm

A, B, C = slice(1, 16), slice(16, 32), slice(32, 48)
PLANTED_EDGES = frozenset({"img0->L0H1.q", "img0->L0H0-1.k", "img0->L0H0-1.v", "L0H1->L1H2.q", "L0H1->L1H2-3.k",
                           "L0H1->L1H2-3.v", "L1H2->logits"})


def planted_circuit_model(seed: int = 0, constant: float = 10.0, image_gain: float = 5.0):
    """The tiny HookedVLM described in the module docstring (a fresh copy the caller may change)."""
    model = tiny_vlm("qwen2_5_vl", seed=seed, fresh=True, n_layers=2, d_model=48, n_heads=4, n_kv_heads=2,
                     d_mlp=64, initializer_range=0.2)
    d_head = model.cfg.d_head
    with torch.no_grad():
        embed = model.embed.embedding.weight
        embed[:, B] = 0
        embed[:, C] = 0
        embed[:, 0] = constant
        merger = model.hf_model.model.visual.merger.mlp[2]  # the image features' last projection
        merger.weight[B] = 0
        merger.weight[C] = 0
        merger.weight[0] = 0
        merger.weight[A] *= image_gain  # image content as large as the constant's share of the norm
        merger.bias[A] *= image_gain
        merger.bias[B] = 0
        merger.bias[C] = 0
        merger.bias[0] = constant
        for block in model.blocks:
            for projection in (block.attn.q_proj, block.attn.k_proj, block.attn.v_proj):
                projection.weight[:, 0] = 0  # no head reads the constant
            out = block.attn.o_proj.weight  # [d_model, n_heads * d_head]
            keep_head = 1 if block.layer == 0 else 2
            writes = B if block.layer == 0 else C
            kept = out[:, keep_head * d_head:(keep_head + 1) * d_head].clone()
            out.zero_()
            out[writes, keep_head * d_head:(keep_head + 1) * d_head] = 3.0 * kept[writes]
            block.mlp.down_proj.weight.zero_()
            if block.layer == 1:  # L1H2 (key/value head 1) reads B only
                for projection, index in ((block.attn.q_proj, 2), (block.attn.k_proj, 1), (block.attn.v_proj, 1)):
                    rows = slice(index * d_head, (index + 1) * d_head)
                    projection.weight[rows, :B.start] = 0
                    projection.weight[rows, B.stop:] = 0
                    projection.weight[rows] *= 3.0
        head = model.unembed.lm_head.weight
        head[:, :C.start] = 0
        head *= 20.0
    return model


def plant_answers(model, batch, scale: float = 50.0) -> None:
    """Point each pair's clean and corrupt answer rows of the unembedding (C only) at that run's final
    residual, so every clean run prefers its clean answer and every corrupt run its corrupt one
    (the pairs need distinct answer tokens). Each pair's two rows are then scaled so that every pair has
    the same clean-corrupt logit-difference gap (the mean gap of the unscaled rows): the metric's
    denominator is then clear of its noise floor however the pairs' images differ (a circuit's
    faithfulness is NaN when that gap is within its standard error over the pairs)."""
    with torch.no_grad():
        clean = model(batch.clean, return_type="resid")
        corrupt = model(batch.corrupt, return_type="resid")
        weight = model.unembed.lm_head.weight
        for i in range(batch.n_pairs):
            for token, resid in ((batch.clean_tokens[i], clean), (batch.corrupt_tokens[i], corrupt)):
                row = resid[i, batch.final[i], C]
                weight[token] = 0
                weight[token, C] = scale * row / row.norm()
        gaps = _answer_gaps(model, batch)  # logits are linear in the rows: scaling pair i's rows scales its gap
        for i in range(batch.n_pairs):
            for token in (batch.clean_tokens[i], batch.corrupt_tokens[i]):
                weight[token] *= gaps.mean() / gaps[i]


def _answer_gaps(model, batch) -> torch.Tensor:
    """[n_pairs] (corrupt minus clean answer logit) on the corrupt run minus the same on the clean run."""
    rows = torch.arange(batch.n_pairs)

    def difference(inputs) -> torch.Tensor:
        logits = model(inputs)[rows, batch.final]
        return logits[rows, batch.corrupt_tokens] - logits[rows, batch.clean_tokens]

    return difference(batch.corrupt) - difference(batch.clean)
