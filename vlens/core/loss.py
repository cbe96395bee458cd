"""Next-token loss for ``model(..., return_type="loss" | "both")``.

Two targets, as TransformerLens's ``return_type="loss"`` and HF's ``labels=`` give them:
- no labels: every next text token. A prediction counts when both its position and the next
  are real tokens (attention mask 1) and the next token is not an image/video placeholder
  (image tokens are inputs, never predicted);
- ``labels`` [batch, pos] (HF convention, ``-100`` = ignore): ``labels[:, 1:]`` predicted from
  positions ``:-1``, e.g. only the answer tokens. Padding is ignored as well.
Mean cross-entropy over counted predictions (computed in fp32), or per token.
"""

from __future__ import annotations

import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from vlens.utils.errors import UserInputError

IGNORE_INDEX = -100


def next_token_targets(input_ids: Int[Tensor, "batch pos"], attention_mask: Int[Tensor, "batch pos"],
                       placeholder_ids: tuple[int, ...] = (),
                       labels: Int[Tensor, "batch pos"] | None = None) -> Int[Tensor, "batch pos_minus_1"]:
    """Target token of each position ``:-1`` (``IGNORE_INDEX`` where nothing is predicted)."""
    real = attention_mask.bool()
    if labels is None:
        targets = input_ids[:, 1:].clone()
        for token in placeholder_ids:
            targets[targets == token] = IGNORE_INDEX
    else:
        if labels.shape != input_ids.shape:
            raise UserInputError(f"labels must have the inputs' shape {tuple(input_ids.shape)} (HF convention, "
                                 f"-100 = ignore), got {tuple(labels.shape)}.")
        targets = labels.to(input_ids.device)[:, 1:].clone()
    targets[~(real[:, :-1] & real[:, 1:])] = IGNORE_INDEX
    return targets


def next_token_loss(logits: Float[Tensor, "batch pos d_vocab"], targets: Int[Tensor, "batch pos_minus_1"],
                    per_token: bool = False) -> Float[Tensor, ""] | Float[Tensor, "batch pos_minus_1"]:
    """Cross-entropy of ``logits[:, :-1]`` against `targets`: the mean, or [batch, pos-1] (0 where ignored)."""
    targets = targets.to(logits.device)
    losses = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), targets.flatten(), reduction="none",
                             ignore_index=IGNORE_INDEX).view_as(targets)
    if per_token:
        return losses
    counted = (targets != IGNORE_INDEX).sum()
    if int(counted) == 0:
        raise UserInputError("return_type='loss': no token to predict (every target is padding, an image "
                             "placeholder or -100 in labels).")
    return losses.sum() / counted
