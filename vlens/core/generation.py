"""Autoregressive decoding for `HookedVLM` with a KV cache and hooks active at every step."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from jaxtyping import Int
from torch import Tensor, nn
from tqdm.auto import tqdm

from vlens.core.architectures.base import ArchitectureAdapter
from vlens.core.components.attention import KVCache
from vlens.core.config import VLMConfig
from vlens.core.hooks import HookedRootModule, HookPoint
from vlens.core.inputs import VLMInputs
from vlens.core.runtime import RunState, build_masks
from vlens.utils.finite import finite_rows, warn_non_finite
from vlens.utils.validation import check_count, check_float


class DecodingModel(Protocol):
    """What decoding uses of a model (`HookedVLM` has all of it)."""

    @property
    def cfg(self) -> VLMConfig: ...

    @property
    def adapter(self) -> ArchitectureAdapter: ...

    @property
    def processor(self) -> Any: ...

    @property
    def tokenizer(self) -> Any: ...

    @property
    def embed(self) -> nn.Module: ...

    @property
    def rotary(self) -> nn.Module: ...

    @property
    def hook_embed(self) -> HookPoint: ...

    @property
    def hook_inputs_embeds(self) -> HookPoint: ...

    def hooks(self, fwd_hooks: Sequence = ...) -> AbstractContextManager[Any]: ...

    def start_run(self, inputs: VLMInputs, kv_cache: KVCache | None = None) -> RunState: ...

    def run_blocks(self, resid: Tensor, state: RunState, start_at_layer: int = 0,
                   stop_at_layer: int | None = None) -> Tensor: ...

    def finish(self, resid: Tensor) -> Tensor: ...


@dataclass
class GenerationOutput:
    """tokens: [batch, n_new] new token ids (padding after EOS); texts: decoded new text per row,
    cut at EOS, special tokens removed; sequences: [batch, prompt + n_new]; non_finite: [batch]
    bool, True where some step's logits were NaN/inf (the row's tokens are then meaningless and
    a `NonFiniteWarning` was issued)."""

    tokens: Int[Tensor, "batch new"]
    texts: list[str]
    sequences: Int[Tensor, "batch total"]
    non_finite: Tensor | None = None


def _choose(logits: Tensor, do_sample: bool, temperature: float, top_p: float, top_k: int | None,
            generator: torch.Generator | None) -> Tensor:
    """Next token per row from last-position logits [batch, d_vocab]."""
    if not do_sample:
        return logits.argmax(dim=-1)
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature}.")
    logits = logits.float() / temperature
    if top_k is not None and top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop = cumulative - sorted_logits.softmax(-1) > top_p  # keep the smallest set reaching top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate(model: DecodingModel, inputs: VLMInputs, max_new_tokens: int = 16, do_sample: bool = False,
             temperature: float = 1.0, top_p: float = 1.0, top_k: int | None = None,
             fwd_hooks: Sequence = (), seed: int | None = None, verbose: bool = False) -> GenerationOutput:
    """Greedy (default) or sampled decoding; stops when every row has emitted an EOS token.

    `fwd_hooks` (TransformerLens (name, fn) pairs) stay active for the prompt and every decoding
    step (during decoding, position-indexed hooks see pos == 1). Hooks are removed on exit.
    """
    check_count(max_new_tokens, "max_new_tokens")
    if do_sample:  # NaN would pass every comparison below and sample from garbage
        check_float(temperature, "temperature", min=0, min_open=True)
        check_float(top_p, "top_p", min=0, max=1, min_open=True)
        check_count(top_k, "top_k", min=0, allow_none=True)  # 0 or None: no top-k filter
    cfg = model.cfg
    eos = torch.tensor(cfg.eos_token_ids or [], dtype=torch.long, device=inputs.input_ids.device)
    pad_id = cfg.pad_token_id if cfg.pad_token_id is not None else (cfg.eos_token_ids or [0])[0]
    generator = torch.Generator(device="cpu").manual_seed(seed) if seed is not None else None
    batch = inputs.batch_size
    # sliding-window layers keep only their window, as HF's cache does
    cache = KVCache(cfg.n_layers, windows=[cfg.attention_window(layer) for layer in range(cfg.n_layers)])
    new_tokens = []
    finished = torch.zeros(batch, dtype=torch.bool, device=inputs.input_ids.device)
    non_finite = torch.zeros(batch, dtype=torch.bool, device=inputs.input_ids.device)
    attention_mask = inputs.attention_mask
    with model.hooks(fwd_hooks=list(fwd_hooks)):
        state = model.start_run(inputs, kv_cache=cache)
        logits = model.finish(model.run_blocks(state.resid, state))[:, -1]
        for _ in tqdm(range(max_new_tokens), desc="generate", disable=not verbose):
            non_finite |= ~finite_rows(logits).to(non_finite.device) & ~finished
            token = _choose(logits, do_sample, temperature, top_p, top_k, generator).to(finished.device)
            token = torch.where(finished, torch.full_like(token, pad_id), token)
            new_tokens.append(token)
            if len(eos):
                finished = finished | torch.isin(token, eos)
            if bool(finished.all()) or len(new_tokens) == max_new_tokens:
                break
            attention_mask = torch.cat([attention_mask, torch.ones_like(attention_mask[:, :1])], dim=1)
            logits = _decode_step(model, token, attention_mask, state, cache)
    tokens = torch.stack(new_tokens, dim=1)
    if bool(non_finite.any()):
        rows = non_finite.nonzero().flatten().tolist()
        hooked = model if isinstance(model, HookedRootModule) else None  # to say where the NaN starts
        warn_non_finite("generate", f"the next-token logits of batch rows {rows[:6]}", hooked, inputs, fwd_hooks)
    return GenerationOutput(tokens=tokens, texts=_decode_texts(model, tokens, eos),
                            sequences=torch.cat([inputs.input_ids, tokens], dim=1), non_finite=non_finite.cpu())


def _decode_step(model: DecodingModel, token: Tensor, attention_mask: Tensor, prefill: RunState,
                 cache: KVCache) -> Tensor:
    """Run one new token per row through the cached decoder; returns last logits [batch, d_vocab]."""
    resid = model.hook_inputs_embeds(model.hook_embed(model.embed(token[:, None])))
    if prefill.rope_deltas is not None:
        position_ids = model.adapter.decode_position_ids(attention_mask, 1, prefill.rope_deltas)
    else:
        position_ids = model.adapter.decode_position_ids(attention_mask, 1, torch.zeros_like(token)[:, None])
    cos, sin = model.rotary(resid, position_ids)
    masks = build_masks(attention_mask, token.shape[0], 1, cache.length, resid.dtype, resid.device)
    state = RunState(resid=resid, cos=cos, sin=sin, masks=masks, position_ids=position_ids, kv_cache=cache)
    return model.finish(model.run_blocks(resid, state))[:, -1]


def _decode_texts(model: DecodingModel, tokens: Tensor, eos: Tensor) -> list[str]:
    if model.processor is None:
        return ["" for _ in range(tokens.shape[0])]
    eos_ids = set(eos.tolist())
    texts = []
    for row in tokens.tolist():
        cut = next((i for i, t in enumerate(row) if t in eos_ids), len(row))
        texts.append(model.tokenizer.decode(row[:cut], skip_special_tokens=True).strip())
    return texts
