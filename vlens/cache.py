"""`VLMActivationCache`: TransformerLens's ActivationCache, aware of merged image embeddings.

In a VLM the residual stream starts from `hook_inputs_embeds` (token embeddings with the
image features written at image positions), not from `hook_embed` alone. TransformerLens's
`decompose_resid` would count only `hook_embed`; here the "embed" component is the merged
input, so the components add up to the residual exactly.
"""

from __future__ import annotations

import torch
from transformer_lens.ActivationCache import ActivationCache
from transformer_lens.utilities import Slice


class VLMActivationCache(ActivationCache):
    def decompose_resid(self, layer=None, mlp_input=False, mode="all", apply_ln=False, pos_slice=None,
                        incl_embeds=True, return_labels=False):
        components, labels = super().decompose_resid(layer=layer, mlp_input=mlp_input, mode=mode, apply_ln=False,
                                                     pos_slice=pos_slice, incl_embeds=False, return_labels=True)
        if incl_embeds and "hook_inputs_embeds" in self.cache_dict:
            slicer = pos_slice if isinstance(pos_slice, Slice) else Slice(pos_slice)
            embeds = slicer.apply(self["hook_inputs_embeds"], dim=-2)
            components = torch.cat([embeds[None], components], dim=0)
            labels = ["embed", *labels]
        if apply_ln:
            layer_index = self.model.cfg.n_layers if layer is None or layer == -1 else layer
            components = self.apply_ln_to_stack(components, layer_index, pos_slice=pos_slice, mlp_input=mlp_input)
        return (components, labels) if return_labels else components
