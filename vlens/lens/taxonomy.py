"""The paper's head taxonomy (docs/method.md, section 5) from explicit thresholds on head scores.

Rules, checked in this order (the most specific behaviour first; the first match wins):

1. **awareness** — ``existence_response >= existence_min`` (top-1 says "1"/"yes"/"present"
   although the answer is something else: the paper's L26H8) or
   ``difficulty_response >= difficulty_min`` (decodes "difficult"/"impossible" on crowded
   images: the paper's L23H19).
2. **counting aggregation** — ``answer_alignment >= alignment_min`` and
   ``image_attention <= aggregation_image_max``: the head's decoding is the model's answer
   while it barely looks at the image (aggregates on the text side; the paper's L26H26).
3. **cross-modal routing** — ``image_attention >= routing_image_min`` and
   ``cter >= routing_cter_min``: reads the image and writes number concepts (L19H23).
4. **visual grounding** — ``vgs >= grounding_vgs_min``: decodes colours/shapes/edges/sizes.
5. **other** — everything else.

Chance correction (``chance_corrected=True``, the default): VGS and CTER are shares of a
top-k list, and a random top-k already holds ``c = |vocabulary| / d_vocab`` of them (22% of
a 99-token toy vocabulary, ~0 of Qwen's 152k). The VGS/CTER rules compare the lift above
chance ``(share - c) / (1 - c)`` with the threshold, so the thresholds mean the same on a
tiny model as on a 7B one. The table and heads.json report the raw shares.

Layer depth is *not* a rule: the paper reports where each class sits (grounding in early
layers, routing in the middle, aggregation late) as a finding, so it is left to be checked
against the result rather than imposed. Undefined scores (NaN) never satisfy a rule.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass

import torch
from jaxtyping import Int
from torch import Tensor

from vlens.lens.head_scores import SCORE_NAMES, HeadScores
from vlens.utils.results import Result
from vlens.viz.figures import layer_head_heatmap

HEAD_CLASSES: tuple[str, ...] = (
    "visual grounding", "cross-modal routing", "counting aggregation", "awareness", "non-finite", "other",
)  # "non-finite": the head's logits were NaN/inf (its scores are NaN), so it has no class.


@dataclass(frozen=True)
class TaxonomyThresholds:
    """Thresholds of the rules above (scores are shares in [0, 1])."""

    existence_min: float = 0.5
    difficulty_min: float = 0.3
    alignment_min: float = 0.5
    aggregation_image_max: float = 0.1
    routing_image_min: float = 0.3
    routing_cter_min: float = 0.3
    grounding_vgs_min: float = 0.3
    chance_corrected: bool = True  # compare VGS / CTER lifts above chance (see the module docstring)

    def __post_init__(self):
        for name, value in asdict(self).items():
            if name == "chance_corrected":
                if not isinstance(value, bool):
                    raise ValueError(f"chance_corrected must be true or false, got {value!r}")
            elif not 0.0 <= value <= 1.0:
                raise ValueError(f"threshold {name} must lie in [0, 1], got {value}")

    def to_dict(self) -> dict:
        return asdict(self)


def token_share_chance(scores: HeadScores) -> dict[str, float]:
    """Chance level of VGS and CTER: the share a uniformly random top-k list would have."""
    if not scores.d_vocab:
        return {}
    sizes = scores.vocab_sizes
    return {score: sizes[vocab] / scores.d_vocab for score, vocab in (("vgs", "visual"), ("cter", "number"))
            if vocab in sizes}


def classify_head(scores: dict[str, float | None], thresholds: TaxonomyThresholds = TaxonomyThresholds(),
                  chance: dict[str, float] | None = None) -> str:
    """The class of one head from its scores (None / NaN = undefined, never passes a rule).

    chance: ``{"vgs": c, "cter": c}`` chance levels; with ``thresholds.chance_corrected`` those
    scores are compared as ``(score - c) / (1 - c)``.
    """
    if thresholds.chance_corrected and chance:
        scores = dict(scores)
        for name, c in chance.items():
            value = scores.get(name)
            if value is not None and c < 1:
                scores[name] = (value - c) / (1 - c)
    def at_least(name, value):
        x = scores.get(name)
        return x is not None and x == x and x >= value

    def at_most(name, value):
        x = scores.get(name)
        return x is not None and x == x and x <= value

    t = thresholds
    if at_least("existence_response", t.existence_min) or at_least("difficulty_response", t.difficulty_min):
        return "awareness"
    if at_least("answer_alignment", t.alignment_min) and at_most("image_attention", t.aggregation_image_max):
        return "counting aggregation"
    if at_least("image_attention", t.routing_image_min) and at_least("cter", t.routing_cter_min):
        return "cross-modal routing"
    if at_least("vgs", t.grounding_vgs_min):
        return "visual grounding"
    return "other"


@dataclass
class HeadTaxonomy(Result):
    """Each head's class, with the scores and thresholds that decided it."""

    classes: dict[tuple[int, int], str]
    scores: HeadScores
    thresholds: TaxonomyThresholds

    @property
    def shape(self) -> tuple[int, int]:
        return self.scores.shape

    def class_grid(self) -> Int[Tensor, "n_layers n_heads"]:
        """Class index per head (into `HEAD_CLASSES`)."""
        grid = torch.full(self.shape, HEAD_CLASSES.index("other"), dtype=torch.long)
        for (layer, head), name in self.classes.items():
            grid[layer, head] = HEAD_CLASSES.index(name)
        return grid

    def counts(self) -> dict[str, int]:
        """Heads per class ("non-finite" only listed when some head is)."""
        counter = Counter(self.classes.values())
        return {name: counter.get(name, 0) for name in HEAD_CLASSES if name != "non-finite" or counter.get(name)}

    def heads_of(self, name: str) -> list[tuple[int, int]]:
        if name not in HEAD_CLASSES:
            raise ValueError(f"unknown class {name!r}; classes: {HEAD_CLASSES}")
        return sorted(key for key, value in self.classes.items() if value == name)

    def table(self, include_other: bool = False) -> str:
        """Markdown table: one row per classified head (sorted by class, layer, head)."""
        header = "| class | head | " + " | ".join(SCORE_NAMES) + " | top tokens |"
        lines = [header, "|" + "---|" * (len(SCORE_NAMES) + 3)]
        for name in HEAD_CLASSES:
            if name == "other" and not include_other:
                continue
            for layer, head in self.heads_of(name):
                values = self.scores.head(layer, head)
                cells = ["-" if values[s] is None else f"{values[s]:.2f}" for s in SCORE_NAMES]
                tokens = ", ".join(repr(t) for t, _ in self.scores.top_tokens.get((layer, head), [])[:5])
                lines.append(f"| {name} | L{layer}H{head} | " + " | ".join(cells) + f" | {tokens} |")
        return "\n".join(lines)

    def plot(self, title: str = "HeadLens head taxonomy", value: str | None = None):
        """Plotly layer x head map coloured by class; hover shows the class (and score `value`, e.g. "cter")."""
        if value is not None and value not in self.scores.scores:
            raise ValueError(f"value must be one of {sorted(self.scores.scores)}, got {value!r}")
        values = None if value is None else torch.nan_to_num(self.scores.scores[value], nan=0.0)
        return layer_head_heatmap(values=values, value_label=value or "value", classes=self.class_grid(),
                                  class_names=HEAD_CLASSES, title=title)

    def heads_json(self) -> list[dict]:
        """Per head: layer, head, scores, class, top tokens (what ``heads.json`` holds)."""
        return [{"layer": layer, "head": head, "class": self.classes[(layer, head)],
                 "scores": self.scores.head(layer, head),
                 "top_tokens": [[t, c] for t, c in self.scores.top_tokens.get((layer, head), [])]}
                for layer, head in self.scores.head_keys()]

    def to_dict(self) -> dict:
        return {"thresholds": self.thresholds.to_dict(), "counts": self.counts(),
                "n_examples": self.scores.n_examples, "k": self.scores.k, "vocab_sizes": self.scores.vocab_sizes,
                "d_vocab": self.scores.d_vocab, "chance": token_share_chance(self.scores),
                "heads": self.heads_json()}


def classify_heads(scores: HeadScores, thresholds: TaxonomyThresholds = TaxonomyThresholds()) -> HeadTaxonomy:
    """Apply the rules to every head."""
    chance = token_share_chance(scores)
    classes = {(layer, head): "non-finite" if scores.head_non_finite(layer, head)
               else classify_head(scores.head(layer, head), thresholds, chance)
               for layer, head in scores.head_keys()}
    return HeadTaxonomy(classes=classes, scores=scores, thresholds=thresholds)
