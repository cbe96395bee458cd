"""Which token positions an edge connects: named regions, position lists, masks -> bool [batch, pos].

A position spec (`PositionSpec`) is any of:

- a region name: "image", "text", "final", "all" (`TokenRegions.region`), "question" (the text
  tokens after the row's last image token, the final position excluded: the question of a
  one-image chat prompt), "prompt" (every real token but the final one);
- a bool tensor [batch, pos] (True: selected) or [pos] (the same positions in every row);
- a LongTensor [n] of positions (the same in every row) or a list of ints;
- a sequence with one entry per batch row, each a LongTensor / list of positions or an object with
  a `positions` attribute (a token selection such as `inputs.regions.from_box(...)` returns).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Bool
from torch import Tensor

from vlens.core.inputs import VLMInputs
from vlens.utils.errors import UserInputError

PositionSpec = str | Tensor | Sequence[Any]
REGION_NAMES = ("image", "text", "final", "all", "question", "prompt")


def question_positions(inputs: VLMInputs, row: int) -> Tensor:
    """Text positions after the row's last image token, the final position excluded: LongTensor [n]."""
    regions = inputs.token_regions
    text, image = regions.text[row].cpu(), regions.image[row].cpu()
    final = int(regions.final[row])
    after = text[text > int(image.max())] if len(image) else text
    return after[after != final]


def _row_positions(item: Any, row: int, seq_len: int) -> Tensor:
    if hasattr(item, "positions"):
        item = item.positions
    positions = torch.as_tensor(item, dtype=torch.long).reshape(-1).cpu() if not isinstance(item, Tensor) \
        else item.reshape(-1).cpu()
    if positions.dtype == torch.bool:
        if positions.numel() != seq_len:
            raise UserInputError(f"row {row}: a bool position mask needs {seq_len} entries, got {positions.numel()}")
        return positions.nonzero().flatten()
    if positions.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
        raise UserInputError(f"row {row}: positions must be integers, got dtype {positions.dtype}")
    positions = positions.long()
    bad = positions[(positions < 0) | (positions >= seq_len)]
    if len(bad):
        raise UserInputError(f"row {row}: positions {bad.tolist()[:5]} lie outside the sequence (length {seq_len}); "
                             "give positions in [0, seq_len)")
    return positions


def position_mask(spec: PositionSpec, inputs: VLMInputs, what: str = "positions") -> Bool[Tensor, "batch pos"]:
    """The positions `spec` selects in every row of `inputs`, as bool [batch, pos] on the CPU.

    what: the argument's name, for error messages (e.g. "src"). Padding positions are never selected.
    """
    batch, seq_len = inputs.batch_size, inputs.seq_len
    real = inputs.attention_mask.bool().cpu()
    if isinstance(spec, str):
        if spec not in REGION_NAMES:
            raise UserInputError(f"{what}: unknown region {spec!r}; use one of {', '.join(REGION_NAMES)}, a position "
                                 "tensor, a bool mask [batch, pos] or one position list per row")
        out = torch.zeros(batch, seq_len, dtype=torch.bool)
        regions = inputs.token_regions
        for row in range(batch):
            if spec == "question":
                out[row, question_positions(inputs, row)] = True
            elif spec == "prompt":
                out[row] = real[row]
                out[row, int(regions.final[row])] = False
            else:
                out[row, regions.region(spec, row).cpu()] = True
    elif isinstance(spec, Tensor) and spec.dtype == torch.bool:
        mask = spec.cpu()
        if mask.shape == (seq_len,):
            mask = mask.expand(batch, seq_len)
        if mask.shape != (batch, seq_len):
            raise UserInputError(f"{what}: a bool mask must be [batch={batch}, pos={seq_len}] or [pos], "
                                 f"got {tuple(mask.shape)}")
        out = mask.clone()
    elif isinstance(spec, Tensor) or (isinstance(spec, Sequence) and all(isinstance(x, int) for x in spec)):
        positions = _row_positions(spec, 0, seq_len)
        out = torch.zeros(batch, seq_len, dtype=torch.bool)
        out[:, positions] = True
    elif isinstance(spec, Sequence):
        if len(spec) != batch:
            raise UserInputError(f"{what}: got {len(spec)} per-row position lists for a batch of {batch}; give one "
                                 "per row (or one tensor of positions for every row)")
        out = torch.zeros(batch, seq_len, dtype=torch.bool)
        for row, item in enumerate(spec):
            out[row, _row_positions(item, row, seq_len)] = True
    else:
        raise UserInputError(f"{what}: cannot read positions from a {type(spec).__name__}; use a region name, a "
                             "position tensor, a bool mask [batch, pos] or one position list per row")
    return out & real
