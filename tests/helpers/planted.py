"""A hand-built model whose answer flows through one known head, for known-answer tests and demos.

`planted_model()` zeroes every attention output and every MLP of a tiny random Qwen2.5-VL
except one head (`PLANTED_LAYER`, `PLANTED_HEAD` by default), so the final-position logits
depend on the prompt only through that head. `plant_answers(model, batch)` then sets the
unembedding so that the clean run predicts each pair's clean answer and a run whose final
residual equals the corrupt run's predicts the corrupt answer.

With text pairs that differ in one token (`planted_pairs()`), the patching answers are known:
- layer x head: only the planted head flips the answer (every other head's output is zero);
- layer x position (resid_pre): at layers <= the planted layer only the differing token flips
  it; after the planted layer only the final position does;
- with the final norm's scale held fixed, the logit difference is linear in every head's
  `hook_z` and in the pattern of the planted head, so AtP (and AtP* for queries/keys) is exact.
"""

from __future__ import annotations

import torch

from tests.helpers.models import tiny_vlm
from vlens.patching.conditions import final_logits
from vlens.patching.pairs import PairBatch, PairExample

PLANTED_LAYER = 1
PLANTED_HEAD = 2


def planted_model(n_layers: int = 3, d_model: int = 32, n_heads: int = 4, n_kv_heads: int = 2,
                  layer: int = PLANTED_LAYER, head: int = PLANTED_HEAD, query_scale: float = 4.0, seed: int = 0):
    """A tiny HookedVLM whose only live path to the logits is head `head` of layer `layer`.

    query_scale: multiplies the planted head's query weights (larger -> sharper, more saturated attention).
    """
    model = tiny_vlm("qwen2_5_vl", seed=seed, fresh=True, n_layers=n_layers, d_model=d_model, n_heads=n_heads,
                     n_kv_heads=n_kv_heads)
    d_head = model.cfg.d_head
    with torch.no_grad():
        for block in model.blocks:
            o_weight = block.attn.o_proj.weight
            keep = o_weight[:, head * d_head:(head + 1) * d_head].clone()
            o_weight.zero_()
            if block.layer == layer:
                o_weight[:, head * d_head:(head + 1) * d_head] = keep * 3.0
                q_weight = block.attn.q_proj.weight
                q_weight[head * d_head:(head + 1) * d_head] *= query_scale
            if block.attn.o_proj.bias is not None:
                block.attn.o_proj.bias.zero_()
            block.mlp.down_proj.weight.zero_()
            if getattr(block.mlp.down_proj, "bias", None) is not None:
                block.mlp.down_proj.bias.zero_()
        model.unembed.ln_final_w.fill_(1.0)  # equal-norm final residuals (see plant_answers)
    return model


def planted_pairs() -> list[PairExample]:
    """Two text-only pairs whose prompts differ in exactly one token (the last word)."""
    return [
        PairExample("planted-0", None, None, "How many dots are there ? 3", "How many dots are there ? 5", "3", "5"),
        PairExample("planted-1", None, None, "How many dots are there ? 2", "How many dots are there ? 4", "2", "4"),
    ]


def plant_answers(model, batch: PairBatch, scale: float = 10.0) -> None:
    """Set the unembedding so each pair's clean run predicts its clean answer (in place).

    Each answer token's unembedding row becomes the normalised final residual of its run; all
    other rows and the bias are zero. With equal-norm residuals (final norm weight 1), the run
    itself wins (Cauchy-Schwarz), so a patch that makes the final residual equal the corrupt
    run's flips the prediction to the corrupt answer.
    """
    with torch.no_grad():
        clean_resid = model(batch.clean, return_type="resid")
        corrupt_resid = model(batch.corrupt, return_type="resid")
        weight = model.unembed.lm_head.weight  # [d_vocab, d_model]
        weight.zero_()
        if model.unembed.lm_head.bias is not None:
            model.unembed.lm_head.bias.zero_()
        for i in range(batch.n_pairs):
            weight[batch.clean_tokens[i]] = scale * clean_resid[i, batch.final[i]] / model.cfg.d_model
            weight[batch.corrupt_tokens[i]] = scale * corrupt_resid[i, batch.final[i]] / model.cfg.d_model
        check = final_logits(model, model(batch.clean, stop_at_layer=model.cfg.n_layers), batch.final)
        if not bool((check.argmax(-1).cpu() == batch.clean_tokens).all()):
            raise RuntimeError("planting failed: the clean runs do not predict the clean answers")
