"""Attribution over the image: one score per image token, three estimates and the exact value.

The tokens scored are those of the grid that covers the whole image (`inputs.regions`; for an
anyres image its base view, not its high-resolution tiles), so that the maps lie on the picture.

Token t's *inputs* are its merged input embedding e_t (`hook_inputs_embeds` at its position)
and, for Qwen3-VL, the DeepStack features added at its position after the early blocks. With
M the metric (default logit[corrupt answer] - logit[clean answer] at the final position) and
Delta_t = inputs_t(corrupt) - inputs_t(clean):

    gradient_x_input         dM/d inputs_t |clean . inputs_t(clean)          (saliency; no corrupt run)
    attribution_patching     dM/d inputs_t |clean . Delta_t                  (AtP of the token)
    integrated_gradients     (1/m) sum_k dM/d inputs_t |x(k/m) . Delta_t     (with ig_steps=m; the path of EAP-IG)
    exact                    M(clean run with token t's inputs from the corrupt run) - M(clean)

`attribution_patching` of a token equals the sum of the EAP scores of every edge out of that
token's input node, `integrated_gradients` the sum of its EAP-IG scores, and `exact` the exact
patching of all those edges at once. Summed over every input position, the integrated
gradients tend to M(corrupt) - M(clean) as m grows (the path's two ends).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from jaxtyping import Float
from PIL import Image
from torch import Tensor

from vlens.circuits.attribution import interpolate_state
from vlens.circuits.graph import image_records
from vlens.circuits.results import decode_image, encode_image
from vlens.circuits.runs import CircuitMetric, circuit_options, pair_batch, record_run, thumbnail
from vlens.core.runtime import RunState
from vlens.parallel.options import SweepOptions
from vlens.patching.attribution import spearman
from vlens.patching.fast import repeat_run_state
from vlens.patching.metrics import MetricFn
from vlens.patching.pairs import PairBatch
from vlens.patching.sharded import pair_chunks
from vlens.utils.errors import UserInputError
from vlens.utils.finite import json_safe
from vlens.utils.results import Result
from vlens.utils.validation import check_count
from vlens.viz.image_attention import attention_tiles_figure

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM


ESTIMATES: tuple[str, ...] = ("gradient_x_input", "attribution_patching", "integrated_gradients")
MAX_THUMBNAILS = 8  # pairs whose pictures a result keeps for its figure


def _input_gradients(model: HookedVLM, state: RunState, metric: CircuitMetric) -> tuple[Tensor, dict[int, Tensor], Tensor]:
    """(dM/d resid_in [b, p, d], {layer: dM/d DeepStack features [n_tokens, d]}, M per pair)."""
    with torch.enable_grad():
        resid = state.resid.detach().requires_grad_(True)
        feats = {layer: f.detach().requires_grad_(True) for layer, (_, f) in state.deepstack.items()}
        run_state = replace(state, resid=resid, deepstack={k: (state.deepstack[k][0], f) for k, f in feats.items()},
                            _moved={})
        values = metric(model, model.run_blocks(resid, run_state))[0]
        grads = torch.autograd.grad(values.sum(), [resid, *feats.values()], allow_unused=True)
    resid_grad = torch.zeros_like(resid) if grads[0] is None else grads[0]
    feat_grads = {k: torch.zeros_like(feats[k]) if g is None else g for k, g in zip(feats, grads[1:], strict=True)}
    return resid_grad.detach(), feat_grads, values.detach()


def _per_position(resid_grad: Tensor, feat_grads: dict[int, Tensor], resid_value: Tensor, feat_values: dict[int, Tensor],
                  state: RunState) -> Tensor:
    """[b, p]: sum over a position's inputs of gradient . value."""
    out = (resid_grad.float() * resid_value.float()).sum(-1)
    for layer, grad in feat_grads.items():
        mask = state.deepstack[layer][0].to(out.device)
        out[mask] += (grad.float() * feat_values[layer].float()).sum(-1)
    return out


def _token_positions(batch: PairBatch, image: int) -> tuple[Tensor, tuple[int, int]]:
    """([n_pairs, n_tokens] the positions of image `image`'s grid tokens in every row, the grid): the
    tokens of the view that covers the whole image (an anyres image's base view)."""
    regions = batch.clean.token_regions
    rows, grids = [], set()
    for row in range(batch.n_pairs):
        if image >= len(regions.images[row]):
            raise UserInputError(f"pair {batch.pair_ids[row]!r} has no image {image}: image attribution needs the "
                                 "same images in every pair")
        view = next((r for r in image_records(regions, row, image) if r.spatial and r.kind in ("image", "base")), None)
        if view is None:
            raise UserInputError(f"image {image} of pair {batch.pair_ids[row]!r} has no grid that covers the whole "
                                 "image, so its tokens cannot be drawn over it")
        rows.append(view.positions.cpu())
        grids.add((int(view.grid[0]), int(view.grid[1])))
    if len(grids) != 1:
        raise UserInputError(f"the pairs' images have different token grids ({sorted(grids)}): image attribution "
                             "needs images of one size (one token grid)")
    return torch.stack(rows), grids.pop()


def _exact_token_patches(model: HookedVLM, state: RunState, corrupt: RunState, metric: CircuitMetric, positions: Tensor,
                         max_batch: int) -> Tensor:
    """[n_pairs, n_tokens] the metric with one image token's inputs (embedding, DeepStack features)
    taken from the corrupt run; one copy of the batch per token, `max_batch` rows per forward."""
    n, n_tokens = positions.shape
    per = max(1, max_batch // n)
    rows = torch.arange(n)
    index_of = {}
    for layer, (mask, _) in state.deepstack.items():
        flat = torch.full(mask.shape, -1, dtype=torch.long)
        flat[mask.cpu()] = torch.arange(int(mask.sum()))
        index_of[layer] = flat
    out = torch.zeros(n, n_tokens)
    for start in range(0, n_tokens, per):
        tokens = list(range(start, min(start + per, n_tokens)))
        k = len(tokens)
        repeated = repeat_run_state(state, k)
        resid = repeated.resid.clone()
        deepstack = {layer: (mask, feats.clone()) for layer, (mask, feats) in repeated.deepstack.items()}
        for c, token in enumerate(tokens):
            pos = positions[:, token].to(resid.device)
            resid[c * n + rows.to(resid.device), pos] = corrupt.resid[rows.to(resid.device), pos]
            for layer, flat in index_of.items():
                local = flat[rows, positions[:, token]]
                n_feats = state.deepstack[layer][1].shape[0]
                deepstack[layer][1][c * n_feats + local] = corrupt.deepstack[layer][1][local]
        run_state = replace(repeated, resid=resid, deepstack=deepstack, _moved={})
        values = metric(model, model.run_blocks(resid, run_state)).float().cpu()  # [k, n]
        out[:, start:start + k] = values.T
    return out


@dataclass
class ImageAttribution(Result):
    """Per image-token scores. scores[method][i]: [n_pairs, n_tokens of image i] (row-major over
    grids[i]); methods: those of `ESTIMATES` that were run and "exact" (the change of the metric,
    patched minus clean, when only that token's inputs come from the corrupt run)."""

    grids: list[tuple[int, int]]
    scores: dict[str, list[Tensor]]
    metric: str
    pair_ids: list[str]
    clean_metric: Float[Tensor, " n_pairs"]
    corrupt_metric: Float[Tensor, " n_pairs"]
    ig_steps: int | None = None
    thumbnails: list[list[Image.Image]] | None = None

    kind: ClassVar[str] = "image_attribution"
    # checked when a file is read: one grid and one map per method for each image, a pair id per metric
    saved_dims: ClassVar[dict[str, str]] = {"grids": "n_images", "scores[*]": "n_images", "pair_ids": "n_pairs"}

    def agreement(self, image: int = 0) -> dict[str, dict[str, float]]:
        """Each estimate against the exact token patching: mean over pairs of the Spearman correlation
        across tokens, and the correlation of the pair-mean maps."""
        if "exact" not in self.scores:
            return {}
        exact = self.scores["exact"][image]
        out = {}
        for method, maps in self.scores.items():
            if method == "exact":
                continue
            per_pair = [spearman(maps[image][i], exact[i]) for i in range(exact.shape[0])]
            finite = [v for v in per_pair if v == v]
            out[method] = {"spearman_per_pair_mean": sum(finite) / len(finite) if finite else float("nan"),
                           "spearman_of_mean_map": spearman(maps[image].mean(0), exact.mean(0))}
        return out

    def to_dict(self) -> dict:
        return json_safe({
            "kind": self.kind, "metric": self.metric, "ig_steps": self.ig_steps, "grids": [list(g) for g in self.grids],
            "definition": "per image token: the change of the metric (patched minus clean) when that token's inputs "
                          "come from the corrupt run (exact), and its first-order / integrated estimates",
            "pair_ids": list(self.pair_ids),
            "scores": {method: [m.tolist() for m in maps] for method, maps in self.scores.items()},
            "agreement_with_exact": {str(i): self.agreement(i) for i in range(len(self.grids))},
            "clean_metric": self.clean_metric.tolist(), "corrupt_metric": self.corrupt_metric.tolist(),
            "thumbnails_png": None if self.thumbnails is None else
            [[encode_image(picture) for picture in pair] for pair in self.thumbnails],
        })

    @classmethod
    def from_dict(cls, data: dict) -> ImageAttribution:

        def tensor(rows) -> Tensor:
            return torch.tensor([[float("nan") if v is None else v for v in row] for row in rows])

        thumbs = data.get("thumbnails_png")
        return cls(grids=[tuple(g) for g in data["grids"]],
                   scores={m: [tensor(x) for x in maps] for m, maps in data["scores"].items()},
                   metric=data["metric"], pair_ids=list(data["pair_ids"]),
                   clean_metric=torch.tensor([float("nan") if v is None else v for v in data["clean_metric"]]),
                   corrupt_metric=torch.tensor([float("nan") if v is None else v for v in data["corrupt_metric"]]),
                   ig_steps=data.get("ig_steps"),
                   thumbnails=None if thumbs is None else
                   [[picture for picture in (decode_image(p) for p in pair) if picture is not None] for pair in thumbs])

    def plot(self, pair: int = 0, image: int = 0):
        """One tile per method over pair `pair`'s clean image, on one signed colour scale."""
        if self.thumbnails is None or pair >= len(self.thumbnails) or image >= len(self.thumbnails[pair]):
            raise UserInputError(f"this result keeps no picture of pair {pair} image {image} (it keeps the first "
                                 f"{0 if self.thumbnails is None else len(self.thumbnails)} pairs' pictures)")
        methods = [m for m in (*ESTIMATES, "exact") if m in self.scores]
        maps = torch.stack([self.scores[m][image][pair] for m in methods])
        titles = [m.replace("_", " ") for m in methods]
        figure = attention_tiles_figure(self.thumbnails[pair][image], maps, self.grids[image], titles=titles,
                                        n_cols=len(methods), tile_size=160, signed=True,
                                        value_label=f"change of {self.metric}")
        return figure.update_layout(title=f"attribution over the image, pair {self.pair_ids[pair]}")


def image_attribution(model: HookedVLM, pairs: Any, metric: MetricFn | None = None, ig_steps: int | None = None,
                      exact: bool = True, options: SweepOptions | None = None) -> ImageAttribution:
    """Per image-token attribution scores (see the module docstring) for every image of the pairs.

    ig_steps: also the integrated gradients along corrupt -> clean inputs with this many steps.
    exact: also patch each token exactly (one forward row per token and pair), to check the
        estimates against.
    options: `vlens.SweepOptions`: batch_size (pairs per chunk), max_batch (rows per forward of
        the exact token patching), readout, progress, sharding.
    """
    options = circuit_options(options, "image_attribution")
    max_batch = options.max_batch
    batch, _ = pair_batch(model, pairs)
    pictures = None if isinstance(pairs, PairBatch) else [getattr(p, "clean_image", None) for p in pairs]
    ig_steps = None if ig_steps is None else check_count(ig_steps, "ig_steps")
    regions = batch.clean.token_regions
    n_images = len(regions.images[0]) if regions.images else 0
    if n_images == 0:
        raise UserInputError("these pairs have no images: image attribution needs image tokens")
    found = [_token_positions(batch, i) for i in range(n_images)]
    positions, grids = [p for p, _ in found], [g for _, g in found]
    circuit_metric = CircuitMetric(batch, metric, options.readout)
    chunks = pair_chunks(batch.n_pairs, options.batch_size)

    def unit(rows: list[int]) -> dict:
        sub = batch if len(chunks) == 1 else batch.select(rows)
        sub_metric = circuit_metric if len(chunks) == 1 else circuit_metric.subset(rows)
        with torch.no_grad():
            clean_state, corrupt_state = model.start_run(sub.clean), model.start_run(sub.corrupt)
            corrupt_values = sub_metric(model, record_run(model, corrupt_state).final)[0].float().cpu()
        delta_resid = corrupt_state.resid - clean_state.resid
        delta_feats = {k: corrupt_state.deepstack[k][1] - f for k, (_, f) in clean_state.deepstack.items()}
        grad, feat_grads, clean_values = _input_gradients(model, clean_state, sub_metric)
        maps = {"gradient_x_input": _per_position(grad, feat_grads, clean_state.resid,
                                                  {k: f for k, (_, f) in clean_state.deepstack.items()}, clean_state),
                "attribution_patching": _per_position(grad, feat_grads, delta_resid, delta_feats, clean_state)}
        if ig_steps is not None:
            total = torch.zeros_like(maps["attribution_patching"])
            for k in range(1, ig_steps + 1):
                state = interpolate_state(clean_state, corrupt_state, k / ig_steps)
                g, fg, _ = _input_gradients(model, state, sub_metric)
                total += _per_position(g, fg, delta_resid, delta_feats, clean_state)
            maps["integrated_gradients"] = total / ig_steps
        out: dict = {"clean": clean_values.float().cpu(), "corrupt": corrupt_values}
        sub_positions = [p if len(chunks) == 1 else p[rows] for p in positions]
        for method, values in maps.items():
            out[method] = [values.cpu().gather(1, p) for p in sub_positions]
        if exact:
            with torch.no_grad():
                out["exact"] = [_exact_token_patches(model, clean_state, corrupt_state, sub_metric, p, max_batch)
                                - clean_values.float().cpu()[:, None] for p in sub_positions]
        return out

    results = options.shards.map(chunks, unit, desc="image attribution", progress=options.progress)
    methods = [m for m in (*ESTIMATES, "exact") if m in results[0]]
    scores = {m: [torch.cat([r[m][i] for r in results]) for i in range(n_images)] for m in methods}
    thumbs = None
    if pictures is not None and all(p is not None for p in pictures):
        thumbs = []
        for image in pictures[:MAX_THUMBNAILS]:
            images = image if isinstance(image, (list, tuple)) else [image]
            thumbs.append([picture for picture in (thumbnail(i) for i in images) if picture is not None])
    return ImageAttribution(grids=grids, scores=scores, metric=circuit_metric.name, pair_ids=list(batch.pair_ids),
                            clean_metric=torch.cat([r["clean"] for r in results]),
                            corrupt_metric=torch.cat([r["corrupt"] for r in results]), ig_steps=ig_steps,
                            thumbnails=thumbs)
