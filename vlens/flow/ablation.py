"""Object-token ablation (Neo et al., ICLR 2025): remove an object's image tokens and see whether the
model can still answer about it, against as many random image tokens and as many high-norm tokens.

    result = ablate_tokens(model, batch, how="mean", at="vision", buffer=1)
    result.accuracy     # per condition: "clean", "object", "random", "register"
    result.tests        # exact McNemar tests: object vs random, object vs register

Where: `at="vision"` edits the vision output (`vision.hook_image_embeds`, the features the decoder
reads at the image placeholders); `at=l` edits the residual stream entering decoder layer l
(`blocks.{l}.hook_resid_pre`) at the chosen image positions. Qwen3-VL's DeepStack features are added to
the image positions at later layers through their own hook (`blocks.{l}.hook_deepstack`) and are not
ablated by `at="vision"`: ablate at a decoder layer after the last DeepStack layer to remove them too.

Which tokens, per example:
- "object": the tokens of the object's box on every view of the image (`inputs.regions.from_box`) plus
  Neo et al.'s buffer of `buffer` cells (`TokenSelection.buffer`: every token within `buffer` cells);
- "random": as many image tokens drawn uniformly (seeded) from the image tokens outside the object set;
- "register": as many of the highest-norm image tokens outside the object set, the norm being the L2
  norm of the clean activation at the ablation site. High-norm "register" tokens (Darcet et al. 2024;
  Neo et al.) are the outliers of that norm: `n_outliers` counts, per example, the image tokens whose
  norm exceeds the median by more than 3 median absolute deviations, so a reader can see whether the
  chosen tokens are outliers at all.

How: "zero" (the activation set to 0); "mean" (the mean of the clean activations at that site over
every image token of every example in the batch); "resample" (the clean activation of the same image
cell, by index into the image's tokens, of another example: example i takes example (i + 1) mod n's).

Scored: the answer's first token is the argmax at the final position (accuracy, 95% Wilson
intervals) and its probability; the object condition is compared with each baseline by an exact
McNemar test on the paired per-example correctness (two-sided binomial test of the discordant pairs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from vlens.core.image_regions import TokenSelection
from vlens.core.inputs import VLMInputs
from vlens.flow.batch import FlowBatch
from vlens.flow.sweep import answer_scores
from vlens.utils.errors import UserInputError
from vlens.utils.results import Result, own_fields
from vlens.utils.stats import bootstrap_interval, wilson_interval
from vlens.utils.validation import check_choice, check_count
from vlens.viz.optional import require_plotly

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM

HOWS = ("mean", "zero", "resample")
CONDITIONS = ("object", "random", "register")
OUTLIER_MADS = 3.0


def mcnemar_exact(a: Sequence[bool], b: Sequence[bool]) -> dict[str, float]:
    """Exact McNemar test of paired outcomes: {"a_only", "b_only", "p"} (two-sided binomial on the discordant pairs).

    Example: a = [1, 1, 1, 1, 1], b = [0, 0, 0, 0, 0] -> a_only 5, b_only 0, p = 2 * 0.5**5 = 0.0625.
    """
    if len(a) != len(b):
        raise UserInputError(f"McNemar needs paired outcomes: got {len(a)} and {len(b)}")
    a_only = sum(1 for x, y in zip(a, b, strict=True) if x and not y)
    b_only = sum(1 for x, y in zip(a, b, strict=True) if y and not x)
    n = a_only + b_only
    tail = sum(math.comb(n, i) for i in range(min(a_only, b_only) + 1)) / 2**n if n else 1.0
    return {"a_only": a_only, "b_only": b_only, "p": min(1.0, 2 * tail)}


@dataclass
class TokenSets:
    """Per example, the image positions of each condition and the image positions in embed order."""

    image: list[Tensor]
    object: list[Tensor]
    random: list[Tensor]
    register: list[Tensor]
    n_outliers: list[int]


def site_activations(model: HookedVLM, inputs: VLMInputs, at: str | int) -> list[Tensor]:
    """Per example, the clean activation at the ablation site of each image token: [n_image_tokens_b, d_model]."""
    name = "vision.hook_image_embeds" if at == "vision" else f"blocks.{at}.hook_resid_pre"
    with torch.no_grad():
        _, cache = model.run_with_cache(inputs, names_filter=lambda n: n == name)
    acts = cache[name]
    regions = inputs.token_regions
    if at == "vision":
        counts = [len(p) for p in regions.image]
        return list(acts.split(counts))
    return [acts[row, regions.image[row].to(acts.device)] for row in range(inputs.batch_size)]


def choose_tokens(inputs: VLMInputs, objects: list[TokenSelection], activations: list[Tensor],
                  buffer: int, generator: torch.Generator) -> TokenSets:
    """The object (+ buffer), random and register positions of every example (see the module docstring)."""
    regions = inputs.token_regions
    sets = TokenSets([], [], [], [], [])
    for row, found in enumerate(objects):
        image = regions.image[row].cpu()
        chosen = found.buffer(buffer).positions.cpu().sort().values
        outside = ~torch.isin(image, chosen)
        k = len(chosen)
        if int(outside.sum()) < k:
            raise UserInputError(f"example {row}: the object covers {k} of {len(image)} image tokens, leaving fewer "
                                 "than that many outside it for the baselines; use a smaller buffer or object")
        candidates = image[outside]
        random = candidates[torch.randperm(len(candidates), generator=generator)[:k]].sort().values
        norms = activations[row].float().norm(dim=-1).cpu()
        register = candidates[norms[outside].argsort(descending=True)[:k]].sort().values
        median = norms.median()
        mad = (norms - median).abs().median()
        sets.image.append(image)
        sets.object.append(chosen)
        sets.random.append(random)
        sets.register.append(register)
        sets.n_outliers.append(int((norms > median + OUTLIER_MADS * mad).sum()))
    return sets


def replacement(how: str, activations: list[Tensor], row: int, index: Tensor) -> Tensor:
    """What the ablated tokens of example `row` become: [len(index), d_model]."""
    own = activations[row]
    if how == "zero":
        return torch.zeros(len(index), own.shape[-1], dtype=own.dtype, device=own.device)
    if how == "mean":
        mean = torch.cat(activations).mean(0)
        return mean.expand(len(index), -1)
    other = activations[(row + 1) % len(activations)]
    return other[index.to(other.device) % other.shape[0]].to(own.device)


def ablation_hook(at: str | int, inputs: VLMInputs, positions: list[Tensor], how: str, activations: list[Tensor]):
    """(hook name, hook) that writes the replacements at `positions` (per example, image positions)."""
    regions = inputs.token_regions
    image = [regions.image[row].cpu() for row in range(inputs.batch_size)]
    index = [torch.searchsorted(image[row], positions[row].cpu()) for row in range(inputs.batch_size)]
    if at == "vision":
        offsets = torch.tensor([0] + [len(p) for p in image]).cumsum(0)

        def vision_hook(embeds: Float[Tensor, "n_image_tokens d_model"], hook: Any) -> Tensor:
            embeds = embeds.clone()
            for row, rows in enumerate(index):
                new = replacement(how, activations, row, rows)
                embeds[(offsets[row] + rows).to(embeds.device)] = new.to(embeds.device, embeds.dtype)
            return embeds

        return "vision.hook_image_embeds", vision_hook

    def resid_hook(resid: Float[Tensor, "batch pos d_model"], hook: Any) -> Tensor:
        resid = resid.clone()
        for row, rows in enumerate(index):
            new = replacement(how, activations, row, rows)
            resid[row, positions[row].to(resid.device)] = new.to(resid.device, resid.dtype)
        return resid

    return f"blocks.{at}.hook_resid_pre", resid_hook


@dataclass
class TokenAblation(Result):
    """Accuracy and answer probability with the object's tokens, random tokens or high-norm tokens ablated.

    Attributes:
        settings: how, at, buffer, seed, batch_size; batch / n: the examples.
        correct: condition ("clean", "object", "random", "register") -> [n] answer argmax at the final position.
        prob: condition -> [n] the answer's probability.
        n_tokens: [n] tokens ablated per example (the same in every condition); n_outliers: [n] high-norm outliers.
        accuracy: condition -> {"value", "low", "high"} (Wilson 95%); prob_drop: condition -> {"mean", "low",
            "high"} of p_clean - p_ablated (bootstrap 95%); tests: "object_vs_random" / "object_vs_register"
            -> exact McNemar {"a_only" (object correct only), "b_only", "p"}.
    """

    kind = "token_ablation"
    saved_dims: ClassVar[dict[str, str]] = {"n": "n_examples", "correct[*]": "n_examples", "prob[*]": "n_examples",
                                            "n_tokens": "n_examples", "n_outliers": "n_examples"}  # checked when a file is read

    settings: dict
    batch: str
    n: int
    correct: dict[str, list[bool]]
    prob: dict[str, list[float]]
    n_tokens: list[int]
    n_outliers: list[int]
    accuracy: dict[str, dict[str, float]] = field(default_factory=dict)
    prob_drop: dict[str, dict[str, float]] = field(default_factory=dict)
    tests: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> TokenAblation:
        return cls(**own_fields(cls, data))

    def accuracy_drop(self, condition: str) -> float:
        """Clean accuracy minus the accuracy with `condition`'s tokens ablated."""
        return self.accuracy["clean"]["value"] - self.accuracy[condition]["value"]

    def report(self) -> str:
        """A Markdown table: accuracy [95% interval], its drop, the probability drop, and the tests."""
        lines = ["| condition | accuracy | drop | p(answer) drop |", "|---|---|---|---|"]
        for condition, acc in self.accuracy.items():
            drop = "" if condition == "clean" else f"{self.accuracy_drop(condition):+.2f}"
            prob = self.prob_drop.get(condition)
            prob_text = "" if prob is None else f"{prob['mean']:+.3f} [{prob['low']:+.3f}, {prob['high']:+.3f}]"
            lines.append(f"| {condition} | {acc['value']:.2f} [{acc['low']:.2f}, {acc['high']:.2f}] | {drop} | {prob_text} |")
        for name, test in self.tests.items():
            lines.append(f"\n{name}: exact McNemar p = {test['p']:.3g} (object correct only {test['a_only']}, "
                         f"baseline correct only {test['b_only']})")
        mean_tokens = sum(self.n_tokens) / max(len(self.n_tokens), 1)
        lines.append(f"\n{self.n} examples ({self.batch}), {mean_tokens:.1f} tokens ablated per example "
                     f"({self.settings['how']} at {self.settings['at']}, buffer {self.settings['buffer']}); "
                     f"high-norm outliers per image: {sum(self.n_outliers) / max(len(self.n_outliers), 1):.1f}")
        return "\n".join(lines)

    def plot(self, **_: Any) -> Any:
        """Accuracy per condition with its Wilson interval (plotly bar chart)."""
        go = require_plotly()
        names = list(self.accuracy)
        values = [self.accuracy[c]["value"] for c in names]
        figure = go.Figure(go.Bar(x=names, y=values, error_y={
            "type": "data", "symmetric": False,
            "array": [self.accuracy[c]["high"] - self.accuracy[c]["value"] for c in names],
            "arrayminus": [self.accuracy[c]["value"] - self.accuracy[c]["low"] for c in names]}))
        figure.update_layout(title=f"Token ablation ({self.settings['how']} at {self.settings['at']}, {self.batch}, "
                                   f"n={self.n})", yaxis_title="answer accuracy", yaxis_range=[0, 1])
        return figure


def check_site(model: HookedVLM, at: str | int) -> str | int:
    if at == "vision":
        return at
    if isinstance(at, str) and at.isdigit():
        at = int(at)
    if not isinstance(at, int) or isinstance(at, bool) or not 0 <= at < model.cfg.n_layers:
        raise UserInputError(f"at={at!r}: use 'vision' (the vision output) or a decoder layer 0-{model.cfg.n_layers - 1}")
    return at


N_RESAMPLES = 1000  # bootstrap resamples of the examples behind each probability drop's interval


def ablate_tokens(model: HookedVLM, batch: FlowBatch, how: str = "mean", at: str | int = "vision", buffer: int = 0,
                  seed: int = 0, batch_size: int = 16, progress: bool = True) -> TokenAblation:
    """Ablate each example's object tokens (+ buffer), as many random image tokens, and as many high-norm ones.

    Args:
        model: a HookedVLM. batch: examples with object boxes (`FlowBatch`, e.g. `object_task_batch("name", 64)`).
        how: "mean", "zero" or "resample". at: "vision" or a decoder layer index. buffer: grid cells around
            the object's tokens ablated with them. seed: the random baseline's draw.
    Returns a `TokenAblation` (see the module docstring for every definition).
    """
    check_choice(how, "how", HOWS)
    at = check_site(model, at)
    check_count(buffer, "buffer", min=0)
    check_count(batch_size, "batch_size")
    if how == "resample" and batch_size < 2:
        raise UserInputError("how='resample' takes activations from another example of the same forward: "
                             "batch_size must be at least 2")
    if not batch.has_objects:
        raise UserInputError("token ablation needs every example's object box (records with 'objects' and one "
                             "'targets' id, or FlowExample(box=...))")
    n = len(batch)
    generator = torch.Generator().manual_seed(seed)
    names = ("clean", *CONDITIONS)
    correct = {c: [False] * n for c in names}
    prob = {c: [0.0] * n for c in names}
    n_tokens, n_outliers = [0] * n, [0] * n
    chunks = [list(range(s, min(s + batch_size, n))) for s in range(0, n, batch_size)]
    for rows in tqdm(chunks, desc="token ablation", disable=not progress):
        inputs, answers, objects = batch.encode(model, rows)
        assert objects is not None
        activations = site_activations(model, inputs, at)
        sets = choose_tokens(inputs, objects, activations, buffer, generator)
        with torch.no_grad():
            for condition in names:
                if condition == "clean":
                    logits = model(inputs)
                else:
                    hook = ablation_hook(at, inputs, getattr(sets, condition), how, activations)
                    with model.hooks(fwd_hooks=[hook]):
                        logits = model(inputs)
                final = logits[torch.arange(len(rows)), inputs.token_regions.final.to(logits.device)]
                p, _ = answer_scores(final, answers)
                hit = (final.argmax(-1).cpu() == answers).tolist()
                for j, row in enumerate(rows):
                    correct[condition][row], prob[condition][row] = bool(hit[j]), float(p[j])
        for j, row in enumerate(rows):
            n_tokens[row], n_outliers[row] = len(sets.object[j]), sets.n_outliers[j]
    accuracy = {}
    for condition in names:
        hits = sum(correct[condition])
        low, high = wilson_interval(hits, n)
        accuracy[condition] = {"value": hits / n, "low": float(low), "high": float(high)}
    clean_p = torch.tensor(prob["clean"], dtype=torch.float64)
    prob_drop = {}
    for condition in CONDITIONS:
        drop = clean_p - torch.tensor(prob[condition], dtype=torch.float64)
        low, high = bootstrap_interval(drop, n_resamples=N_RESAMPLES, seed=seed)
        prob_drop[condition] = {"mean": float(drop.mean()), "low": float(low), "high": float(high)}
    tests = {f"object_vs_{b}": mcnemar_exact(correct["object"], correct[b]) for b in ("random", "register")}
    settings = {"how": how, "at": at, "buffer": buffer, "seed": seed, "batch_size": batch_size}
    return TokenAblation(settings=settings, batch=batch.name, n=n, correct=correct, prob=prob, n_tokens=n_tokens,
                         n_outliers=n_outliers, accuracy=accuracy, prob_drop=prob_drop, tests=tests)
