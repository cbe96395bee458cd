"""Visual activation patching (exact sweeps, fast path), attribution patching (AtP / AtP*).

    from vlens.patching import build_pair_batch, make_count_pairs, patch_layer_region
    batch = build_pair_batch(model, make_count_pairs(16))
    result = patch_layer_region(model, batch)        # result["overwrite_rate"]: [n_layers, 4]
    result.plot().show(); result.save("out/")

Submodules: `pairs` (pair batches + validation), `conditions` (what one patch does),
`metrics`, `runner` (the naive loop and the dispatcher), `fast` (the fast exact path),
`sweeps`, `results`, `attribution`, `cli`.
"""

from vlens.patching.attribution import AttributionResult, attribution_patching, spearman
from vlens.patching.conditions import PatchSpec
from vlens.patching.fast import repeat_run_state, run_fast
from vlens.patching.metrics import METRICS, Baseline, logit_diff, patch_metrics
from vlens.patching.pairs import (
    PairBatch,
    PairExample,
    build_pair_batch,
    examples_from_pairs,
    examples_from_records,
    load_pair_examples,
    make_count_pairs,
    make_video_count_pairs,
)
from vlens.patching.results import PatchingResult
from vlens.patching.runner import run_naive, run_specs
from vlens.patching.sweeps import (
    REGIONS,
    patch_layer_frame,
    patch_layer_head,
    patch_layer_position,
    patch_layer_region,
    patch_layer_region_components,
)

__all__ = [
    "METRICS",
    "REGIONS",
    "AttributionResult",
    "Baseline",
    "PairBatch",
    "PairExample",
    "PatchSpec",
    "PatchingResult",
    "attribution_patching",
    "build_pair_batch",
    "examples_from_pairs",
    "examples_from_records",
    "load_pair_examples",
    "logit_diff",
    "make_count_pairs",
    "make_video_count_pairs",
    "patch_layer_frame",
    "patch_layer_head",
    "patch_layer_position",
    "patch_layer_region",
    "patch_layer_region_components",
    "patch_metrics",
    "repeat_run_state",
    "run_fast",
    "run_naive",
    "run_specs",
    "spearman",
]
