"""Information flow and object tokens: attention knockout, the knockout sweep over layer windows and
object-token ablation.

    from vlens.flow import knockout
    with knockout(model, src="image", dst="final", layers=range(2, 4), inputs=inputs):
        logits = model(inputs)

Submodules: `positions` (position specs -> bool [batch, pos]), `knockout` (the mask edit).
"""

from vlens.flow.knockout import KnockoutEdit, check_layers, knockout, knockout_logits, softmax_layers
from vlens.flow.positions import REGION_NAMES, PositionSpec, position_mask, question_positions

__all__ = [
    "REGION_NAMES",
    "KnockoutEdit",
    "PositionSpec",
    "check_layers",
    "knockout",
    "knockout_logits",
    "position_mask",
    "question_positions",
    "softmax_layers",
]
