"""Lenses: decode the residual stream and single heads into vocabulary space.

Kept import-light on purpose: import the submodules you need, e.g.
``from vlens.lens.headlens import HeadLens`` or ``from vlens.lens.translators import Translators``.

- ``logit_lens``: decode the residual stream layer by layer (``vlens logit-lens``).
- ``decomposition``: per-head contributions ``z_i @ W_O[i]`` (sum + b_O == hook_attn_out).
- ``base``: the `Lens` interface (``forward(resid, layer) -> logits``): `LogitLens`, `TunedLens`, `HeadLens`.
- ``translators``: per-layer affine translators (tuned-lens form), `TunedLens`, training, save/load.
- ``headlens``: per-head logits and top-k tokens through translator + final norm + unembedding.
- ``head_scores``: VGS, CTER, image attention, answer alignment, existence / difficulty response.
- ``taxonomy``: the paper's head classes from explicit thresholds, table and layer x head map.
- ``corpus``, ``readout``, ``vocabularies``: task-suite inputs, the frozen final norm + unembedding,
  word lists mapped through the tokenizer.
"""
