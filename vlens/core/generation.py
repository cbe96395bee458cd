"""Autoregressive decoding for `HookedVLM` with a KV cache and hooks active at every step."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn
from tqdm.auto import tqdm

from vlens.core.architectures.base import ArchitectureAdapter
from vlens.core.cache import VLMActivationCache
from vlens.core.components.attention import KVCache
from vlens.core.config import VLMConfig
from vlens.core.generation_cache import NamesFilter, StepRecorder, resolve_names
from vlens.core.hooks import HookedRootModule, HookPoint
from vlens.core.inputs import VLMInputs
from vlens.core.runtime import RunState, build_masks
from vlens.utils.errors import UserInputError
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

    @property
    def hook_dict(self) -> dict[str, Any]: ...

    def hooks(self, fwd_hooks: Sequence = ...) -> AbstractContextManager[Any]: ...

    def start_run(self, inputs: VLMInputs, kv_cache: KVCache | None = None) -> RunState: ...

    def coerce_inputs(self, inputs: Any = None, **hf_kwargs: Any) -> VLMInputs: ...

    def run_blocks(self, resid: Tensor, state: RunState, start_at_layer: int = 0,
                   stop_at_layer: int | None = None) -> Tensor: ...

    def finish(self, resid: Tensor) -> Tensor: ...


@dataclass
class GenerationOutput:
    """tokens: [batch, n_new] new token ids (padding after EOS); texts: decoded new text per row,
    cut at EOS, special tokens removed; sequences: [batch, prompt + n_new]; non_finite: [batch]
    bool, True where some step's logits were NaN/inf (the row's tokens are then meaningless and
    a `NonFiniteWarning` was issued); cache: with ``return_cache=True``, the activations of the
    prompt and of every new token over ``sequences`` (`vlens.core.generation_cache`), as
    ``run_with_cache(continuation_inputs(model, inputs, tokens))`` gives them; attention_mask:
    [batch, prompt + n_new], the mask the decoding ran with (the prompt's, then ones)."""

    tokens: Int[Tensor, "batch new"]
    texts: list[str]
    sequences: Int[Tensor, "batch total"]
    non_finite: Tensor | None = None
    cache: VLMActivationCache | None = None
    attention_mask: Int[Tensor, "batch total"] | None = None


def next_token_logits(logits: Float[Tensor, "batch d_vocab"], counts: Tensor | None = None, do_sample: bool = False,
                      temperature: float = 1.0, top_p: float | None = None, top_k: int | None = None,
                      freq_penalty: float = 0.0, repetition_penalty: float = 1.0) -> Float[Tensor, "batch d_vocab"]:
    """The logits the next token is chosen from (fp32), as HF's logits processors and TransformerLens's
    ``sample_logits`` shape them, in this order:

    1. repetition_penalty (HF's): every token already in the row (`counts` > 0) has its logit divided
       by the penalty when positive, multiplied when negative (greedy decoding too);
    2. when sampling (``do_sample`` and ``temperature > 0``): divided by `temperature`; minus
       ``freq_penalty * counts`` (TransformerLens's frequency penalty: how often each token occurs
       in the row so far); top_k keeps the k largest (ties kept); top_p keeps the smallest set whose
       probability reaches top_p. Both filters apply when both are given, as in HF
       (TransformerLens then uses top_k alone).

    counts: [batch, d_vocab] occurrences of each token among the row's attended tokens (prompt and
        generated), needed for either penalty.
    """
    logits = logits.float()
    if repetition_penalty != 1.0 and counts is not None:
        seen = counts > 0
        logits = torch.where(seen, torch.where(logits < 0, logits * repetition_penalty, logits / repetition_penalty),
                             logits)
    if not do_sample or temperature == 0:
        return logits
    logits = logits / temperature
    if freq_penalty and counts is not None:
        logits = logits - freq_penalty * counts.to(logits.dtype)
    if top_k is not None and top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs > top_p  # keep the smallest set reaching top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return logits


def _choose(logits: Tensor, do_sample: bool, temperature: float, generator: torch.Generator | None) -> Tensor:
    """Next token per row from processed last-position logits [batch, d_vocab]."""
    if not do_sample or temperature == 0:  # temperature 0 is greedy, as in TransformerLens
        return logits.argmax(dim=-1)
    probs = logits.softmax(-1)
    return torch.multinomial(probs.cpu() if generator is not None else probs, 1, generator=generator).squeeze(-1)


@dataclass
class _Decoding:
    """What the loop carries between steps: the running attention mask, token counts, finished rows."""

    attention_mask: Tensor
    counts: Tensor | None
    finished: Tensor


@torch.no_grad()
def generate(model: DecodingModel, inputs: VLMInputs, max_new_tokens: int = 16, do_sample: bool = False,
             temperature: float = 1.0, top_p: float | None = 1.0, top_k: int | None = None,
             fwd_hooks: Sequence = (), seed: int | None = None, verbose: bool = False, stop_at_eos: bool = True,
             eos_token_id: int | Sequence[int] | None = None, use_past_kv_cache: bool = True,
             freq_penalty: float = 0.0, repetition_penalty: float = 1.0, return_cache: bool = False,
             names_filter: NamesFilter = None, cache_device: str | torch.device | None = None) -> GenerationOutput:
    """Greedy (default) or sampled decoding, TransformerLens's keywords with TransformerLens's meaning.

    do_sample: sample (default False: greedy, HF's default; TransformerLens samples by default);
        ``temperature=0`` is greedy even when sampling, as in TransformerLens.
    temperature, top_k, top_p, freq_penalty, repetition_penalty: see `next_token_logits`.
    stop_at_eos: stop a row at its first end token (the row is padded after it) and stop when
        every row has; False generates ``max_new_tokens`` for every row.
    eos_token_id: the end token(s) (default: the model's, ``cfg.eos_token_ids``).
    use_past_kv_cache: decode with a KV cache (default); False reruns the whole sequence, image
        included, at every step (the same tokens, slower: a reference, or for hooks that need
        every position at every step).
    fwd_hooks: TransformerLens (name, fn) pairs, active for the prompt and every decoding step
        (with the cache, position-indexed hooks see pos == 1 during decoding). Removed on exit.
        A hook reads the decoding step from ``hook.ctx["step"]``: -1 for the prompt (which predicts
        new token 0), s >= 0 for the forward that reads new token s (at sequence position
        ``prompt_len + s``) and predicts token s + 1; ``hook.ctx["pos_offset"]`` is the sequence
        position of the forward's first position (0 for the prompt and without the KV cache).
        "Patch only at step k" is ``if hook.ctx["step"] == k: ...`` in one hook.
    seed: seeds a private generator for sampling (None: torch's global one).
    verbose: a progress bar over the new tokens.
    return_cache: also record the activations of the prompt and of every new token (the last one
        included: one more decoder step runs for it) into ``out.cache``, one `VLMActivationCache`
        over ``out.sequences`` (needs the KV cache). names_filter: which hooks (TransformerLens's
        forms; None: every hook but the attention scores); cache_device: where to keep them.
    """
    check_count(max_new_tokens, "max_new_tokens")
    check_float(temperature, "temperature", min=0)
    check_float(repetition_penalty, "repetition_penalty", min=0, min_open=True)
    check_float(freq_penalty, "freq_penalty", min=0)
    if do_sample:  # NaN would pass every comparison below and sample from garbage
        if top_p is not None:
            check_float(top_p, "top_p", min=0, max=1, min_open=True)
        check_count(top_k, "top_k", min=0, allow_none=True)  # 0 or None: no top-k filter
    if not return_cache and (names_filter is not None or cache_device is not None):
        raise UserInputError("generate: names_filter / cache_device choose what return_cache=True records; pass "
                             "return_cache=True with them.")
    if return_cache and not use_past_kv_cache:
        raise UserInputError("generate(return_cache=True) records the decoding steps of the KV cache; without it each "
                             "step reruns every position. Pass use_past_kv_cache=True.")
    cfg = model.cfg
    device = inputs.input_ids.device
    eos_ids = ([eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)) if eos_token_id is not None \
        else list(cfg.eos_token_ids or [])
    if stop_at_eos and eos_token_id is not None and not eos_ids:
        raise UserInputError("generate: eos_token_id is an empty list; name an end token or pass stop_at_eos=False.")
    eos = torch.tensor(eos_ids if stop_at_eos else [], dtype=torch.long, device=device)
    pad_id = cfg.pad_token_id if cfg.pad_token_id is not None else (eos_ids or [0])[0]
    generator = torch.Generator(device="cpu").manual_seed(seed) if seed is not None else None
    batch = inputs.batch_size
    # sliding-window layers keep only their window, as HF's cache does
    cache = KVCache(cfg.n_layers, windows=[cfg.attention_window(layer) for layer in range(cfg.n_layers)]) \
        if use_past_kv_cache else None
    recorder = StepRecorder(resolve_names(names_filter, list(model.hook_dict)), cache, cache_device) \
        if return_cache and cache is not None else None
    new_tokens: list[Tensor] = []
    non_finite = torch.zeros(batch, dtype=torch.bool, device=device)
    penalised = repetition_penalty != 1.0 or (do_sample and freq_penalty > 0)
    run = _Decoding(attention_mask=inputs.attention_mask, counts=None,
                    finished=torch.zeros(batch, dtype=torch.bool, device=device))
    hooks = [*fwd_hooks, *(recorder.fwd_hooks() if recorder is not None else [])]
    with model.hooks(fwd_hooks=hooks), decoding_steps(model) as set_step:
        state = model.start_run(inputs, kv_cache=cache)
        logits = model.finish(model.run_blocks(state.resid, state))[:, -1]
        if penalised:
            run.counts = torch.zeros(batch, logits.shape[-1], dtype=torch.long, device=logits.device)
            run.counts.scatter_add_(1, inputs.input_ids.to(logits.device), inputs.attention_mask.to(logits.device).long())
        for _ in tqdm(range(max_new_tokens), desc="generate", disable=not verbose):
            non_finite |= ~finite_rows(logits).to(device) & ~run.finished
            scores = next_token_logits(logits, run.counts, do_sample, temperature, top_p, top_k, freq_penalty,
                                       repetition_penalty)
            token = _choose(scores, do_sample, temperature, generator).to(device)
            token = torch.where(run.finished, torch.full_like(token, pad_id), token)
            new_tokens.append(token)
            if run.counts is not None:
                run.counts.scatter_add_(1, token[:, None].to(run.counts.device),
                                        (~run.finished)[:, None].long().to(run.counts.device))
            if len(eos):
                run.finished = run.finished | torch.isin(token, eos)
            done = bool(run.finished.all()) or len(new_tokens) == max_new_tokens
            if done and recorder is None:
                break
            # the step that reads this token (when done, it only records the last token's activations)
            run.attention_mask = torch.cat([run.attention_mask, torch.ones_like(run.attention_mask[:, :1])], dim=1)
            step = len(new_tokens) - 1
            if cache is not None:
                set_step(step, inputs.seq_len + step)
                logits = _decode_step(model, token, run.attention_mask, state, cache)
            else:
                set_step(step, 0)
                logits = _rerun(model, inputs, torch.stack(new_tokens, dim=1))
            if done:
                break
    tokens = torch.stack(new_tokens, dim=1)
    if bool(non_finite.any()):
        rows = non_finite.nonzero().flatten().tolist()
        hooked = model if isinstance(model, HookedRootModule) else None  # to say where the NaN starts
        warn_non_finite("generate", f"the next-token logits of batch rows {rows[:6]}", hooked, inputs, fwd_hooks)
    sequences = torch.cat([inputs.input_ids, tokens], dim=1)
    recorded = None
    if recorder is not None:
        recorded = VLMActivationCache(recorder.assemble(sequences.shape[1]), model, has_batch_dim=True)
    mask = torch.cat([inputs.attention_mask, torch.ones_like(tokens)], dim=1)
    return GenerationOutput(tokens=tokens, texts=_decode_texts(model, tokens, eos), sequences=sequences,
                            non_finite=non_finite.cpu(), cache=recorded, attention_mask=mask)


@contextmanager
def decoding_steps(model: DecodingModel) -> Iterator[Callable[[int, int], None]]:
    """Tell every hook point the decoding step (``hook.ctx["step"]``, ``hook.ctx["pos_offset"]``, see
    `generate`); yields ``set_step(step, pos_offset)``, starts at the prompt (-1, 0) and removes both
    keys on exit, also on error."""
    points = list(model.hook_dict.values())

    def set_step(step: int, pos_offset: int) -> None:
        for point in points:
            point.ctx["step"] = step
            point.ctx["pos_offset"] = pos_offset

    set_step(-1, 0)
    try:
        yield set_step
    finally:
        for point in points:
            point.ctx.pop("step", None)
            point.ctx.pop("pos_offset", None)


def continuation_inputs(model: DecodingModel, prompt: VLMInputs, new: Int[Tensor, "batch new"]) -> VLMInputs:
    """The prompt (images included) followed by new tokens [batch, n_new], every new position attended,
    as decoding laid them out: a forward over it equals the generation's steps position by position.

    Raises:
        UserInputError: a new token is an image / video placeholder (a forward would look for its image).
    """
    placeholders = [t for t in (model.cfg.image_token_id, model.cfg.video_token_id) if t is not None]
    if placeholders and bool(torch.isin(new, torch.tensor(placeholders, device=new.device)).any()):
        raise UserInputError(f"the generated tokens hold image / video placeholder ids {placeholders}: a forward over "
                             "prompt + output would look for images that are not there. Generate without them (e.g. "
                             "more tokens of the answer only) before running the continuation.")
    hf = {key: value for key, value in prompt.to_hf_kwargs().items() if key != "mm_token_type_ids"}
    hf["input_ids"] = torch.cat([prompt.input_ids, new.to(prompt.input_ids.device)], dim=1)
    hf["attention_mask"] = torch.cat([prompt.attention_mask, torch.ones_like(hf["input_ids"][:, prompt.seq_len:])],
                                     dim=1)
    return model.coerce_inputs(hf)


def _rerun(model: DecodingModel, prompt: VLMInputs, new: Tensor) -> Tensor:
    """Last logits [batch, d_vocab] of a full forward over the prompt (image included) and the new tokens."""
    state = model.start_run(continuation_inputs(model, prompt, new))
    return model.finish(model.run_blocks(state.resid, state))[:, -1]


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
