"""Stage 4 (visual activation patching): layer x region overwrite rate and the layer x head sweep."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from vlens.demo.report_sections import Section
from vlens.demo.settings import DemoSettings
from vlens.parallel.options import SweepOptions
from vlens.patching import build_pair_batch, make_count_pairs, patch_layer_head, patch_layer_region
from vlens.utils.stats import bootstrap_counts, format_interval, format_share

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM


VAP_TITLE = "VAP: overwrite rate per layer and region"
VAP_EXPLANATION = ("Patch the corrupt image's residual (entering each layer) into the clean run at the image, text, "
                   "final or all positions; the overwrite rate is the share of pairs whose correct clean answer now "
                   "becomes the corrupt count (error bars: 95% Wilson intervals over pairs; curves that coincide are "
                   "drawn one over the other with their own dash and marker).")
HEADS_TITLE = "VAP: layer x head sweep"
HEADS_EXPLANATION = ("Patch one head's output (hook_z, all positions) from the corrupt run; the patch effect is the "
                     "move of the logit difference toward the corrupt run (1 = fully corrupt, 0 = unchanged). The "
                     "top heads' numbers carry 95% bootstrap intervals over pairs, and the share of resamples in "
                     "which the first head stays first.")


def handover_layer(image_rate, final_rate, layers) -> int | str:
    """First layer where patching the final position overwrites more than patching the image tokens
    (the count has moved from the image into the text stream), or "none".

    Example: image [0.8, 0.8, 0.1], final [0.0, 0.1, 0.8], layers [0, 1, 2] -> 2.
    """
    for layer, image, final in zip(layers, image_rate.tolist(), final_rate.tolist(), strict=True):
        if final > image:
            return int(layer)
    return "none"


def handover_bootstrap(result, n_resamples: int = 1000, seed: int = 0, level: float = 0.95) -> dict:
    """The hand-off layer (`handover_layer`) of a layer x region sweep with its bootstrap interval over
    pairs: on each resample of the pairs, the overwrite rates of the image and final regions are
    recomputed and the hand-off found again ("none" counts as one past the last layer).

    Returns {"layer", "low", "high" (layers, or "none"), "present_share" (resamples with a hand-off),
    "n_resamples", "level", "image_max_before", "final_max_after" (each: the largest rate on that side
    of the hand-off with its 95% Wilson interval over pairs)}.
    """
    cells = list(result.cells)
    image, final = cells.index("image"), cells.index("final")
    rate = result["overwrite_rate"]
    layer = handover_layer(rate[:, image], rate[:, final], result.layers)
    draws = result.bootstrap_draws(bootstrap_counts(result.n_pairs, n_resamples, seed))["overwrite_rate"]
    beyond = len(result.layers)  # index meaning "no hand-off"
    after = (draws[..., final] > draws[..., image]).double()  # [n_resamples, n_layers]
    first = torch.where(after.any(-1), after.argmax(-1), torch.tensor(beyond))
    tail = (1 - level) / 2
    low_index, high_index = (int(v) for v in torch.quantile(first.double(), torch.tensor(
        [tail, 1 - tail], dtype=torch.float64), interpolation="nearest"))

    def name(index: int) -> int | str:
        return "none" if index >= beyond else int(result.layers[index])

    low, high = result.rate_interval("overwrite_rate")

    def best(column: int, rows: range) -> dict | None:
        if not len(rows):
            return None
        at = max(rows, key=lambda r: float(rate[r, column]))
        return {"layer": int(result.layers[at]), "rate": float(rate[at, column]), "low": float(low[at, column]),
                "high": float(high[at, column])}

    split = beyond if layer == "none" else result.layers.index(layer)
    return {"layer": layer, "low": name(low_index), "high": name(high_index),
            "present_share": float((first < beyond).double().mean()), "n_resamples": n_resamples, "level": level,
            "image_max_before": best(image, range(split)), "final_max_after": best(final, range(split, beyond)),
            "first_layer": int(result.layers[0]), "last_layer": int(result.layers[-1])}


def top_head_share(result, n_resamples: int = 1000, seed: int = 0) -> Tensor:
    """[n_layers, n_heads] share of bootstrap resamples of the pairs in which each head has the largest
    patch effect (NaN effects never lead)."""
    draws = result.bootstrap_draws(bootstrap_counts(result.n_pairs, n_resamples, seed))["patch_effect"]
    flat = draws.flatten(1).nan_to_num(float("-inf"))
    leaders = flat.argmax(1)[flat.max(1).values > float("-inf")]
    return (torch.bincount(leaders, minlength=flat.shape[1]).double() / n_resamples).reshape(draws.shape[1:])


def patching_sections(model: HookedVLM, settings: DemoSettings, progress: bool = True) -> list[Section]:
    try:
        pairs = make_count_pairs(settings.n_pairs, seed=settings.seed, size=settings.image_side,
                                 style=settings.style, counts=settings.counts)
        batch = build_pair_batch(model, pairs)
    except ValueError as err:  # e.g. a tokenizer that does not split counts into differing tokens
        reason = f"no usable count pairs for this model: {err}"
        return [Section.skipped("vap_layer_region", VAP_TITLE, VAP_EXPLANATION, reason),
                Section.skipped("vap_layer_head", HEADS_TITLE, HEADS_EXPLANATION, reason)]

    regions = patch_layer_region(model, batch, options=SweepOptions(progress=progress))
    rate = regions["overwrite_rate"]  # [L, n_regions]
    low, high = regions.rate_interval("overwrite_rate")
    assert regions.baseline is not None  # the default answer metrics keep the unpatched runs
    clean_accuracy = float(regions.baseline.clean_correct.float().mean())
    numbers: dict[str, int | float | str] = {"pairs": batch.n_pairs, "clean accuracy": clean_accuracy}
    numbers["clean accuracy 95% CI"] = format_share(clean_accuracy, batch.n_pairs)
    for column, region in enumerate(regions.cells):
        best = float(rate[:, column].max())
        at = int(rate[:, column].argmax())
        numbers[f"{region}: max rate"] = best
        numbers[f"{region}: max rate 95% CI"] = format_interval(best, float(low[at, column]), float(high[at, column]))
        numbers[f"{region}: at layer"] = int(regions.layers[at]) if best > 0 else "none"
    handover = handover_bootstrap(regions, seed=settings.seed)
    numbers["handover layer (final > image)"] = handover["layer"]
    numbers["handover layer 95% interval"] = (f"{handover['low']}-{handover['high']}" if handover["low"] != handover["high"]
                                              else str(handover["low"]))
    numbers["handover present (bootstrap share)"] = handover["present_share"]
    note = "" if clean_accuracy > 0 else " (no clean run is correct, so every rate is 0 here)"
    as_json = regions.to_dict()
    region_section = Section(
        key="vap_layer_region", title=VAP_TITLE, explanation=VAP_EXPLANATION + note,
        figure=regions.plot("overwrite_rate").update_yaxes(range=[0, 1.05]), numbers=numbers,
        data={**{k: as_json[k] for k in ("layers", "regions", "overwrite_rate", "flip_away_rate", "logit_diff",
                                         "patch_effect", "pair_ids", "baseline")},
              "overwrite_rate_interval": {"level": 0.95, "method": "wilson over pairs", "low": low.tolist(),
                                          "high": high.tolist()},
              "handover": handover},
    )

    heads = patch_layer_head(model, batch, region="all", options=SweepOptions(progress=progress))
    effect = heads["patch_effect"]  # [L, H]
    n_heads = effect.shape[1]
    ranked = effect.nan_to_num(float("-inf")).flatten().argsort(descending=True).tolist()
    order = [i for i in ranked if bool(effect.flatten()[i].isfinite())][:5]  # NaN: below the noise floor
    top = [(heads.layers[i // n_heads], i % n_heads, float(effect.flatten()[i])) for i in order]
    assert heads.intervals is not None  # the sweeps add them
    e_low, e_high = (bound.flatten() for bound in heads.intervals["patch_effect"])
    top_share = top_head_share(heads, seed=settings.seed).flatten()
    head_rate = heads["overwrite_rate"]
    r_low, r_high = heads.rate_interval("overwrite_rate")
    at_max = int(head_rate.nan_to_num(-1.0).flatten().argmax())
    head_numbers: dict[str, float | str] = {
        "pairs": batch.n_pairs, "max overwrite rate": float(head_rate.flatten()[at_max]),
        "max overwrite rate 95% CI": format_interval(float(head_rate.flatten()[at_max]), float(r_low.flatten()[at_max]),
                                                     float(r_high.flatten()[at_max]))}
    head_numbers.update({f"#{rank + 1} L{layer}H{head}": format_interval(value, float(e_low[i]), float(e_high[i]))
                         for rank, ((layer, head, value), i) in enumerate(zip(top, order, strict=True))})
    if heads.effect_floor is not None and not heads.effect_floor.defined:
        head_numbers["patch effect"] = f"undefined: {heads.effect_floor.describe()}"
    elif top:
        head_numbers["top head stays top (bootstrap share)"] = float(top_share[order[0]])
    head_section = Section(
        key="vap_layer_head", title=HEADS_TITLE, explanation=HEADS_EXPLANATION,
        figure=heads.plot("patch_effect"), numbers=head_numbers,
        data={"layers": heads.layers, "patch_effect": effect, "overwrite_rate": heads["overwrite_rate"],
              "logit_diff": heads["logit_diff"], "top_heads": [list(t) for t in top],
              "patch_effect_interval": {"level": 0.95, "method": "bootstrap over pairs (1000 resamples)",
                                        "low": e_low.reshape(effect.shape).tolist(),
                                        "high": e_high.reshape(effect.shape).tolist()},
              "patch_effect_floor": None if heads.effect_floor is None else heads.effect_floor.to_dict(),
              "top_head_share": top_share.reshape(effect.shape).tolist()},
    )
    return [region_section, head_section]
