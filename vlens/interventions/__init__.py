"""Interventions from the counting-circuit paper (docs/method.md, sections 7 and 8).

from vlens.interventions import focus_prior, run_with_focus, fit_temperature, importance_from_result
prior = focus_prior(inputs, objects)                     # Gaussian prior over the merged grid
logits, l_focus = run_with_focus(model, inputs, prior)   # attention captured at target layers only
temp = fit_temperature(importance_from_result("ablation.json", task="counting"), top_k=8, alpha=1.2)
with temp.applied(model): ...                            # beta_h on hook_attn_scores
handle = temp.export_to_hf(hf_model); ...; handle.remove()
"""

from vlens.interventions.focus import (
    PAPER_FOCUS_LAYERS,
    FocusPrior,
    capture_patterns,
    default_focus_layers,
    focus_loss,
    focus_prior,
    model_focus_layers,
    object_prior,
    objects_from_record,
    pixel_to_grid,
    run_with_focus,
)
from vlens.interventions.temperature import (
    TEMPERATURE_CLASSES,
    HeadTemperature,
    TemperatureComparison,
    TemperatureHandle,
    fit_temperature,
    importance_from_result,
    taxonomy_heads,
)

__all__ = [
    "PAPER_FOCUS_LAYERS",
    "TEMPERATURE_CLASSES",
    "FocusPrior",
    "HeadTemperature",
    "TemperatureComparison",
    "TemperatureHandle",
    "capture_patterns",
    "default_focus_layers",
    "model_focus_layers",
    "fit_temperature",
    "focus_loss",
    "focus_prior",
    "importance_from_result",
    "object_prior",
    "objects_from_record",
    "pixel_to_grid",
    "run_with_focus",
    "taxonomy_heads",
]
