"""What splicing an SAE costs the model: answer loss recovered and answer accuracy, per region.

For each region (image / text / all positions) the answer's teacher-forced loss
``L = -sum_j log p(a_j | prompt, a_<j)`` (`vlens.core.answers`) is measured three ways: the clean
model, the SAE's reconstruction spliced at the region, and the activation zeroed there. Loss
recovered is SAELens's ``(L_zero - L_sae) / (L_zero - L_clean)`` (1: the SAE loses nothing, 0: as
bad as removing the activation). Accuracy: every answer token is the argmax (for a count, the
model's answer is right).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypedDict, cast

import torch
from jaxtyping import Float
from torch import Tensor

from vlens.core.answers import answer_ids, answer_logprobs, teacher_force
from vlens.core.model import HookedVLM
from vlens.datasets import Record
from vlens.sae.activations import as_prompt
from vlens.sae.base import SAE
from vlens.utils.errors import UserInputError
from vlens.utils.noise_floor import FloorRecord, floored_ratio, gap_floor
from vlens.utils.results import Result
from vlens.utils.validation import check_count


class ZeroAblation:
    """A dictionary whose reconstruction is 0: splicing it zeroes the activation at the positions."""

    def __init__(self, d_in: int):
        self.d_in = d_in

    def encode(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... 1"]:
        return torch.zeros(*x.shape[:-1], 1, dtype=x.dtype, device=x.device)

    def decode(self, acts: Float[Tensor, "... 1"]) -> Float[Tensor, "... d_in"]:
        return torch.zeros(*acts.shape[:-1], self.d_in, dtype=acts.dtype, device=acts.device)


def example_answer(example: Any, index: int) -> str:
    if isinstance(example, Record):
        return example.answer
    if isinstance(example, dict) and "answer" in example:
        return str(example["answer"])
    raise UserInputError(f"example {index} has no answer: evaluation needs Records or dicts with 'answer'.")


class _SpliceKeys(TypedDict):
    positions: str
    n: int
    loss_clean: float
    loss_sae: float
    loss_zero: float
    loss_recovered: float | None  # (null: the denominator is within its noise floor)
    accuracy_clean: float
    accuracy_sae: float
    accuracy_zero: float


class SpliceRow(_SpliceKeys, total=False):
    """One position set's figures as results.json records them (checked when a file is read)."""

    loss_gap_floor: FloorRecord  # (files before the noise floor lack it)


@dataclass
class SpliceEvaluation(Result):
    """Per region: n, answer loss (clean / sae / zero), loss recovered, accuracy (clean / sae / zero)."""

    hook_name: str
    rows: list[SpliceRow] = field(default_factory=list)

    kind: ClassVar[str] = "sae_splice_evaluation"

    def to_dict(self) -> dict:
        return {"kind": "sae_splice_evaluation", "hook_name": self.hook_name, "rows": self.rows}

    @classmethod
    def from_dict(cls, data: dict) -> SpliceEvaluation:
        return cls(hook_name=data["hook_name"], rows=[cast(SpliceRow, dict(row)) for row in data.get("rows", [])])

    def plot(self, *args: Any, **kwargs: Any) -> Any:
        import plotly.graph_objects as go

        regions = [row["positions"] for row in self.rows]
        figure = go.Figure([go.Bar(x=regions, y=[row["loss_recovered"] for row in self.rows], name="loss recovered"),
                            go.Bar(x=regions, y=[row["accuracy_sae"] for row in self.rows], name="accuracy (SAE)")])
        return figure.update_layout(title=f"SAE spliced at {self.hook_name}", barmode="group")


def _scores(model: HookedVLM, batch: list[Any], start: int, chat: bool, saes: dict | None, positions: str
            ) -> tuple[Tensor, Tensor]:
    prompts = [as_prompt(example, start + i) for i, example in enumerate(batch)]
    answers = [answer_ids(model, example_answer(example, start + i), example=str(start + i), chat=chat)
               for i, example in enumerate(batch)]
    images = [p.images for p in prompts]
    inputs = model.prepare(images=images if any(images) else None, prompts=[p.text for p in prompts], chat=chat)
    forced = teacher_force(model, inputs, answers)
    with torch.no_grad():
        logits = model(forced) if saes is None else model.run_with_saes(forced, saes=saes, positions=positions)
    return answer_logprobs(logits, answers)


def evaluate_splice(model: HookedVLM, examples: Sequence[Any], sae: SAE, hook_name: str | None = None,
                    positions: Sequence[str] = ("image", "text", "all"), batch_size: int = 8,
                    chat: bool = True) -> SpliceEvaluation:
    """Answer loss and accuracy with `sae` spliced at each of `positions` (see the module doc).

    examples: Records or dicts with "image", "question", "answer" (vlens.data samples).
    """
    hook = hook_name or sae.cfg.hook_name
    if hook is None:
        raise UserInputError("the SAE names no hook (cfg.hook_name): pass hook_name.")
    check_count(batch_size, "batch_size")
    examples = list(examples)
    if not examples:
        raise UserInputError("evaluate_splice needs at least one example.")
    zero = ZeroAblation(sae.cfg.d_in)
    clean_lp, clean_ok = [], []
    per: dict[str, dict[str, list[Tensor]]] = {p: {"sae": [], "sae_ok": [], "zero": [], "zero_ok": []} for p in positions}
    for start in range(0, len(examples), batch_size):
        batch = examples[start:start + batch_size]
        lp, ok = _scores(model, batch, start, chat, None, "all")
        clean_lp.append(lp)
        clean_ok.append(ok)
        for region in positions:
            lp, ok = _scores(model, batch, start, chat, {hook: sae}, region)
            per[region]["sae"].append(lp)
            per[region]["sae_ok"].append(ok)
            lp, ok = _scores(model, batch, start, chat, {hook: zero}, region)
            per[region]["zero"].append(lp)
            per[region]["zero_ok"].append(ok)
    clean_loss = -torch.cat(clean_lp).double()
    loss_clean = float(clean_loss.mean())
    accuracy_clean = float(torch.cat(clean_ok).float().mean())
    rows: list[SpliceRow] = []
    for region in positions:
        sae_loss, zero_loss = -torch.cat(per[region]["sae"]).double(), -torch.cat(per[region]["zero"]).double()
        loss_sae, loss_zero = float(sae_loss.mean()), float(zero_loss.mean())
        # the denominator loss_zero - loss_clean must clear its noise floor, as the patch effect's does
        floor = gap_floor(zero_loss - clean_loss, magnitude=loss_clean)
        recovered = floored_ratio(loss_zero - loss_sae, floor, "mean zero-ablation minus clean loss",
                                  f"the SAE's loss recovered at {region} positions")
        rows.append({"positions": region, "n": len(examples), "loss_clean": loss_clean, "loss_sae": loss_sae,
                     "loss_zero": loss_zero, "loss_recovered": recovered if math.isfinite(recovered) else None,
                     "loss_gap_floor": floor.to_dict(),
                     "accuracy_clean": accuracy_clean,
                     "accuracy_sae": float(torch.cat(per[region]["sae_ok"]).float().mean()),
                     "accuracy_zero": float(torch.cat(per[region]["zero_ok"]).float().mean())})
    return SpliceEvaluation(hook, rows)
