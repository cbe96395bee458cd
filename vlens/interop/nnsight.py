"""nnsight over a HookedVLM with several invokes in one trace (clean and corrupt: nnsight's patching pattern).

    from vlens.interop.nnsight import VLMNNsight
    wrapped = VLMNNsight(model)                 # nnsight.NNsight, plus batching of VLMInputs
    with wrapped.trace() as tracer:
        with tracer.invoke(corrupt):
            z = wrapped.blocks[1].attn.hook_z.output.save()
        with tracer.invoke(clean):
            wrapped.blocks[1].attn.hook_z.output[:] = z
            logits = wrapped.output.save()

Plain ``nnsight.NNsight(model)`` runs one invoke per trace (nnsight's base envoy batches nothing); this
subclass joins the invokes' `VLMInputs` into one batch (`concat_inputs`: rows in invoke order, their images'
pixel rows in the same order) and gives each invoke its own part of every activation: rows of the
language side ([batch, ...]), and on the vision side its images ([n_images, ...]), its patches
([n_patches, ...]: Qwen's flattened pixel rows) or its image tokens ([n_image_tokens, ...]: the merger's
output, DeepStack). A tensor whose leading size matches two of these with different splits is refused
(`UserInputError`) rather than guessed. Invokes must have the same sequence length (build them with one
`model.prepare` call and select, or use prompts of equal length); docs/nnsight.md has the examples.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import torch
from torch import Tensor

from vlens.core.inputs import TokenRegions, VLMInputs
from vlens.utils.errors import UserInputError

try:
    from nnsight import NNsight
    from nnsight.intervention.batching import Batcher
except ImportError as error:  # the optional extra
    raise ImportError("vlens.interop.nnsight needs nnsight: pip install 'vlens[nnsight]'") from error


def _cat_optional(parts: list[Tensor | None]) -> Tensor | None:
    present = [part for part in parts if part is not None]
    return torch.cat(present, dim=0) if present else None


def concat_inputs(parts: list[VLMInputs]) -> VLMInputs:
    """One `VLMInputs` holding the rows of `parts` in order (and their images, in the same order).

    All parts must have the same sequence length (no padding is added) and the same set of `extra` keys.
    """
    if not parts:
        raise UserInputError("concat_inputs needs at least one VLMInputs")
    lengths = sorted({part.seq_len for part in parts})
    if len(lengths) > 1:
        raise UserInputError(f"these inputs have different sequence lengths {lengths}: invokes batched into one "
                             "trace must be equally long. Prepare them together (model.prepare(images=[...], "
                             "prompts=[...]) pads them) and pass the batch to one invoke, or use prompts of equal "
                             "length.")
    for name in ("mm_token_type_ids",):
        given = [getattr(part, name) is not None for part in parts]
        if any(given) and not all(given):
            raise UserInputError(f"some inputs carry {name} and others do not: build them with the same model.")
    keys = {tuple(sorted(part.extra)) for part in parts}
    if len(keys) > 1:
        raise UserInputError(f"these inputs carry different extra processor outputs {sorted(keys)}: build them "
                             "with the same model and processor.")
    extra = {key: torch.cat([part.extra[key] for part in parts], dim=0) if isinstance(parts[0].extra[key], Tensor)
             else parts[0].extra[key] for key in parts[0].extra}
    entries = None
    if any(part.pixel_entries is not None for part in parts):
        entries = [n for part in parts for n in (part.pixel_entries or [])]
    regions = None
    if all(part.regions is not None for part in parts):
        regions = _concat_regions([part.token_regions for part in parts], [part.batch_size for part in parts])
    merged: dict[str, Any] = {f.name: getattr(parts[0], f.name) for f in fields(VLMInputs)}
    merged.update(
        input_ids=torch.cat([part.input_ids for part in parts]),
        attention_mask=torch.cat([part.attention_mask for part in parts]),
        pixel_values=_cat_optional([part.pixel_values for part in parts]),
        image_grid_thw=_cat_optional([part.image_grid_thw for part in parts]),
        mm_token_type_ids=_cat_optional([part.mm_token_type_ids for part in parts]),
        regions=regions, extra=extra, pixel_entries=entries,
    )
    return VLMInputs(**merged)


def _concat_regions(parts: list[TokenRegions], rows: list[int]) -> TokenRegions:
    def joined(name: str, empty: Any) -> list:
        lists = [getattr(part, name) for part in parts]
        if not any(lists):
            return []
        return [item for values, n in zip(lists, rows, strict=True) for item in (values or [empty() for _ in range(n)])]

    return TokenRegions(
        image=[p for part in parts for p in part.image], images=[p for part in parts for p in part.images],
        text=[p for part in parts for p in part.text], final=torch.cat([part.final for part in parts]),
        image_grid=[g for part in parts for g in part.image_grid], tiles=joined("tiles", list),
        markers=joined("markers", list), geometry=joined("geometry", list),
    )


def _spans(sizes: list[int]) -> list[tuple[int, int]]:
    out, start = [], 0
    for size in sizes:
        out.append((start, size))
        start += size
    return out


class VLMBatcher(Batcher):
    """nnsight's `Batcher`, narrowing vision-side tensors to an invoke's images, patches or image tokens."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.layouts: dict[int, list[tuple[int, int]]] = {}  # leading size -> each invoke's (start, size)
        self.row_starts: list[int] = []  # each invoke's first row (nnsight names an invoke by its row group)

    def assemble(self, fn: Any) -> Any:
        parts = [inputs[0] for inputs, _ in self.invokes if inputs and isinstance(inputs[0], VLMInputs)]
        if len(parts) == len(self.invokes) > 1:
            self.layouts = {}
            self.row_starts = [start for start, _ in _spans([part.batch_size for part in parts])]
            counts = {
                "rows": [part.batch_size for part in parts],
                "images": [len(part.image_grid_thw) if part.image_grid_thw is not None
                           else (len(part.pixel_values) if part.pixel_values is not None else 0) for part in parts],
                "patches": [part.pixel_values.shape[0] if part.pixel_values is not None else 0 for part in parts],
                "image tokens": [sum(len(p) for p in part.token_regions.image) if part.regions is not None else 0
                                 for part in parts],
            }
            for sizes in counts.values():
                total, spans = sum(sizes), _spans(sizes)
                if total in self.layouts and self.layouts[total] != spans:
                    self.layouts[total] = []  # ambiguous: refused when a tensor of that size is narrowed
                    continue
                self.layouts.setdefault(total, spans)
        return super().assemble(fn)

    def _span(self, tensor: Tensor, group: list) -> tuple[int, int] | None:
        if not self.layouts:  # one invoke, or inputs that are not VLMInputs: nnsight's own rule
            return (group[0], group[1]) if tensor.ndim and tensor.shape[0] == self.total else None
        spans = self.layouts.get(tensor.shape[0]) if tensor.ndim else None
        if spans is None:
            return None
        if not spans:
            raise UserInputError(
                f"a tensor with leading size {tensor.shape[0]} cannot be split between the invokes: that is both the "
                "number of rows and of images, patches or image tokens, split differently. Run these invokes as "
                "separate traces, or give every invoke one image per row.")
        return spans[self.row_starts.index(group[0])]

    def _narrow_tensor(self, tensor: Tensor, group: list) -> Tensor:
        span = self._span(tensor, group)
        if span is None:
            return tensor
        view = tensor.narrow(0, span[0], span[1])
        view._nnsight_batch = True  # type: ignore[attr-defined]  # nnsight's marker of a batch slice
        return view

    def _widen_tensor(self, full: Tensor, group: list, edited: Tensor) -> Tensor:
        span = self._span(full, group)
        if span is None:
            return edited
        start, size = span
        # cat (not in place), as nnsight's own layout does: keeps autograd right when `edited` is a view of `full`
        return torch.cat([full.narrow(0, 0, start), edited, full.narrow(0, start + size, full.shape[0] - start - size)])


class VLMNNsight(NNsight):
    """`nnsight.NNsight` for a HookedVLM whose trace may hold several invokes of `VLMInputs` (module doc)."""

    _batcher_class = VLMBatcher

    def _batch_size(self, *inputs: Any, **kwargs: Any) -> int:
        if inputs and isinstance(inputs[0], VLMInputs):
            return inputs[0].batch_size
        return super()._batch_size(*inputs, **kwargs)

    def _batch(self, invokes: list[tuple], fn: Any) -> tuple:
        if len(invokes) <= 1:
            return super()._batch(invokes, fn)
        parts = [inputs[0] if inputs else None for inputs, _ in invokes]
        if not all(isinstance(part, VLMInputs) for part in parts):
            raise UserInputError("VLMNNsight batches invokes of VLMInputs (model.prepare(...)); pass one to each "
                                 "invoke.")
        if any(kwargs for _, kwargs in invokes):
            raise UserInputError("pass the forward's keywords to trace(...), not to each invoke.")
        return (concat_inputs(parts),), {}  # type: ignore[arg-type]
