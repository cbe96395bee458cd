"""Steering: add ``strength * direction`` to a residual-side hook at chosen layers, over chosen prompt
positions and / or every generated token, and sweep the strength."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from vlens.steering.results import SteeringResult
from vlens.utils.errors import UserInputError

PROMPT_REGIONS = ("all", "final", "image", "text")


@dataclass(frozen=True)
class SteeringSettings:
    """Where and how hard to steer.

    layers: the decoder layers steered (each gets the whole ``strength * direction``).
    hook: the per-layer hook the direction is added to, ``blocks.{l}.<hook>`` ([batch, pos, d_model]:
        hook_resid_pre / hook_resid_mid / hook_resid_post / hook_attn_out / hook_mlp_out).
    strengths: the sweep (0 is the plain generation, kept as the reference).
    prompt_region: the prompt positions steered ("all", "final", "image", "text"), or None (the
        prompt is left alone; the first new token then comes from the plain prompt).
    generated: steer every generated token's position too (decoding steps >= `from_step`).
    from_step: the first decoding step steered: the forward that reads new token `from_step`, so tokens
        up to ``from_step`` are the plain ones (docs/generation.md, "Hooks that know the step").
    max_new_tokens: tokens generated per row (greedy, stopping at the end token).
    """

    layers: tuple[int, ...] = (0,)
    hook: str = "hook_resid_post"
    strengths: tuple[float, ...] = (0.0, 2.0, 4.0, 8.0)
    prompt_region: str | None = "all"
    generated: bool = True
    from_step: int = 0
    max_new_tokens: int = 16

    def check(self, model: Any) -> None:
        """Refuse settings the model cannot run, naming the fix."""
        n_layers = model.cfg.n_layers
        if not self.layers or any(isinstance(layer, bool) or not 0 <= int(layer) < n_layers for layer in self.layers):
            raise UserInputError(f"steering: layers {list(self.layers)} must be non-empty and in [0, {n_layers}).")
        missing = [name for name in self.hook_names() if name not in model.hook_dict]
        if missing:
            raise UserInputError(f"steering: no hook {missing[0]}; use a per-layer [batch, pos, d_model] hook such "
                                 "as hook_resid_post, hook_resid_pre, hook_attn_out or hook_mlp_out.")
        if not self.strengths or not all(math.isfinite(float(s)) for s in self.strengths):
            raise UserInputError(f"steering: strengths {list(self.strengths)} must be finite numbers (at least one).")
        if self.prompt_region is not None and self.prompt_region not in PROMPT_REGIONS:
            raise UserInputError(f"steering: prompt_region {self.prompt_region!r} is not one of {PROMPT_REGIONS} "
                                 "or None.")
        if self.prompt_region is None and not self.generated:
            raise UserInputError("steering: nothing to steer; set prompt_region, generated=True, or both.")
        if self.from_step < 0 or self.max_new_tokens < 1:
            raise UserInputError("steering: from_step must be >= 0 and max_new_tokens >= 1.")

    def hook_names(self) -> list[str]:
        return [f"blocks.{int(layer)}.{self.hook}" for layer in self.layers]


def steering_hooks(model: Any, inputs: Any, direction: Float[Tensor, "d_model"], strength: float,
                   settings: SteeringSettings) -> list[tuple[str, Callable[..., Tensor]]]:
    """(name, hook) pairs for `model.generate(..., fwd_hooks=...)` (or a forward: the prompt step) that
    add ``strength * direction`` [d_model] as `settings` says; each hook reads the decoding step from
    ``hook.ctx["step"]`` (-1: the prompt; absent outside `generate`: treated as the prompt)."""
    settings.check(model)
    if direction.ndim != 1 or direction.shape[0] != model.cfg.d_model:
        raise UserInputError(f"steering: the direction must be [d_model={model.cfg.d_model}], got "
                             f"{tuple(direction.shape)}.")
    if not bool(torch.isfinite(direction).all()):
        raise UserInputError("steering: the direction holds NaN or inf.")
    mask = None
    if settings.prompt_region is not None:
        mask = torch.zeros(inputs.batch_size, inputs.seq_len, dtype=torch.bool)
        for row in range(inputs.batch_size):
            mask[row, inputs.regions.region(settings.prompt_region, row).cpu()] = True
    prompt_len = inputs.seq_len

    def add(x: Tensor, hook: Any) -> Tensor:
        step = hook.ctx.get("step", -1)
        vector = (float(strength) * direction).to(x.device, x.dtype)
        if step < 0:
            if mask is not None and x.shape[1] == prompt_len:
                x = x + mask.to(x.device)[:, :, None] * vector
        elif settings.generated and step >= settings.from_step:
            x = x.clone()
            x[:, -1] += vector  # the decoding step's one position (the last one without the KV cache)
        return x

    return [(name, add) for name in settings.hook_names()]


def steer(model: Any, inputs: Any, direction: Float[Tensor, "d_model"], settings: SteeringSettings = SteeringSettings(),
          source: str = "", progress: bool = True) -> SteeringResult:
    """Greedy generations of `inputs` (a `VLMInputs` batch) at every strength of `settings`, side by side.

    source: a label for the direction (e.g. "mean difference at blocks.3.hook_resid_post"), recorded.
    Returns a `SteeringResult` (texts [strength][row], tokens, the plain generation).
    """
    settings.check(model)
    direction = direction.detach().float().cpu()
    plain = model.generate(inputs, max_new_tokens=settings.max_new_tokens, return_type="output")
    texts: list[list[str]] = []
    tokens: list[list[list[int]]] = []
    for strength in tqdm(settings.strengths, desc="steer", disable=not progress):
        hooks = steering_hooks(model, inputs, direction, float(strength), settings)
        out = model.generate(inputs, max_new_tokens=settings.max_new_tokens, fwd_hooks=hooks, return_type="output")
        texts.append(list(out.texts))
        tokens.append(out.tokens.tolist())
    prompts = [_prompt_text(model, inputs, row) for row in range(inputs.batch_size)]
    return SteeringResult(prompts=prompts, strengths=[float(s) for s in settings.strengths], texts=texts,
                          tokens=tokens, plain_texts=list(plain.texts), plain_tokens=plain.tokens.tolist(),
                          settings=_settings_dict(settings), direction_norm=float(direction.norm()), source=source)


def _settings_dict(settings: SteeringSettings) -> dict:
    data = asdict(settings)
    data["layers"] = [int(layer) for layer in settings.layers]
    data["strengths"] = [float(s) for s in settings.strengths]
    return data


def _prompt_text(model: Any, inputs: Any, row: int) -> str:
    """The row's prompt text (padding and image placeholders left out)."""
    ids: Sequence[int] = inputs.input_ids[row][inputs.attention_mask[row].bool()].tolist()
    skip = {model.cfg.image_token_id, model.cfg.video_token_id}
    return model.tokenizer.decode([t for t in ids if t not in skip], skip_special_tokens=True).strip()
