"""Per-head scores over a dataset, from HeadLens top-k tokens and attention patterns.

For each head (all at the chosen position, default the final prompt position; k = 10):

- ``vgs``  visual grounding score: mean share of the top-k tokens in the "visual" vocabulary
  (colours, shapes, edges, sizes).
- ``cter`` counting-token emergence rate: mean share of the top-k tokens in the "number" vocabulary.
- ``image_attention``: mean attention mass from the position onto image tokens (rows with an image).
- ``image_attention_ratio``: the same relative to uniform attention: per example, the mass on
  image tokens divided by the share of image tokens among the keys the position sees, averaged
  over rows with an image (1.0 = the head attends to the image as much as uniform attention
  would; 36 of a prompt's 52 tokens being image tokens, a uniform head has mass 0.69 and ratio 1).
- ``answer_alignment``: share of examples where the head's top-1 token is the model's own top-1.
- ``existence_response``: share of examples where the head's top-1 is an "existence" token
  (``1``, ``yes``, ``present``, ...) although the model's answer is not one — a head that fires
  on "something is there" rather than copying the answer. None when no example qualifies.
- ``difficulty_response``: how much more often the head's top-1 is a "difficulty" token
  (``difficult``, ``impossible``, ...) on crowded images (at least ``large_count`` objects)
  than on the others: ``P(top-1 in vocab | crowded) - P(top-1 in vocab | not crowded)``. Rows
  whose object count is unknown are left out; with no uncrowded row (or no counts at all)
  it is ``P(top-1 in vocab)`` over the rows there are. None when the tokenizer has no
  difficulty word. (Top-1, like the existence response: "the head says it".)

Scores are ``[n_layers, n_heads]`` tensors; NaN stands for "undefined" (None in JSON). A head
whose decoded logits were not finite on any example (NaN activations) has every score NaN and
is flagged in ``HeadScores.non_finite`` (the taxonomy then gives it the class "non-finite").
``HeadScores.per_example`` keeps every example's values (NaN where an example does not count),
so the scores can be recomputed on bootstrap resamples of the examples (`resampled`): the
taxonomy's class stability.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from jaxtyping import Float
from torch import Tensor

from vlens.core.token_labels import str_tokens
from vlens.lens.corpus import Sample, prepare_batch
from vlens.lens.headlens import HeadLens
from vlens.lens.vocabularies import vocabulary_token_ids
from vlens.parallel.options import SweepOptions, fold_legacy
from vlens.utils.errors import UserInputError
from vlens.utils.finite import warn_non_finite
from vlens.utils.results import Result, nan_tensor
from vlens.utils.stats import resampled_means
from vlens.viz.figures import layer_head_heatmap

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM

SCORE_NAMES: tuple[str, ...] = (
    "vgs", "cter", "image_attention", "image_attention_ratio", "answer_alignment", "existence_response",
    "difficulty_response",
)
# per-example values behind the scores (difficulty: its two groups, combined by `scores_from_examples`)
EXAMPLE_VALUES: tuple[str, ...] = (*SCORE_NAMES[:-1], "_difficulty_crowded", "_difficulty_uncrowded")
DEFAULT_LARGE_COUNT = 7


@dataclass
class HeadScores(Result):
    """Scores per head (``[n_layers, n_heads]``, NaN = undefined) and each head's frequent top tokens."""

    scores: dict[str, Float[Tensor, "n_layers n_heads"]]
    top_tokens: dict[tuple[int, int], list[tuple[str, int]]]
    n_examples: int
    k: int
    vocab_sizes: dict[str, int] = field(default_factory=dict)
    d_vocab: int | None = None  # vocab_sizes / d_vocab is the chance level of vgs / cter
    non_finite: Tensor | None = None  # bool [n_layers, n_heads]: NaN/inf logits on some example
    # heads of each layer where layers differ (hybrid decoders: cells beyond a layer's heads are NaN)
    heads_per_layer: list[int] | None = None
    per_example: dict[str, Float[Tensor, "n_examples n_layers n_heads"]] | None = None  # EXAMPLE_VALUES
    image_share: float | None = None  # mean share of image tokens among the keys (rows with an image)

    kind: ClassVar[str] = "head_scores"
    saved_dims: ClassVar[dict[str, str]] = {"heads_per_layer": "n_layers"}  # checked when a file is read

    def resampled(self, counts: Float[Tensor, "n_resamples n_examples"]) -> dict[str, Tensor]:
        """The scores on each bootstrap resample of the examples (`vlens.utils.stats.bootstrap_counts`):
        name -> [n_resamples, n_layers, n_heads]. Needs `per_example` (kept by `compute_head_scores`)."""
        if self.per_example is None:
            raise UserInputError("these head scores keep no per-example values (loaded from JSON?): recompute them with "
                             "compute_head_scores to resample the examples")
        missing = ~self.exists() if self.non_finite is None else self.non_finite | ~self.exists()
        return scores_from_examples(self.per_example, counts, missing)

    def __getattr__(self, name: str):
        scores = self.__dict__.get("scores", {})
        if name in scores:
            return scores[name]
        raise AttributeError(name)

    @property
    def shape(self) -> tuple[int, int]:
        n_layers, n_heads = next(iter(self.scores.values())).shape
        return int(n_layers), int(n_heads)

    def heads_in(self, layer: int) -> int:
        """How many heads layer `layer` has (the grid's width unless layers differ)."""
        return self.heads_per_layer[layer] if self.heads_per_layer else self.shape[1]

    def head_keys(self) -> list[tuple[int, int]]:
        """Every (layer, head) of the model, layer-major."""
        return [(layer, head) for layer in range(self.shape[0]) for head in range(self.heads_in(layer))]

    def exists(self) -> Tensor:
        """bool [n_layers, n_heads]: the cells that are heads of their layer."""
        grid = torch.zeros(self.shape, dtype=torch.bool)
        for layer, head in self.head_keys():
            grid[layer, head] = True
        return grid

    def head(self, layer: int, head: int) -> dict[str, float | None]:
        """The scores of one head (None where undefined)."""
        out = {}
        for name, values in self.scores.items():
            value = float(values[layer, head])
            out[name] = None if value != value else round(value, 6)
        return out

    def head_non_finite(self, layer: int, head: int) -> bool:
        return self.non_finite is not None and bool(self.non_finite[layer, head])

    def plot(self, score: str = "cter", title: str | None = None):
        """Layer x head heatmap of one score (default CTER)."""
        if score not in self.scores:
            raise UserInputError(f"score must be one of {sorted(self.scores)}, got {score!r}")
        return layer_head_heatmap(self.scores[score].float(), title=title or f"{score} per head (k={self.k})",
                                  value_label=score)

    def to_dict(self) -> dict:
        return {
            "n_examples": self.n_examples, "k": self.k, "vocab_sizes": self.vocab_sizes, "d_vocab": self.d_vocab,
            "image_share": self.image_share,
            "heads": [{"layer": layer, "head": head, "scores": self.head(layer, head),
                       "non_finite": self.head_non_finite(layer, head),
                       "top_tokens": [[t, c] for t, c in self.top_tokens.get((layer, head), [])]}
                      for layer, head in self.head_keys()],
            **({"heads_per_layer": self.heads_per_layer} if self.heads_per_layer else {}),
        }

    @classmethod
    def from_dict(cls, data: dict) -> HeadScores:
        heads, per_layer = data["heads"], data.get("heads_per_layer")
        counts = Counter(int(h["layer"]) for h in heads)
        if per_layer is None and len(set(counts.values())) > 1:  # (a model whose layers differ records them)
            most = max(counts.values())
            short = next(layer for layer in sorted(counts) if counts[layer] != most)
            raise UserInputError(f"the field 'heads' lists {counts[short]} heads of layer {short} but {most} of "
                                 "other layers, and the file records no 'heads_per_layer': an entry was removed")
        if isinstance(per_layer, list) and len(per_layer) == len(counts):
            for layer, n in enumerate(per_layer):
                if counts.get(layer) != n:
                    raise UserInputError(f"the field 'heads' lists {counts.get(layer, 0)} heads of layer {layer}, "
                                         f"but 'heads_per_layer' gives it {n}")
        """The scores `to_dict` wrote (as it rounds them, to 6 decimals; no per-example values)."""
        return scores_from_heads(data["heads"], n_examples=int(data["n_examples"]), k=int(data["k"]),
                                 vocab_sizes=dict(data.get("vocab_sizes") or {}), d_vocab=data.get("d_vocab"),
                                 image_share=data.get("image_share"), heads_per_layer=data.get("heads_per_layer"))


def scores_from_heads(heads: Sequence[dict], **fields: Any) -> HeadScores:
    """`HeadScores` from saved per-head entries ({"layer", "head", "scores", "top_tokens"} and
    "non_finite" or a "class"); fields: the rest of `HeadScores`."""
    n_layers = 1 + max(int(h["layer"]) for h in heads)
    width = 1 + max(int(h["head"]) for h in heads)
    names = list(heads[0]["scores"])
    scores = {name: torch.full((n_layers, width), torch.nan, dtype=torch.float64) for name in names}
    non_finite = torch.zeros(n_layers, width, dtype=torch.bool)
    top_tokens: dict[tuple[int, int], list[tuple[str, int]]] = {}
    counts = Counter(int(h["layer"]) for h in heads)
    for layer in range(n_layers):  # each layer's heads are 0 .. n - 1, once each
        listed = sorted(int(h["head"]) for h in heads if int(h["layer"]) == layer)
        if listed != list(range(len(listed))) or not listed:
            gap = next((i for i in range(len(listed) + 1) if i not in listed), len(listed))
            raise UserInputError(f"the field 'heads' lists heads {listed} of layer {layer}: head {gap} is missing or "
                                 "one is listed twice (the file was edited or cut short)")
    for h in heads:
        layer, head = int(h["layer"]), int(h["head"])
        for name in names:
            scores[name][layer, head] = nan_tensor(h["scores"][name], torch.float64)
        non_finite[layer, head] = bool(h.get("non_finite", h.get("class") == "non-finite"))
        if h["top_tokens"]:
            top_tokens[(layer, head)] = [(str(t), int(c)) for t, c in h["top_tokens"]]
    if fields.get("heads_per_layer") is None and len(set(counts.values())) > 1:
        fields["heads_per_layer"] = [counts[layer] for layer in range(n_layers)]
    return HeadScores(scores=scores, top_tokens=top_tokens, non_finite=non_finite, **fields)


def scores_from_examples(per_example: Mapping[str, Tensor], counts: Tensor | None = None,
                         non_finite: Tensor | None = None) -> dict[str, Tensor]:
    """Scores from per-example values (`EXAMPLE_VALUES`, [n, L, H], NaN where an example does not count).

    counts: [n_resamples, n] how often each example is drawn (scores then get a leading resample
    dim); None: every example once, scores [L, H]. NaN where no counted example was drawn.
    """
    n = next(iter(per_example.values())).shape[0]
    weights = torch.ones(1, n, dtype=torch.float64) if counts is None else counts.double()
    means = {name: resampled_means(values, weights).float() for name, values in per_example.items()}
    crowded, uncrowded = means.pop("_difficulty_crowded"), means.pop("_difficulty_uncrowded")
    has_uncrowded = per_example["_difficulty_uncrowded"].isfinite().double()
    drawn = (weights @ has_uncrowded.flatten(1)).reshape(weights.shape[0], *has_uncrowded.shape[1:]) > 0
    means["difficulty_response"] = torch.where(drawn, crowded - uncrowded, crowded)  # no uncrowded row: P(.)
    out = {name: means[name] for name in SCORE_NAMES}
    if non_finite is not None:
        out = {name: value.masked_fill(non_finite, torch.nan) for name, value in out.items()}
    return {name: value[0] for name, value in out.items()} if counts is None else out


def object_count(record: Mapping) -> int | None:
    """Objects in the image: ``len(objects)`` if listed, else ``count``, else None."""
    if isinstance(record.get("objects"), list):
        return len(record["objects"])
    count = record.get("count")
    return int(count) if isinstance(count, int | float) else None


def _share_in(ids: Tensor, members: set[int]) -> Tensor:
    """ids [..., k] -> share of the k ids that lie in `members`, [...]."""
    if not members:
        return torch.zeros(ids.shape[:-1])
    lookup = torch.tensor(sorted(members))
    return torch.isin(ids, lookup).float().mean(-1)


def compute_head_scores(
    model: HookedVLM,
    samples: Sequence[Sample],
    lens: HeadLens | None = None,
    k: int = 10,
    vocabularies: Mapping[str, Iterable[str]] | None = None,
    large_count: int = DEFAULT_LARGE_COUNT,
    n_top_tokens: int = 10,
    options: SweepOptions | None = None,
    **legacy: Any,
) -> HeadScores:
    """Run HeadLens at the final position over `samples` and score every head (see module docstring).

    Args:
        model: the model.
        samples: (image, prompt, record) triples (`vlens.lens.corpus.task_samples` / `dataset_samples`).
        lens: the HeadLens (default: untrained translators, the heads' logit lens).
        k: top-k tokens decoded per head.
        vocabularies: {name: words} replacing the default vocabularies (visual, number, existence,
            difficulty).
        large_count: objects from which an image counts as crowded (difficulty response).
        n_top_tokens: frequent top tokens kept per head.
        options: `batch_size` (samples per forward, default 8), `progress`, `sharding` (the
            batches split across processes; each batch's sums are added in batch order, as in
            one process, and every process returns the full scores); the readout is the final
            position (`vlens.SweepOptions`).
    Returns:
        `HeadScores`: every score [n_layers, n_heads] and each head's frequent top tokens.
    """
    options = fold_legacy(options, legacy, "compute_head_scores", ("batch_size", "progress", "sharding"))
    options.require_final("compute_head_scores")
    batch_size, progress = options.batch(8), options.progress
    lens = lens or HeadLens(model)
    sharding = options.shards
    vocab = vocabulary_token_ids(model.tokenizer, vocabularies)
    for needed in ("visual", "number", "existence", "difficulty"):
        vocab.setdefault(needed, set())
    L, H = model.cfg.n_layers, model.cfg.max_heads
    # cells beyond a layer's own heads (hybrid decoders): HeadLens leaves them empty (-1 / NaN)
    exists = torch.tensor([[head < model.cfg.heads_at(layer) for head in range(H)] for layer in range(L)])
    existence_ids = torch.tensor(sorted(vocab["existence"])) if vocab["existence"] else torch.empty(0, dtype=torch.long)

    def run(start: int) -> dict:
        """One batch's per-example values ([batch, L, H] each, NaN where the example does not count),
        its image-token shares [batch] and its top-k ids [batch, L, H, k]."""
        inputs, records = prepare_batch(model, samples[start:start + batch_size])
        out = lens.run(inputs, positions="final", k=k)
        ids = out.top_ids[:, 0]  # [batch, L, H, k]
        if out.image_attention is None:
            raise RuntimeError("HeadLens.run returned no image attention")
        nan = torch.full(ids.shape[:-1], float("nan"))

        def where(rows: Tensor, values: Tensor) -> Tensor:
            """values [batch, L, H] on the rows that count ([batch] bool), NaN elsewhere."""
            return torch.where(rows[:, None, None], values.float(), nan)

        share = out.image_share[:, 0].float()
        # per layer: the image share among the keys that layer sees (a sliding window may hold no image token:
        # its heads have no image attention to read there, NaN rather than 0)
        layer_share = out.shares_by_layer()[:, 0].float()  # [batch, L]
        sees_image = out.has_image[:, None] & (layer_share > 0)
        mass = out.image_attention[:, 0].float()
        answer = out.model_top1[:, 0]
        values = {"vgs": _share_in(ids, vocab["visual"]), "cter": _share_in(ids, vocab["number"]),
                  "image_attention": where(out.has_image, mass),
                  "image_attention_ratio": torch.where(sees_image[:, :, None],
                                                       mass / layer_share.clamp_min(1e-12)[:, :, None], nan),
                  "answer_alignment": (ids[..., 0] == answer[:, None, None]).float(),
                  "existence_response": nan.clone(), "_difficulty_crowded": nan.clone(),
                  "_difficulty_uncrowded": nan.clone()}
        if len(existence_ids):
            not_existence_answer = ~torch.isin(answer, existence_ids)
            values["existence_response"] = where(not_existence_answer, torch.isin(ids[..., 0], existence_ids))
        if vocab["difficulty"]:
            n_objects = [object_count(r) for r in records]
            known = any(c is not None for c in n_objects)
            crowded = torch.tensor([(c is not None and c >= large_count) if known else True for c in n_objects])
            uncrowded = torch.tensor([c is not None and c < large_count for c in n_objects])
            says_difficult = _share_in(ids[..., :1], vocab["difficulty"])  # top-1 in the vocabulary: 0 / 1
            values["_difficulty_crowded"] = where(crowded, says_difficult)
            values["_difficulty_uncrowded"] = where(uncrowded, says_difficult)
        bad = (ids < 0).any(-1) & exists  # [batch, L, H]: HeadLens found non-finite head logits
        if bool(bad.any()):
            rows = [start + r for r in bad.any(-1).any(-1).nonzero().flatten().tolist()]
            warn_non_finite("HeadLens", f"head logits of examples {rows[:6]}", model, inputs)
        return {"values": values, "ids": ids, "image_share": torch.where(out.has_image, share, torch.nan)}

    parts = sharding.map(range(0, len(samples), batch_size), run, desc="head scores", progress=progress)
    frequent: dict[tuple[int, int], Counter] = {(layer, head): Counter() for layer in range(L)
                                                for head in range(model.cfg.heads_at(layer))}
    broken = torch.zeros(L, H, dtype=torch.bool)  # heads with non-finite logits on some example
    for part in parts:  # in batch order, as in one process
        ids = part["ids"]
        broken |= (ids < 0).any(-1).any(0) & exists
        for layer in range(L):
            for head in range(model.cfg.heads_at(layer)):
                frequent[(layer, head)].update(i for i in ids[:, layer, head].reshape(-1).tolist() if i >= 0)
    per_example = {name: torch.cat([part["values"][name] for part in parts]) for name in EXAMPLE_VALUES}
    shares = torch.cat([part["image_share"] for part in parts])
    n_examples = int(shares.shape[0])
    scores = scores_from_examples(per_example, non_finite=broken | ~exists)
    common = {key: counter.most_common(n_top_tokens) for key, counter in frequent.items()}
    ids = sorted({i for pairs in common.values() for i, _ in pairs})
    label = dict(zip(ids, str_tokens(model.tokenizer, ids), strict=True))  # readable, as to_str_tokens
    top_tokens = {key: [(label[i], c) for i, c in pairs] for key, pairs in common.items()}
    image_share = float(shares.nanmean()) if bool(shares.isfinite().any()) else None
    return HeadScores(scores=scores, top_tokens=top_tokens, n_examples=n_examples, k=k,
                      vocab_sizes={name: len(ids) for name, ids in vocab.items()}, d_vocab=model.cfg.d_vocab,
                      non_finite=broken, per_example=per_example, image_share=image_share,
                      heads_per_layer=None if model.cfg.uniform_heads else [model.cfg.heads_at(x) for x in range(L)])
