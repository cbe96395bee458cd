"""Per generated token, attribution over the image tokens, checked against exact patching.

The output is teacher-forced: one forward over prompt + generated tokens
(`vlens.core.generation.continuation_inputs`) gives, at the position that predicts generated token
k, its metric M_k (log-probability or logit of y_k). Image token t's *inputs* are its merged input
embedding x_t (`hook_inputs_embeds`) and, for Qwen3-VL, the DeepStack features added at its position;
b_t are the same inputs under the baseline (mean of the image's tokens, a blank image, zero, or
another image). With g_{k,t} = dM_k / d inputs_t at the clean run (one backward per generated token):

    gradient_x_activation[k, t]   = g_{k,t} . x_t                 (saliency: no baseline)
    attribution_patching[k, t]    = g_{k,t} . (b_t - x_t)         (first-order estimate of the patch)
    exact[k, r]                   = M_k(tokens of region r at the baseline) - M_k(clean)

A region is a block of region_size x region_size tokens of the image's grid; an estimate of a
region is the sum over its tokens (the first-order estimate of patching them together). One forward
over prompt + output scores every generated token at once, so exact patching costs one forward row
per region, the estimates one forward and one backward per generated token.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float, Int
from PIL import Image
from torch import Tensor
from tqdm.auto import tqdm

from vlens.circuits.runs import thumbnail
from vlens.core.generation import GenerationOutput, continuation_inputs
from vlens.core.inputs import VLMInputs
from vlens.core.runtime import RunState
from vlens.generation_attribution.results import ESTIMATES, GenerationAttribution
from vlens.generation_attribution.settings import GenerationAttributionSettings
from vlens.patching.fast import repeat_run_state
from vlens.utils.errors import UserInputError

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM


@dataclass
class ImageTokens:
    """One image's mapped tokens: positions [n] row-major over grid (its whole-image view), and the
    regions: per region the indices into positions of its tokens, laid out on region_grid."""

    positions: Int[Tensor, " n"]
    grid: tuple[int, int]
    regions: list[Tensor]
    region_grid: tuple[int, int]


def region_blocks(grid: tuple[int, int], size: int) -> tuple[list[Tensor], tuple[int, int]]:
    """Blocks of size x size cells of a (rows, cols) grid, row-major: (per block the row-major cell
    indices it holds, the (rows, cols) of blocks). Edge blocks are smaller where size does not divide."""
    rows, cols = grid
    block_rows, block_cols = math.ceil(rows / size), math.ceil(cols / size)
    cells = torch.arange(rows * cols)
    block = (cells // cols // size) * block_cols + (cells % cols) // size
    return [cells[block == b] for b in range(block_rows * block_cols)], (block_rows, block_cols)


def image_tokens(inputs: VLMInputs, size: int) -> list[ImageTokens]:
    """Row 0's images: each one's whole-image view and its regions."""
    regions = inputs.token_regions
    out = []
    for image in range(len(regions.images[0])):
        view = regions.image_view(0, image)
        grid = (int(view.grid[0]), int(view.grid[1]))
        blocks, block_grid = region_blocks(grid, size)
        out.append(ImageTokens(view.positions.cpu(), grid, blocks, block_grid))
    return out


def with_inputs(model: HookedVLM, state: RunState, resid: Tensor, ids: Tensor) -> RunState:
    """`state` with decoder input `resid` [batch, pos, d_model] and the per-position tables computed from it, as
    `start_run` computes them after `hook_inputs_embeds` (Gemma 4's per-layer inputs are a projection of the
    merged embeddings, so they follow a patched or differentiated input; other families' tables are the same).
    ids: [batch, pos] the rows' tokens."""
    model.embed(ids.to(model.input_device))  # Gemma 4: records the per-layer inputs' token half for the tables
    cos, sin = model.rotary(resid, state.position_ids)
    return replace(state, resid=resid, cos=cos, sin=sin, _moved={})


def _feature_index(state: RunState) -> dict[int, Tensor]:
    """Per DeepStack layer, [pos] the row of its features at each position of row 0 (-1: none)."""
    out = {}
    for layer, (mask, _) in state.deepstack.items():
        row = mask[0].cpu()
        index = torch.full(row.shape, -1, dtype=torch.long)
        index[row] = torch.arange(int(row.sum()))
        out[layer] = index
    return out


BLANK_VALUE = 1e-4  # normalised units: not exactly 0, which Idefics-style towers take for a padding image


def blank_pixels(pixel_values: Tensor) -> Tensor:
    """A uniform image at the processor's normalisation mean, in the layout of `pixel_values`: every value
    BLANK_VALUE (a normalised pixel of 0 is the mean colour; 1e-4 of a standard deviation is far below one
    grey level)."""
    return torch.full_like(pixel_values, BLANK_VALUE)


def baseline_state(model: HookedVLM, state: RunState, full: VLMInputs, baseline: str | VLMInputs,
                   new: Tensor) -> RunState:
    """The run state of prompt + output with every image token's inputs at the baseline (only the
    image positions differ from `state`'s)."""
    if isinstance(baseline, VLMInputs):
        other = continuation_inputs(model, baseline, new[None])
        if other.input_ids.shape != full.input_ids.shape or not torch.equal(other.input_ids.cpu(),
                                                                            full.input_ids.cpu()):
            raise UserInputError("the baseline inputs must be the same prompt with an image of the same size (the "
                                 "same tokens and image-token layout); build them with model.prepare(images=[other], "
                                 "prompts=[the same prompt])")
        return model.start_run(other)
    if baseline == "blank":
        if full.pixel_values is None:
            raise UserInputError("baseline 'blank' needs pixel values; these inputs have none")
        return model.start_run(replace(full, pixel_values=blank_pixels(full.pixel_values)))
    resid = state.resid.clone()
    deepstack = {layer: (mask, feats.clone()) for layer, (mask, feats) in state.deepstack.items()}
    index = _feature_index(state)
    for positions in full.token_regions.images[0]:
        pos = positions.to(resid.device)
        resid[0, pos] = resid[0, pos].mean(0) if baseline == "mean" else 0.0
        for layer, (_, feats) in deepstack.items():
            rows = index[layer][positions].to(feats.device)
            feats[rows] = feats[rows].mean(0) if baseline == "mean" else 0.0
    return replace(state, resid=resid, deepstack=deepstack, _moved={})


def token_metric(model: HookedVLM, resid: Float[Tensor, "batch pos d_model"], predicting: Tensor, targets: Tensor,
                 metric: str) -> Float[Tensor, "batch n_new"]:
    """M_k per row: the log-probability (or logit) of generated token k at the position predicting it."""
    logits = model.finish(resid[:, predicting.to(resid.device)])  # [batch, n_new, d_vocab]
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # float64 models keep float64
    if metric == "logprob":
        logits = logits.log_softmax(-1)
    index = targets.to(logits.device)[None, :, None].expand(logits.shape[0], -1, 1)
    return logits.gather(-1, index)[..., 0]


def _per_position(grad: Tensor, feat_grads: dict[int, Tensor], value: Tensor, feat_values: dict[int, Tensor],
                  index: dict[int, Tensor]) -> Tensor:
    """[pos]: sum over a position's inputs (embedding, DeepStack features) of gradient . value (row 0)."""
    out = (grad[0].double() * value[0].double()).sum(-1).cpu()
    for layer, g in feat_grads.items():
        rows = index[layer] >= 0
        out[rows] += (g.double() * feat_values[layer].double()).sum(-1).cpu()
    return out


def _gradients(model: HookedVLM, state: RunState, base: RunState, ids: Tensor, predicting: Tensor, targets: Tensor,
               metric: str, lens: bool, progress: bool) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """(M [n_new], gradient x activation [n_new, pos], attribution patching [n_new, pos], the residual
    after each layer at the predicting positions [n_layers, n_new, d_model] or None): one forward, one
    backward per generated token."""
    index = _feature_index(state)
    n_new = len(targets)
    with torch.enable_grad():
        resid = state.resid.detach().requires_grad_(True)
        feats = {layer: f.detach().requires_grad_(True) for layer, (_, f) in state.deepstack.items()}
        run = replace(with_inputs(model, state, resid, ids),
                      deepstack={k: (state.deepstack[k][0], f) for k, f in feats.items()})
        hidden, layers = resid, []
        for layer in range(model.cfg.n_layers):  # block by block: the logit lens reads every layer's output
            hidden = model.run_blocks(hidden, run, layer, layer + 1)
            if lens:
                layers.append(hidden[0, predicting.to(hidden.device)].detach())
        values = token_metric(model, hidden, predicting, targets, metric)[0]
        if not bool(torch.isfinite(values).all()):
            raise UserInputError(f"the {metric} of a generated token is not finite ({values.tolist()}): the model's "
                                 "outputs overflow in this dtype; run it in float32")
        delta = base.resid.detach() - state.resid.detach()
        delta_feats = {k: base.deepstack[k][1].detach() - f for k, (_, f) in state.deepstack.items()}
        values_feats = {k: f.detach() for k, (_, f) in state.deepstack.items()}
        gxa = torch.zeros(n_new, resid.shape[1], dtype=torch.float64)
        atp = torch.zeros_like(gxa)
        for k in tqdm(range(n_new), desc="gradients per generated token", disable=not progress, leave=False):
            grads = torch.autograd.grad(values[k], [resid, *feats.values()], retain_graph=k < n_new - 1,
                                        allow_unused=True)
            grad = torch.zeros_like(resid) if grads[0] is None else grads[0]
            feat_grads = {layer: torch.zeros_like(feats[layer]) if g is None else g
                          for layer, g in zip(feats, grads[1:], strict=True)}
            gxa[k] = _per_position(grad, feat_grads, resid.detach(), values_feats, index)
            atp[k] = _per_position(grad, feat_grads, delta, delta_feats, index)
    stacked = torch.stack(layers) if lens else None
    return values.detach().double().cpu(), gxa, atp, stacked


def _exact_patches(model: HookedVLM, state: RunState, base: RunState, ids: Tensor, patch_sets: Sequence[Tensor],
                  predicting: Tensor, targets: Tensor, metric: str, max_batch: int, progress: bool) -> Float[Tensor, "n_sets n_new"]:
    """M [n_sets, n_new] with the inputs (embedding, DeepStack features) of each set of positions
    taken from the baseline run; max_batch sets per forward."""
    index = _feature_index(state)
    out = torch.zeros(len(patch_sets), len(targets), dtype=torch.float64)
    chunks = range(0, len(patch_sets), max_batch)
    for start in tqdm(chunks, desc="exact patching", disable=not progress, leave=False):
        sets = list(patch_sets[start:start + max_batch])
        repeated = repeat_run_state(state, len(sets))
        resid = repeated.resid.clone()
        deepstack = {layer: (mask, feats.clone()) for layer, (mask, feats) in repeated.deepstack.items()}
        for copy, positions in enumerate(sets):
            pos = positions.to(resid.device)
            resid[copy, pos] = base.resid[0, pos]
            for layer, (_, feats) in deepstack.items():
                rows = index[layer][positions]
                n_feats = state.deepstack[layer][1].shape[0]
                feats[copy * n_feats + rows.to(feats.device)] = base.deepstack[layer][1][rows.to(feats.device)]
        run = replace(with_inputs(model, repeated, resid, ids.repeat(len(sets), 1)), deepstack=deepstack)
        out[start:start + len(sets)] = token_metric(model, model.run_blocks(resid, run), predicting, targets,
                                                    metric).cpu()
    return out


def _logit_lens(model: HookedVLM, layers: Tensor, targets: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(probability [n_new, n_layers], rank [n_new, n_layers] (1 = top), top token [n_new, n_layers]) of
    each generated token read from each layer's output by the final norm and unembedding."""
    logits = model.finish(layers).float()  # [n_layers, n_new, d_vocab]
    target = targets.to(logits.device)[None, :, None].expand(logits.shape[0], -1, 1)
    own = logits.gather(-1, target)
    prob = logits.log_softmax(-1).gather(-1, target)[..., 0].exp()
    rank = (logits > own).sum(-1) + 1
    return prob.T.double().cpu(), rank.T.cpu(), logits.argmax(-1).T.cpu()


def _new_tokens(model: HookedVLM, inputs: VLMInputs, continuation: Any, max_new_tokens: int) -> Tensor:
    """The continuation as a 1-D LongTensor: the given tokens, or the greedy generation up to its end token."""
    if continuation is not None:
        new = torch.as_tensor(continuation, dtype=torch.long).flatten()
        if new.numel() == 0:
            raise UserInputError("the continuation is empty: give at least one token to attribute")
        return new
    out = model.generate(inputs, max_new_tokens=max_new_tokens, return_type="output")
    if not isinstance(out, GenerationOutput):
        raise TypeError(f"generate(return_type='output') returned {type(out).__name__}")
    row = out.tokens[0].tolist()
    ends = set(model.cfg.eos_token_ids or [])
    cut = next((i + 1 for i, token in enumerate(row) if token in ends), len(row))  # the end token is kept
    return torch.tensor(row[:cut], dtype=torch.long)


def attribute_generation(model: HookedVLM, inputs: Any, settings: GenerationAttributionSettings | None = None, *,
                         continuation: Sequence[int] | Tensor | None = None, baseline: VLMInputs | None = None,
                         images: Sequence[Any] | None = None, prompt: str = "",
                         progress: bool = True) -> GenerationAttribution:
    """Which image tokens each generated token used (see the module docstring).

    inputs: one prompt with its image(s) (`model.prepare(images=[...], prompts=[...])`, one row).
    continuation: the tokens to attribute (default: the greedy generation of `settings.max_new_tokens`,
        up to and including the end token).
    baseline: the same prompt with another image of the same size (replaces `settings.baseline`).
    images: the PIL images of the prompt, kept as thumbnails for the figures.
    prompt: the prompt's text, for the figures.
    """
    settings = (settings or GenerationAttributionSettings()).check()
    inputs = model.coerce_inputs(inputs)
    if inputs.batch_size != 1:
        raise UserInputError(f"attribute_generation takes one prompt (one row), got {inputs.batch_size}; select a "
                             "row with inputs.select_rows([i])")
    if not inputs.token_regions.images[0]:
        raise UserInputError("this prompt has no image: attribution over the image needs image tokens")
    new = _new_tokens(model, inputs, continuation, settings.max_new_tokens)
    full = continuation_inputs(model, inputs, new[None])
    predicting = torch.arange(inputs.seq_len - 1, inputs.seq_len - 1 + len(new))
    with torch.no_grad():
        state = model.start_run(full)
        base = baseline_state(model, state, full, settings.baseline if baseline is None else baseline, new)
    clean, gxa, atp, layers = _gradients(model, state, base, full.input_ids, predicting, new, settings.metric,
                                         settings.lens, progress)
    found = image_tokens(full, settings.region_size)
    maps: dict[str, list[Tensor]] = {"gradient_x_activation": [], "attribution_patching": []}
    region_maps: dict[str, list[Tensor]] = {m: [] for m in ESTIMATES}
    for image in found:
        for method, per_position in (("gradient_x_activation", gxa), ("attribution_patching", atp)):
            per_token = per_position[:, image.positions]
            maps[method].append(per_token)
            region_maps[method].append(torch.stack([per_token[:, r].sum(-1) for r in image.regions], dim=1))
    # the last set patches every image token: the total effect of the baseline
    patch_sets = [image.positions[r] for image in found for r in image.regions] if settings.exact else []
    patch_sets.append(torch.cat(list(full.token_regions.images[0])).cpu())
    with torch.no_grad():
        patched = _exact_patches(model, state, base, full.input_ids, patch_sets, predicting, new, settings.metric,
                                settings.max_batch, progress) - clean[None]
    if settings.exact:
        region_maps["exact"], start = [], 0
        for image in found:
            region_maps["exact"].append(patched[start:start + len(image.regions)].T.contiguous())
            start += len(image.regions)
    lens_prob = lens_rank = lens_top = None
    if layers is not None:
        with torch.no_grad():
            lens_prob, lens_rank, top = _logit_lens(model, layers, new)
        lens_top = [[str(s) for s in model.to_str_tokens(row.tolist())] for row in top]
    pictures: list[Image.Image] | None = None
    if images is not None:
        small = [thumbnail(image) for image in images]
        pictures = [p for p in small if p is not None]
        if len(pictures) != len(small) or len(pictures) != len(found):
            raise UserInputError(f"images: give the prompt's {len(found)} PIL image(s) in order, for the figures")
    tokens = new.tolist()
    return GenerationAttribution(
        prompt=prompt, tokens=tokens, token_strs=[str(s) for s in model.to_str_tokens(tokens)],
        text=model.tokenizer.decode(tokens, skip_special_tokens=True) if model.tokenizer is not None else "",
        metric=settings.metric, baseline="image" if baseline is not None else settings.baseline,
        grids=[image.grid for image in found], region_size=settings.region_size,
        region_grids=[image.region_grid for image in found], maps=maps, region_maps=region_maps,
        clean_metric=clean, baseline_metric=clean + patched[-1], lens_prob=lens_prob, lens_rank=lens_rank,
        lens_top=lens_top, settings=settings.to_dict(), thumbnails=pictures)
