"""The paper's head taxonomy (docs/method.md, section 5) from explicit thresholds on head scores.

Rules, checked in this order (the most specific behaviour first; the first match wins):

1. **awareness** — ``existence_response >= existence_min`` (top-1 says "1"/"yes"/"present"
   although the answer is something else: the paper's L26H8) or
   ``difficulty_response >= difficulty_min`` (decodes "difficult"/"impossible" on crowded
   images: the paper's L23H19).
2. **counting aggregation** — ``answer_alignment >= alignment_min`` and
   ``image_attention_ratio <= aggregation_image_ratio_max``: the head's decoding is the model's
   answer while it barely looks at the image (aggregates on the text side; the paper's L26H26).
3. **cross-modal routing** — ``image_attention_ratio >= routing_image_ratio_min`` and
   ``cter >= routing_cter_min``: reads the image and writes number concepts (L19H23).
4. **visual grounding** — ``vgs >= grounding_vgs_min``: decodes colours/shapes/edges/sizes.
5. **other** — everything else.

Chance correction (``chance_corrected=True``, the default): VGS and CTER are shares of a
top-k list, and a random top-k already holds ``c = |vocabulary| / d_vocab`` of them (22% of
a 99-token toy vocabulary, ~0 of Qwen's 152k). The VGS/CTER rules compare the lift above
chance ``(share - c) / (1 - c)`` with the threshold, so the thresholds mean the same on a
tiny model as on a 7B one. The table and heads.json report the raw shares.

Image attention is read relative to chance: ``image_attention_ratio`` is the attention mass on
image tokens divided by the share of image tokens among the keys (1.0 = uniform attention). On
a prompt whose keys are 69% image tokens an absolute mass of 0.3 is *less* than uniform, so the
thresholds are on the ratio: routing needs at least uniform attention to the image (ratio >= 1),
aggregation at most a quarter of it (ratio <= 0.25).

Stability (`classify_heads(..., n_resamples=200)`): the examples are resampled with replacement
and every head reclassified on each resample; a head's stability is the share of resamples that
give it its class, and a head below ``STABLE_SHARE`` (0.9) is marked unstable. Class counts
carry 95% percentile intervals over the same resamples.

Layer depth is *not* a rule: the paper reports where each class sits (grounding in early
layers, routing in the middle, aggregation late) as a finding, so it is left to be checked
against the result rather than imposed. Undefined scores (NaN) never satisfy a rule.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass
from typing import ClassVar

import torch
from jaxtyping import Float, Int
from torch import Tensor

from vlens.lens.head_scores import SCORE_NAMES, HeadScores, scores_from_heads
from vlens.utils.errors import UserInputError
from vlens.utils.results import Result
from vlens.utils.stats import LEVEL, bootstrap_counts, percentile_interval
from vlens.viz.figures import layer_head_heatmap

STABLE_SHARE = 0.9  # a head whose class holds on fewer resamples than this is marked unstable
N_RESAMPLES = 200  # bootstrap resamples of the examples behind each head's class stability
RENAMED_THRESHOLDS = {"aggregation_image_max": "aggregation_image_ratio_max",
                      "routing_image_min": "routing_image_ratio_min"}

HEAD_CLASSES: tuple[str, ...] = (
    "visual grounding", "cross-modal routing", "counting aggregation", "awareness", "non-finite", "other",
)  # "non-finite": the head's logits were NaN/inf (its scores are NaN), so it has no class.


@dataclass(frozen=True)
class TaxonomyThresholds:
    """Thresholds of the rules above (scores are shares in [0, 1])."""

    existence_min: float = 0.5
    difficulty_min: float = 0.3
    alignment_min: float = 0.5
    aggregation_image_ratio_max: float = 0.25  # image attention / image-token share (1 = uniform)
    routing_image_ratio_min: float = 1.0
    routing_cter_min: float = 0.3
    grounding_vgs_min: float = 0.3
    chance_corrected: bool = True  # compare VGS / CTER lifts above chance (see the module docstring)

    def __post_init__(self):
        for name, value in asdict(self).items():
            if name == "chance_corrected":
                if not isinstance(value, bool):
                    raise UserInputError(f"chance_corrected must be true or false, got {value!r}")
            elif name.endswith("_ratio_min") or name.endswith("_ratio_max"):
                if not 0.0 <= value < float("inf"):
                    raise UserInputError(f"threshold {name} (a ratio to uniform attention) must be >= 0, got {value}")
            elif not 0.0 <= value <= 1.0:
                raise UserInputError(f"threshold {name} must lie in [0, 1], got {value}")

    @classmethod
    def from_dict(cls, data: dict) -> TaxonomyThresholds:
        """Thresholds from JSON; the old absolute image-attention names are refused with the new ones."""
        old = sorted(set(data) & set(RENAMED_THRESHOLDS))
        if old:
            raise UserInputError(f"thresholds {old} were absolute image-attention shares; image attention is now "
                                 f"relative to the image-token share (1 = uniform): use "
                                 f"{[RENAMED_THRESHOLDS[k] for k in old]} (defaults 0.25 and 1.0)")
        known = set(asdict(cls()))
        unknown = sorted(set(data) - known)
        if unknown:
            raise UserInputError(f"unknown thresholds {unknown}; known: {sorted(known)}")
        return cls(**data)

    def to_dict(self) -> dict:
        return asdict(self)


def token_share_chance(scores: HeadScores) -> dict[str, float]:
    """Chance level of VGS and CTER: the share a uniformly random top-k list would have."""
    if not scores.d_vocab:
        return {}
    sizes = scores.vocab_sizes
    return {score: sizes[vocab] / scores.d_vocab for score, vocab in (("vgs", "visual"), ("cter", "number"))
            if vocab in sizes}


def classify_grid(scores: dict[str, Tensor], thresholds: TaxonomyThresholds = TaxonomyThresholds(),
                  chance: dict[str, float] | None = None) -> Int[Tensor, "..."]:
    """Class index (into `HEAD_CLASSES`) of every head from score tensors of one shape (any leading
    dims, e.g. [n_resamples, n_layers, n_heads]); NaN never passes a rule. The rules of the module
    docstring, first match wins."""
    shape = next(iter(scores.values())).shape
    values = {name: torch.as_tensor(v, dtype=torch.float64) for name, v in scores.items()}
    if thresholds.chance_corrected and chance:
        for name, c in chance.items():
            if name in values and c < 1:
                values[name] = (values[name] - c) / (1 - c)
    missing = torch.full(shape, float("nan"), dtype=torch.float64)

    def at_least(name: str, threshold: float) -> Tensor:
        return values.get(name, missing) >= threshold  # NaN compares False

    def at_most(name: str, threshold: float) -> Tensor:
        return values.get(name, missing) <= threshold

    t = thresholds
    rules = [
        ("awareness", at_least("existence_response", t.existence_min) | at_least("difficulty_response", t.difficulty_min)),
        ("counting aggregation", at_least("answer_alignment", t.alignment_min)
         & at_most("image_attention_ratio", t.aggregation_image_ratio_max)),
        ("cross-modal routing", at_least("image_attention_ratio", t.routing_image_ratio_min)
         & at_least("cter", t.routing_cter_min)),
        ("visual grounding", at_least("vgs", t.grounding_vgs_min)),
    ]
    out = torch.full(shape, HEAD_CLASSES.index("other"), dtype=torch.long)
    for name, passed in reversed(rules):  # the first rule that matches wins: apply it last
        out = torch.where(passed, HEAD_CLASSES.index(name), out)
    return out


def classify_head(scores: dict[str, float | None], thresholds: TaxonomyThresholds = TaxonomyThresholds(),
                  chance: dict[str, float] | None = None) -> str:
    """The class of one head from its scores (None / NaN = undefined, never passes a rule).

    chance: ``{"vgs": c, "cter": c}`` chance levels; with ``thresholds.chance_corrected`` those
    scores are compared as ``(score - c) / (1 - c)``.
    """
    grid = {name: torch.tensor(float("nan") if value is None else float(value), dtype=torch.float64)
            for name, value in scores.items()}
    return HEAD_CLASSES[int(classify_grid(grid, thresholds, chance))]


@dataclass
class ClassStability:
    """How each head's class holds up when the examples are resampled (bootstrap).

    per_head: [n_layers, n_heads] share of resamples that give the head its class; counts: class ->
    (low, high) 95% percentile interval of the number of heads in the class; n_resamples, seed.
    """

    per_head: Float[Tensor, "n_layers n_heads"]
    counts: dict[str, tuple[float, float]]
    n_resamples: int
    seed: int = 0
    stable_share: float = STABLE_SHARE

    @property
    def unstable(self) -> Tensor:
        """bool [n_layers, n_heads]: heads whose class holds on fewer than `stable_share` of resamples."""
        return self.per_head < self.stable_share

    def to_dict(self) -> dict:
        return {"method": f"percentile bootstrap over the examples ({self.n_resamples} resamples, seed {self.seed}); "
                          "a head's stability is the share of resamples that give it its class",
                "n_resamples": self.n_resamples, "seed": self.seed, "stable_share": self.stable_share,
                "level": LEVEL, "n_unstable": int(self.unstable.sum())}


@dataclass
class HeadTaxonomy(Result):
    """Each head's class, with the scores and thresholds that decided it, and (when the scores keep
    their examples) each class's stability over bootstrap resamples of the examples."""

    classes: dict[tuple[int, int], str]
    scores: HeadScores
    thresholds: TaxonomyThresholds
    stability: ClassStability | None = None

    kind: ClassVar[str] = "head_taxonomy"

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
            raise UserInputError(f"unknown class {name!r}; classes: {HEAD_CLASSES}")
        return sorted(key for key, value in self.classes.items() if value == name)

    def head_stability(self, layer: int, head: int) -> float | None:
        """Share of resamples that give the head its class (None without a stability analysis)."""
        return None if self.stability is None else round(float(self.stability.per_head[layer, head]), 4)

    def stable_heads_of(self, name: str) -> list[tuple[int, int]]:
        """The heads of a class whose class holds on at least `STABLE_SHARE` of resamples (all of them
        without a stability analysis)."""
        if self.stability is None:
            return self.heads_of(name)
        return [h for h in self.heads_of(name) if not bool(self.stability.unstable[h])]

    def table(self, include_other: bool = False) -> str:
        """Markdown table: one row per classified head (sorted by class, layer, head), with its stability."""
        header = "| class | head | stability | " + " | ".join(SCORE_NAMES) + " | top tokens |"
        lines = [header, "|" + "---|" * (len(SCORE_NAMES) + 4)]
        for name in HEAD_CLASSES:
            if name == "other" and not include_other:
                continue
            for layer, head in self.heads_of(name):
                values = self.scores.head(layer, head)
                cells = ["-" if values[s] is None else f"{values[s]:.2f}" for s in SCORE_NAMES]
                tokens = ", ".join(repr(t) for t, _ in self.scores.top_tokens.get((layer, head), [])[:5])
                lines.append(f"| {name} | L{layer}H{head} | {self._stability_text(layer, head)} | "
                             + " | ".join(cells) + f" | {tokens} |")
        return "\n".join(lines)

    def _stability_text(self, layer: int, head: int) -> str:
        value = self.head_stability(layer, head)
        if value is None:
            return "-"
        return f"{value:.2f}" + (" (unstable)" if value < self.stability.stable_share else "")  # type: ignore[union-attr]

    def plot(self, title: str = "HeadLens head taxonomy", value: str | None = None):
        """Plotly layer x head map coloured by class; hover shows the class (and score `value`, e.g. "cter",
        or "stability"); heads whose class is unstable over resamples are marked "?"."""
        if value is not None and value not in self.scores.scores and value != "stability":
            raise UserInputError(f"value must be one of {sorted(self.scores.scores) + ['stability']}, got {value!r}")
        if value == "stability":
            grid = None if self.stability is None else self.stability.per_head
        else:
            grid = None if value is None else self.scores.scores[value]
        values = None if grid is None else torch.nan_to_num(grid.float(), nan=0.0)
        figure = layer_head_heatmap(values=values, value_label=value or "value", classes=self.class_grid(),
                                    class_names=HEAD_CLASSES, title=title)
        if self.stability is not None:
            marks = [["?" if bool(u) else "" for u in row] for row in self.stability.unstable]
            figure.data[0].update(text=marks, texttemplate="%{text}")
            figure.update_layout(title=f"{title} (? = class unstable over resampled examples)")
        return figure

    def heads_json(self) -> list[dict]:
        """Per head: layer, head, scores, class, its stability, top tokens (what ``heads.json`` holds)."""
        out = []
        for layer, head in self.scores.head_keys():
            entry = {"layer": layer, "head": head, "class": self.classes[(layer, head)],
                     "scores": self.scores.head(layer, head),
                     "top_tokens": [[t, c] for t, c in self.scores.top_tokens.get((layer, head), [])]}
            if self.stability is not None:
                entry["stability"] = self.head_stability(layer, head)
                entry["stable"] = not bool(self.stability.unstable[layer, head])
            out.append(entry)
        return out

    def to_dict(self) -> dict:
        stability = self.stability
        return {"thresholds": self.thresholds.to_dict(), "counts": self.counts(),
                "counts_interval": None if stability is None else {
                    name: list(stability.counts.get(name, (0.0, 0.0))) for name in self.counts()},
                "stability": None if stability is None else stability.to_dict(),
                "image_share": self.scores.image_share,
                "image_attention_rule": "image_attention_ratio = mass on image tokens / share of image tokens "
                                        "among the keys (1 = uniform attention)",
                "n_examples": self.scores.n_examples, "k": self.scores.k, "vocab_sizes": self.scores.vocab_sizes,
                "d_vocab": self.scores.d_vocab, "chance": token_share_chance(self.scores),
                "heads": self.heads_json()}

    @classmethod
    def from_dict(cls, data: dict) -> HeadTaxonomy:
        """The taxonomy `to_dict` wrote (scores and stabilities as rounded there; no per-example values)."""
        heads = data["heads"]
        counted = data.get("counts")
        if isinstance(counted, dict) and all(isinstance(n, int) for n in counted.values()) \
                and sum(counted.values()) > len(heads):  # the counts are written from the heads' classes
            raise UserInputError(f"the field 'heads' holds {len(heads)} heads, but 'counts' counts "
                                 f"{sum(counted.values())}: an entry was removed (the file was edited or cut short)")
        scores = scores_from_heads(heads, n_examples=int(data["n_examples"]), k=int(data["k"]),
                                   vocab_sizes=dict(data.get("vocab_sizes") or {}), d_vocab=data.get("d_vocab"),
                                   image_share=data.get("image_share"))
        classes = {(int(h["layer"]), int(h["head"])): h["class"] for h in heads}
        stability = None
        saved = data.get("stability")
        if saved is not None:
            per_head = torch.full(scores.shape, torch.nan, dtype=torch.float64)
            share = float(saved["stable_share"])
            for h in heads:
                value = math.nan if h.get("stability") is None else float(h["stability"])
                if not h.get("stable", True) and value >= share:  # rounded up onto the threshold: keep it below
                    value = math.nextafter(share, 0.0)
                per_head[int(h["layer"]), int(h["head"])] = value
            intervals = data.get("counts_interval") or {}
            stability = ClassStability(per_head=per_head,
                                       counts={name: (float(low), float(high)) for name, (low, high) in intervals.items()},
                                       n_resamples=int(saved["n_resamples"]), seed=int(saved["seed"]),
                                       stable_share=share)
        return cls(classes=classes, scores=scores, thresholds=TaxonomyThresholds.from_dict(data["thresholds"]),
                   stability=stability)


def classify_heads(scores: HeadScores, thresholds: TaxonomyThresholds = TaxonomyThresholds(),
                   n_resamples: int = N_RESAMPLES, seed: int = 0) -> HeadTaxonomy:
    """Apply the rules to every head; with per-example scores (as `compute_head_scores` keeps them)
    and n_resamples > 0, also each head's class stability and the class counts' intervals over
    bootstrap resamples of the examples.

    Args:
        scores: the heads' scores (`compute_head_scores`), each [n_layers, n_heads].
        thresholds: the rules' thresholds (`TaxonomyThresholds`).
        n_resamples, seed: bootstrap resamples of the examples for the class stability (0: none).
    Returns:
        a `HeadTaxonomy`: each (layer, head)'s class, the scores, thresholds and stability
        (per_head [n_layers, n_heads], NaN beyond a layer's heads).
    """
    chance = token_share_chance(scores)
    grid = classify_grid(scores.scores, thresholds, chance)
    broken = scores.non_finite if scores.non_finite is not None else torch.zeros(grid.shape, dtype=torch.bool)
    grid = grid.masked_fill(broken, HEAD_CLASSES.index("non-finite"))
    classes = {(layer, head): HEAD_CLASSES[int(grid[layer, head])] for layer, head in scores.head_keys()}
    stability = None
    if scores.per_example is not None and n_resamples > 0 and scores.n_examples > 0:
        counts = bootstrap_counts(scores.n_examples, n_resamples, seed)
        drawn = classify_grid(scores.resampled(counts), thresholds, chance)  # [n_resamples, L, H]
        drawn = drawn.masked_fill(broken, HEAD_CLASSES.index("non-finite"))
        drawn = drawn.masked_fill(~scores.exists(), -1)  # cells beyond a layer's heads count in no class
        # NaN beyond a layer's heads: no stability there, and never counted unstable
        per_head = (drawn == grid).double().mean(0).masked_fill(~scores.exists(), torch.nan)
        class_counts = {}
        for index, name in enumerate(HEAD_CLASSES):
            low, high = percentile_interval((drawn == index).flatten(1).sum(1).double())
            # whole heads: the interpolated percentiles rounded outwards (the order statistics either side)
            class_counts[name] = (float(math.floor(low)), float(math.ceil(high)))
        stability = ClassStability(per_head=per_head, counts=class_counts, n_resamples=n_resamples, seed=seed)
    return HeadTaxonomy(classes=classes, scores=scores, thresholds=thresholds, stability=stability)
