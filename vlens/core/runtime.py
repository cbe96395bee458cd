"""The per-forward state shared by all blocks: residual input, rotary tables, masks, DeepStack.

Split from `model.py` so that sweeps can build it once and run only some blocks (e.g. resume
from a cached residual at the patched layer).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from transformers.masking_utils import blockwise_overlay, causal_mask_function, or_masks, sdpa_mask

from vlens.core.components.attention import AttentionMasks, KVCache
from vlens.utils.errors import UserInputError


@dataclass
class RunState:
    """Everything the decoder blocks need besides the residual stream.

    resid: [batch, pos, d_model], the input to block 0 (`hook_inputs_embeds` output).
    cos, sin: [batch, pos, d_head] rotary tables (model dtype), or [batch, pos, n_kinds, d_head] where
        layers read different ones (Gemma 3: each layer type's base; `VLMConfig.rope_layer_types`).
    masks: the attention masks (HF sdpa form and eager form; a sliding-window layer narrows them itself).
    deepstack: layer -> (image-position mask [batch, pos], features [n_image_tokens, d_model]).
    position_ids: the family's position ids; rope_deltas: [batch, 1] for decoding (M-RoPE).
    """

    resid: Tensor
    cos: Tensor
    sin: Tensor
    masks: AttentionMasks
    position_ids: Tensor
    rope_deltas: Tensor | None = None
    deepstack: dict[int, tuple[Tensor, Tensor]] = field(default_factory=dict)
    kv_cache: KVCache | None = None
    _moved: dict = field(default_factory=dict, repr=False)

    def on(self, device: torch.device) -> RunState:
        """This state with the tables, masks and DeepStack features on `device` (a block placed there by a
        device map); copies are made once per device and forward. The KV cache stays per layer."""
        if self.cos.device == device:
            return self
        if device not in self._moved:
            deltas = None if self.rope_deltas is None else self.rope_deltas.to(device)
            deepstack = {layer: (mask.to(device), feats.to(device)) for layer, (mask, feats) in self.deepstack.items()}
            self._moved[device] = RunState(resid=self.resid, cos=self.cos.to(device), sin=self.sin.to(device),
                                           masks=self.masks.to(device), position_ids=self.position_ids.to(device),
                                           rope_deltas=deltas, deepstack=deepstack, kv_cache=self.kv_cache)
        return self._moved[device]


def hook_device(module: object) -> torch.device | None:
    """The device HF/accelerate runs `module` on (its dispatch hook's execution device), if it has one."""
    device = getattr(getattr(module, "_hf_hook", None), "execution_device", None)
    if device is None:
        return None
    return torch.device("cuda", device) if isinstance(device, int) else torch.device(device)


def module_device(module: nn.Module) -> torch.device:
    """Where `module` computes: its weights' device or, where HF/accelerate offloaded them (meta tensors
    loaded on each call), the device its dispatch hooks run it on."""
    for param in module.parameters():
        if param.device.type != "meta":
            return param.device
        break
    for sub in module.modules():
        device = hook_device(sub) or hook_device(getattr(sub, "source", None))
        if device is not None:
            return device
    raise UserInputError(f"cannot tell where {type(module).__name__} runs: its weights are on the meta device and "
                     "no accelerate hook places them; load the model with a device_map (and offload_folder) "
                     "or materialise its weights")


def build_masks(attention_mask: Tensor | None, batch: int, q_len: int, past_len: int,
                dtype: torch.dtype, device: torch.device, blocks: Tensor | None = None) -> AttentionMasks:
    """Causal + padding masks exactly as HF builds them (its `sdpa_mask`).

    attention_mask: [batch, past_len + q_len] (1 = real token) or None.
    blocks: [batch, <= past_len + q_len] bidirectional blocks (`ArchitectureAdapter.attention_blocks`:
        the tokens of one block see each other, -1 = causal only; shorter rows are padded with -1),
        OR-ed with the causal mask as HF's `blockwise_overlay` does (Gemma 3's image tokens); None: causal.
    """
    kv_len = past_len + q_len
    padding = attention_mask.to(device=device, dtype=torch.bool) if attention_mask is not None else None
    if blocks is not None:
        blocks = blocks.to(device=device, dtype=torch.long)
        if blocks.shape[-1] < kv_len:
            blocks = torch.nn.functional.pad(blocks, (0, kv_len - blocks.shape[-1]), value=-1)
        allowed = sdpa_mask(batch_size=batch, q_length=q_len, kv_length=kv_len, q_offset=past_len, kv_offset=0,
                            mask_function=or_masks(causal_mask_function, blockwise_overlay(blocks)),
                            attention_mask=padding, device=device, allow_is_causal_skip=False)
        if allowed is None:
            raise RuntimeError("transformers' sdpa_mask returned no mask with allow_is_causal_skip=False")
        # HF materialises the mask whenever blocks are given (also when no token is in one)
        return AttentionMasks(sdpa=allowed, allowed=allowed, dtype=dtype, blocks=blocks)

    def hf_mask(allow_is_causal_skip: bool) -> Tensor | None:
        return sdpa_mask(batch_size=batch, q_length=q_len, kv_length=kv_len, q_offset=past_len, kv_offset=0,
                         attention_mask=padding, device=device, allow_is_causal_skip=allow_is_causal_skip)

    sdpa_form = hf_mask(True)  # None -> sdpa's is_causal, as HF
    # when HF materialises the sdpa mask it is exactly the bool mask; only a plain causal one is skipped
    allowed = sdpa_form if sdpa_form is not None else hf_mask(False)
    if allowed is None:
        raise RuntimeError("transformers' sdpa_mask returned no mask with allow_is_causal_skip=False")
    return AttentionMasks(sdpa=sdpa_form, allowed=allowed, dtype=dtype)
