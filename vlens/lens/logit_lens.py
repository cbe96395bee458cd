"""Logit lens: decode each layer's residual stream at the final prompt position.

For every layer l, `ln_final` + unembedding is applied to `blocks.{l}.hook_resid_post` at the
final prompt position (`inputs.regions.final`); the last layer's reading is the model's own
output. For each example it records the correct answer's probability and rank (1 = top) and
the top token per layer.

    result = logit_lens(model, inputs, answer_tokens)      # one batch
    result = logit_lens_records(model, read_imagefolder(DIR))  # a dataset, batched
    result.mean_probability, result.median_rank, result.plot()
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float, Int
from torch import Tensor

from vlens.finite import finite_rows, json_safe, warn_non_finite
from vlens.parallel import Sharding

if TYPE_CHECKING:
    from vlens.inputs import VLMInputs
    from vlens.model import HookedVLM


@dataclass
class LogitLensResult:
    """Per layer x example: the answer's probability and rank, and the top token.

    probabilities: [n_layers, n_examples]; ranks: [n_layers, n_examples] (1 = most likely; a
    float tensor so that it can hold NaN); top_tokens: [n_layers, n_examples]; answer_tokens: [n_examples].
    Where a layer's logits are not finite (a NaN activation) the probability and rank are NaN,
    the top token is -1 (None in JSON), and every summary over that layer is NaN.
    """

    probabilities: Float[Tensor, "n_layers n_examples"]
    ranks: Float[Tensor, "n_layers n_examples"]
    top_tokens: Int[Tensor, "n_layers n_examples"]
    answer_tokens: Int[Tensor, "n_examples"]
    answers: list[str]
    token_strings: dict[int, str]

    @property
    def n_layers(self) -> int:
        return self.probabilities.shape[0]

    @property
    def mean_probability(self) -> Float[Tensor, "n_layers"]:
        return self.probabilities.mean(1)

    @property
    def median_rank(self) -> Float[Tensor, "n_layers"]:
        return self.ranks.double().median(1).values

    @property
    def mean_rank(self) -> Float[Tensor, "n_layers"]:
        return self.ranks.double().mean(1)

    @property
    def top1_accuracy(self) -> Float[Tensor, "n_layers"]:
        """Share of examples whose top token at that layer is the answer (NaN if a rank is NaN)."""
        hits = (self.ranks == 1).double()
        return torch.where(self.ranks.isnan(), torch.nan, hits).mean(1)

    @property
    def non_finite(self) -> Tensor:
        """bool [n_layers, n_examples]: the layer's logits were not finite for that example."""
        return self.ranks.isnan()

    @staticmethod
    def concat(results: Sequence[LogitLensResult]) -> LogitLensResult:
        if not results:
            raise ValueError("no logit-lens results to concatenate")
        return LogitLensResult(
            probabilities=torch.cat([r.probabilities for r in results], 1),
            ranks=torch.cat([r.ranks for r in results], 1),
            top_tokens=torch.cat([r.top_tokens for r in results], 1),
            answer_tokens=torch.cat([r.answer_tokens for r in results]),
            answers=[a for r in results for a in r.answers],
            token_strings={k: v for r in results for k, v in r.token_strings.items()},
        )

    def to_json(self) -> dict:
        """JSON-ready dict; NaN (non-finite logits) is written as None."""
        return json_safe({
            "n_examples": len(self.answers),
            "layers": list(range(self.n_layers)),
            "position": "final prompt position (inputs.regions.final)",
            "mean_probability": self.mean_probability.tolist(),
            "median_rank": self.median_rank.tolist(),
            "mean_rank": self.mean_rank.tolist(),
            "top1_accuracy": self.top1_accuracy.tolist(),
            "answers": list(self.answers),
            "answer_tokens": self.answer_tokens.tolist(),
            "probabilities": self.probabilities.tolist(),
            "ranks": self.ranks.tolist(),
            "top_tokens": [[None if int(t) < 0 else self.token_strings.get(int(t), str(int(t))) for t in row]
                           for row in self.top_tokens],
            "non_finite": int(self.non_finite.sum()),
        })

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1, allow_nan=False))
        return path

    def plot(self, title: str = "Logit lens at the final prompt position"):
        """Mean probability (top) and median rank (bottom) of the correct answer per layer."""
        from vlens.viz.figures import logit_lens_figure

        return logit_lens_figure(
            probabilities={"correct answer (mean p)": self.mean_probability.tolist()},
            ranks={"correct answer (median rank)": self.median_rank.tolist()},
            title=title,
        )


def logit_lens(model: HookedVLM, inputs: VLMInputs, answer_tokens: Int[Tensor, "batch"],
               answers: Sequence[str] | None = None, first_example: int = 0) -> LogitLensResult:
    """Logit lens of one batch at each row's final position.

    first_example: index of the batch's first row in a larger dataset (for warnings only).
    """
    n_layers = model.cfg.n_layers
    names = [f"blocks.{layer}.hook_resid_post" for layer in range(n_layers)]
    inputs = model.coerce_inputs(inputs)
    if answer_tokens.shape[0] != inputs.batch_size:
        raise ValueError(f"got {answer_tokens.shape[0]} answer tokens for a batch of {inputs.batch_size}")
    with torch.no_grad():
        _, cache = model.run_with_cache(inputs, names_filter=lambda n: n in set(names))
        rows = torch.arange(inputs.batch_size)
        final = inputs.regions.final
        stack = torch.stack([cache[n][rows, final.to(cache[n].device)] for n in names])  # [L, b, d]
        logits = model.finish(stack).float()  # [L, b, d_vocab]
        log_probs = logits.log_softmax(-1)
        answer = answer_tokens.to(logits.device)
        answer_logit = logits.gather(-1, answer[None, :, None].expand(n_layers, -1, 1))
        ranks = ((logits > answer_logit).sum(-1) + 1).double()
        probabilities = log_probs.gather(-1, answer[None, :, None].expand(n_layers, -1, 1))[..., 0].exp()
        top = logits.argmax(-1)
        ok = finite_rows(logits)  # [L, b]
        if not bool(ok.all()):
            ranks, probabilities = ranks.masked_fill(~ok, torch.nan), probabilities.masked_fill(~ok, torch.nan)
            top = top.masked_fill(~ok, -1)
            bad = (~ok).nonzero().tolist()
            warn_non_finite("logit lens", "(layer, example) " + ", ".join(f"({a}, {b + first_example})" for a, b in bad[:6])
                            + (f" (+{len(bad) - 6} more)" if len(bad) > 6 else ""), model, inputs)
    ids = sorted(set(top.flatten().tolist()) - {-1} | set(answer_tokens.tolist()))
    strings = dict(zip(ids, model.to_str_tokens(ids), strict=True)) if model.processor is not None else {}
    return LogitLensResult(
        probabilities=probabilities.cpu(), ranks=ranks.cpu(), top_tokens=top.cpu(), answer_tokens=answer_tokens.cpu(),
        answers=list(answers) if answers is not None else [strings.get(int(t), str(int(t))) for t in answer_tokens],
        token_strings=strings,
    )


def first_answer_token(model: HookedVLM, answer: str) -> int:
    """The first token of an answer text (what the model must produce at the final position)."""
    ids = model.tokenizer(str(answer), add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError(f"answer {answer!r} tokenises to nothing")
    return int(ids[0])


def logit_lens_records(model: HookedVLM, records: Sequence[dict], batch_size: int = 8, chat: bool = True,
                       progress: bool = False, sharding: Sharding | None = None) -> LogitLensResult:
    """Logit lens over imagefolder records (`question`, `answer`, `image_path` or `image`).

    records: any sequence (e.g. `vlens.parallel.LazyItems`: only the batches a process runs are built).
    sharding: split the batches across processes (`vlens.parallel`); every process gets the full result.
    """
    from vlens.patching.pairs import _record_image

    if not records:
        raise ValueError("no records given to the logit lens")
    sharding = sharding or Sharding()

    def check(chunk: Sequence[dict], first: int) -> None:
        for index, record in enumerate(chunk, first):
            if "question" not in record or "answer" not in record:
                raise ValueError(f"record {index} has no 'question' / 'answer' column: the logit lens needs both")

    if isinstance(records, list):  # fail before any forward; generated records are checked as built
        check(records, 0)

    def run(start: int) -> dict:
        chunk = records[start:start + batch_size]
        check(chunk, start)
        images = [_record_image(r) if ("image_path" in r or "image" in r) else None for r in chunk]
        inputs = model.prepare(images=images, prompts=[r["question"] for r in chunk], chat=chat)
        tokens = torch.tensor([first_answer_token(model, r["answer"]) for r in chunk], dtype=torch.long)
        return vars(logit_lens(model, inputs, tokens, answers=[str(r["answer"]) for r in chunk],
                               first_example=start))

    parts = sharding.map(range(0, len(records), batch_size), run, desc="logit lens", progress=progress)
    return LogitLensResult.concat([LogitLensResult(**part) for part in parts])
