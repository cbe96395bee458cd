"""Logit lens: decode each layer's residual stream at the final prompt position.

For every layer l, `ln_final` + unembedding is applied to `blocks.{l}.hook_resid_post` at the
final prompt position (`inputs.regions.final`); the last layer's reading is the model's own
output. For each example it records the correct answer's probability and rank (1 = top) and
the top token per layer.

Answers of several tokens (Qwen writes "12" as "1", "2") follow vlens's answer rule
(`vlens.core.answers`): the answer is teacher-forced after the prompt and each layer's reading
at every answer position is scored. The probability is the whole answer's,
``prod_j p_l(a_j | prompt, a_<j)``; the rank is the worst rank of its tokens (1 = that layer's
greedy readout reproduces the whole answer); the top token is the one read at the final
prompt position. One-token answers score exactly as before.

    result = logit_lens(model, inputs, answer_tokens)      # one batch
    result = logit_lens_records(model, read_imagefolder(DIR))  # a dataset, batched
    result.mean_probability, result.median_rank, result.plot()
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from jaxtyping import Float, Int
from torch import Tensor

from vlens.core.answers import answer_ids, single_token, teacher_force
from vlens.core.runtime import module_device
from vlens.data import record_image
from vlens.lens.base import Lens
from vlens.parallel.options import SweepOptions, fold_legacy
from vlens.utils.errors import UserInputError
from vlens.utils.finite import finite_rows, json_safe, warn_non_finite
from vlens.utils.results import Result, nan_tensor
from vlens.utils.stats import bootstrap_interval
from vlens.viz.figures import logit_lens_figure

if TYPE_CHECKING:
    from vlens.core.inputs import VLMInputs
    from vlens.core.model import HookedVLM


@dataclass
class LogitLensResult(Result):
    """Per layer x example: the answer's probability and rank, and the top token.

    probabilities: [n_layers, n_examples]; ranks: [n_layers, n_examples] (1 = most likely; a
    float tensor so that it can hold NaN); top_tokens: [n_layers, n_examples]; answer_tokens: [n_examples].
    Where a layer's logits are not finite (a NaN activation) the probability and rank are NaN,
    the top token is -1 (None in JSON), and every summary over that layer is NaN.
    """

    probabilities: Float[Tensor, "n_layers n_examples"]
    ranks: Float[Tensor, "n_layers n_examples"]
    top_tokens: Int[Tensor, "n_layers n_examples"]
    answer_tokens: list[list[int]]
    answers: list[str]
    token_strings: dict[int, str]

    kind: ClassVar[str] = "logit_lens"
    saved_dims: ClassVar[dict[str, str]] = {"answer_tokens": "n_examples", "answers": "n_examples"}  # checked when a file is read

    @property
    def n_layers(self) -> int:
        return self.probabilities.shape[0]

    @property
    def mean_probability(self) -> Float[Tensor, "n_layers"]:
        return self.probabilities.double().contiguous().mean(1)  # one dtype and order (so a loaded result agrees)

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
            raise UserInputError("no logit-lens results to concatenate: pass at least one LogitLensResult")
        return LogitLensResult(
            probabilities=torch.cat([r.probabilities for r in results], 1),
            ranks=torch.cat([r.ranks for r in results], 1),
            top_tokens=torch.cat([r.top_tokens for r in results], 1),
            answer_tokens=[a for r in results for a in r.answer_tokens],
            answers=[a for r in results for a in r.answers],
            token_strings={k: v for r in results for k, v in r.token_strings.items()},
        )

    def to_dict(self) -> dict:
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
            "answer_rule": "vlens.core.answers: whole answer teacher-forced; probability = product over its tokens, "
                           "rank = worst rank of its tokens",
            "answer_tokens": [list(a) for a in self.answer_tokens],
            "probabilities": self.probabilities.tolist(),
            "ranks": self.ranks.tolist(),
            "top_tokens": [[None if int(t) < 0 else self.token_strings.get(int(t), str(int(t))) for t in row]
                           for row in self.top_tokens],
            "top_token_ids": self.top_tokens.tolist(),
            "non_finite": int(self.non_finite.sum()),
        })

    @classmethod
    def from_dict(cls, data: dict) -> LogitLensResult:
        ids = torch.tensor(data["top_token_ids"], dtype=torch.long)
        strings = {int(i): s for row_ids, row in zip(data["top_token_ids"], data["top_tokens"], strict=True)
                   for i, s in zip(row_ids, row, strict=True) if s is not None and s != str(i)}
        return cls(probabilities=nan_tensor(data["probabilities"], torch.float64),
                   ranks=nan_tensor(data["ranks"], torch.float64), top_tokens=ids,
                   answer_tokens=[list(a) for a in data["answer_tokens"]], answers=list(data["answers"]),
                   token_strings=strings)

    def probability_interval(self, level: float = 0.95, seed: int = 0) -> tuple[Tensor, Tensor]:
        """Bootstrap interval over examples of the mean probability per layer: ([n_layers], [n_layers])."""
        return bootstrap_interval(self.probabilities.T, level=level, seed=seed)

    def rank_quartiles(self) -> tuple[Tensor, Tensor]:
        """25th and 75th percentile of the answer's rank per layer (the spread around the median)."""
        ranks = self.ranks.double()
        return ranks.nanquantile(0.25, dim=1), ranks.nanquantile(0.75, dim=1)

    def plot(self, title: str = "Logit lens at the final prompt position"):
        """Mean probability (top, 95% bootstrap interval over examples) and median rank (bottom,
        bars from the 25th to the 75th percentile) of the correct answer per layer."""
        p_low, p_high = self.probability_interval()
        r_low, r_high = self.rank_quartiles()
        return logit_lens_figure(
            probabilities={"correct answer (mean p)": self.mean_probability.tolist()},
            ranks={"correct answer (median rank)": self.median_rank.tolist()},
            probability_interval=(p_low.tolist(), p_high.tolist()),
            rank_interval=(r_low.tolist(), r_high.tolist()),
            title=title,
        )


class LogitLens(Lens):
    """The logit lens: the model's own final norm and unembedding applied to any layer's residual.

    `transform` is the identity; `forward(resid, layer)` is ``model.finish(resid)``.
    """

    model: HookedVLM  # set in __init__ outside nn.Module's registry

    def __init__(self, model: HookedVLM):
        super().__init__()
        self.__dict__["model"] = model  # not a submodule: its parameters stay the model's

    def transform(self, resid: Float[Tensor, "... d_model"], layer: int) -> Float[Tensor, "... d_model"]:
        return resid

    def forward(self, resid: Float[Tensor, "... d_model"], layer: int) -> Float[Tensor, "... d_vocab"]:
        return self.model.finish(resid)

    def forward_layers(self, resid: Float[Tensor, "n_layers ... d_model"]) -> Float[Tensor, "n_layers ... d_vocab"]:
        return self.model.finish(resid)  # every layer in one call: the read-out does not depend on the layer


def logit_lens(model: HookedVLM, inputs: VLMInputs, answer_tokens: Int[Tensor, "batch"] | Sequence[Sequence[int]],
               answers: Sequence[str] | None = None, first_example: int = 0,
               lens: Lens | None = None, options: SweepOptions | None = None) -> LogitLensResult:
    """Logit lens of one batch at each row's final position (and, for multi-token answers, at the
    teacher-forced answer positions that follow it).

    Args:
        model: the model.
        inputs: one batch (`model.prepare(...)`).
        answer_tokens: [batch] one token per row, or per row the answer's token ids
            (`vlens.core.answers.answer_ids`).
        answers: the answers as text (default: their tokens decoded).
        first_example: index of the batch's first row in a larger dataset (for warnings only).
        lens: how each layer's residual is read (default `LogitLens(model)`); e.g. a
            `vlens.lens.translators.TunedLens` gives the tuned lens with the same scoring.
        options: `cache_device` (where the residuals at the answer positions are kept before
            they are read); the readout must be "final" (`vlens.SweepOptions`).
    Returns:
        a `LogitLensResult`: probabilities, ranks, top_tokens [n_layers, batch].
    """
    options = SweepOptions() if options is None else options
    options.require_final("the logit lens")
    lens = LogitLens(model) if lens is None else lens
    n_layers = model.cfg.n_layers
    names = [f"blocks.{layer}.hook_resid_post" for layer in range(n_layers)]
    inputs = model.coerce_inputs(inputs)
    if not isinstance(answer_tokens, Tensor) and not all(
            isinstance(a, (list, tuple)) and all(isinstance(t, int) for t in a) for a in answer_tokens):
        raise UserInputError("answer_tokens must be a [batch] tensor of token ids or, per row, a list of the answer's "
                             "token ids (vlens.core.answers.answer_ids), e.g. [[5], [7]]; got "
                             f"{str(answer_tokens)[:60]}")
    answer_ids = ([[int(t)] for t in answer_tokens.tolist()] if isinstance(answer_tokens, Tensor)
                  else [[int(t) for t in a] for a in answer_tokens])
    if len(answer_ids) != inputs.batch_size:
        raise UserInputError(f"got {len(answer_ids)} answers for a batch of {inputs.batch_size}")
    if any(not a for a in answer_ids):
        raise UserInputError("an answer has no tokens")
    forced = teacher_force(model, inputs, answer_ids)
    # row r's answer token j is predicted at position final - (n_r - 1) + j
    rows = torch.tensor([r for r, a in enumerate(answer_ids) for _ in a])
    final = forced.token_regions.final.cpu()
    positions = torch.tensor([int(final[r]) - len(a) + 1 + j for r, a in enumerate(answer_ids) for j in range(len(a))])
    targets = torch.tensor([t for a in answer_ids for t in a])
    first = torch.tensor([sum(len(a) for a in answer_ids[:r]) for r in range(len(answer_ids))])
    picked: dict[str, Tensor] = {}

    def keep(resid: Tensor, hook) -> None:  # only the answer positions: memory stays O(layers x answers)
        picked[hook.name] = options.keep(resid[rows.to(resid.device), positions.to(resid.device)].detach())

    with torch.no_grad():
        with model.hooks(fwd_hooks=[(n, keep) for n in names]):
            model(forced, return_type=None)  # no unembedding of every position
        stack = torch.stack([picked[n].to(module_device(model.unembed.lm_head)) for n in names])  # not meta if offloaded
        logits = lens.forward_layers(stack).float()  # [L, n_answer_tokens, d_vocab]
        target = targets.to(logits.device)[None, :, None].expand(n_layers, -1, 1)
        token_ranks = ((logits > logits.gather(-1, target)).sum(-1) + 1).double().cpu()
        token_logprobs = logits.log_softmax(-1).gather(-1, target)[..., 0].double().cpu()
        top = logits.argmax(-1).cpu()[:, first]  # read at the final prompt position
        ok_tokens = finite_rows(logits).cpu()  # [L, n_answer_tokens]
    owner = rows  # answer token -> row
    batch = len(answer_ids)
    probabilities = torch.zeros(n_layers, batch, dtype=torch.double).index_add_(1, owner, token_logprobs).exp()
    ranks = torch.full((n_layers, batch), float("-inf"), dtype=torch.double).scatter_reduce(
        1, owner[None].expand(n_layers, -1), token_ranks, reduce="amax")
    ok = torch.ones(n_layers, batch, dtype=torch.bool).scatter_reduce(
        1, owner[None].expand(n_layers, -1), ok_tokens, reduce="amin")
    if not bool(ok.all()):
        ranks, probabilities = ranks.masked_fill(~ok, torch.nan), probabilities.masked_fill(~ok, torch.nan)
        top = top.masked_fill(~ok, -1)
        bad = (~ok).nonzero().tolist()
        warn_non_finite("logit lens", "(layer, example) " + ", ".join(f"({a}, {b + first_example})" for a, b in bad[:6])
                        + (f" (+{len(bad) - 6} more)" if len(bad) > 6 else ""), model, forced)
    ids = sorted(set(top.flatten().tolist()) - {-1} | set(targets.tolist()))
    strings = dict(zip(ids, model.to_str_tokens(ids), strict=True)) if model.processor is not None else {}
    return LogitLensResult(
        probabilities=probabilities.float(), ranks=ranks, top_tokens=top, answer_tokens=answer_ids,
        answers=list(answers) if answers is not None
        else ["".join(strings.get(t, str(t)) for t in a) for a in answer_ids],
        token_strings=strings,
    )


def first_answer_token(model: HookedVLM, answer: str) -> int:
    """The answer's token when it is a single token; otherwise a clear error naming its tokens
    (multi-token answers: pass `vlens.core.answers.answer_ids(model, answer)` to `logit_lens`)."""
    return single_token(model, str(answer), "first_answer_token (one-token logit lens)")


def logit_lens_records(model: HookedVLM, records: Sequence[dict], chat: bool = True,
                       options: SweepOptions | None = None, **legacy: Any) -> LogitLensResult:
    """Logit lens over imagefolder records (`question`, `answer`, `image_path` or `image`).

    Args:
        model: the model.
        records: any sequence (e.g. `vlens.parallel.LazyItems`: only the batches a process runs are built).
        chat: format each question with the model's chat template.
        options: `batch_size` (records per forward, default 8), `progress`, `sharding` (the
            batches split across processes; every process gets the full result), `cache_device`.
    Returns:
        a `LogitLensResult` over all records: probabilities, ranks, top_tokens [n_layers, n_records].
    """
    options = fold_legacy(options, legacy, "logit_lens_records", ("batch_size", "progress", "sharding"))
    options.require_final("the logit lens")
    if not records:
        raise UserInputError("no records given to the logit lens")
    batch_size = options.batch(8)
    sharding = options.shards

    def check(chunk: Sequence[dict], first: int) -> None:
        for index, record in enumerate(chunk, first):
            if "question" not in record or "answer" not in record:
                raise UserInputError(f"record {index} has no 'question' / 'answer' column: the logit lens needs both")

    if isinstance(records, list):  # fail before any forward; generated records are checked as built
        check(records, 0)

    def run(start: int) -> dict:
        chunk = records[start:start + batch_size]
        check(chunk, start)
        images = [record_image(r) if ("image_path" in r or "image" in r) else None for r in chunk]
        inputs = model.prepare(images=images, prompts=[r["question"] for r in chunk], chat=chat)
        tokens = [answer_ids(model, str(r["answer"]), example=str(r.get("file_name", index)), chat=chat)
                  for index, r in enumerate(chunk, start)]
        return vars(logit_lens(model, inputs, tokens, answers=[str(r["answer"]) for r in chunk],
                               first_example=start, options=options))

    parts = sharding.map(range(0, len(records), batch_size), run, desc="logit lens", progress=options.progress)
    return LogitLensResult.concat([LogitLensResult(**part) for part in parts])
