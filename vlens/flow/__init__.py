"""Information flow and object tokens: attention knockout, the knockout sweep over layer windows and
object-token ablation.

    from vlens.flow import knockout
    with knockout(model, src="image", dst="final", layers=range(2, 4), inputs=inputs):
        logits = model(inputs)

    result = knockout_sweep(model, object_task_batch("colour", 64), edges=["image->final"], window=3)
    ablation = ablate_tokens(model, object_task_batch("name", 64), how="mean", at="vision", buffer=1)

Submodules: `positions` (position specs -> bool [batch, pos]), `knockout` (the mask edit), `batch`
(examples with object boxes, object tasks), `sweep` (the window sweep), `ablation` (object tokens vs
random and high-norm tokens).
"""

from vlens.flow.ablation import HOWS, TokenAblation, ablate_tokens, mcnemar_exact
from vlens.flow.batch import FlowBatch, FlowExample, object_selection, object_task_batch
from vlens.flow.knockout import KnockoutEdit, check_layers, knockout, knockout_logits, softmax_layers
from vlens.flow.positions import REGION_NAMES, PositionSpec, position_mask, question_positions
from vlens.flow.sweep import DEFAULT_EDGES, KnockoutSweep, SweepSettings, knockout_sweep, layer_windows

__all__ = [
    "DEFAULT_EDGES",
    "HOWS",
    "REGION_NAMES",
    "FlowBatch",
    "FlowExample",
    "KnockoutSweep",
    "SweepSettings",
    "TokenAblation",
    "ablate_tokens",
    "knockout_sweep",
    "layer_windows",
    "mcnemar_exact",
    "object_selection",
    "object_task_batch",
    "KnockoutEdit",
    "PositionSpec",
    "check_layers",
    "knockout",
    "knockout_logits",
    "position_mask",
    "question_positions",
    "softmax_layers",
]
