"""Per-head scores over a dataset, from HeadLens top-k tokens and attention patterns.

For each head (all at the chosen position, default the final prompt position; k = 10):

- ``vgs``  visual grounding score: mean share of the top-k tokens in the "visual" vocabulary
  (colours, shapes, edges, sizes).
- ``cter`` counting-token emergence rate: mean share of the top-k tokens in the "number" vocabulary.
- ``image_attention``: mean attention mass from the position onto image tokens (rows with an image).
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
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from jaxtyping import Float
from torch import Tensor

from vlens.core.token_labels import str_tokens
from vlens.lens.corpus import Sample, prepare_batch
from vlens.lens.headlens import HeadLens
from vlens.lens.vocabularies import vocabulary_token_ids
from vlens.parallel import Sharding
from vlens.utils.finite import warn_non_finite
from vlens.utils.results import Result
from vlens.viz.figures import layer_head_heatmap

SCORE_NAMES: tuple[str, ...] = (
    "vgs", "cter", "image_attention", "answer_alignment", "existence_response", "difficulty_response",
)
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
            raise ValueError(f"score must be one of {sorted(self.scores)}, got {score!r}")
        return layer_head_heatmap(self.scores[score].float(), title=title or f"{score} per head (k={self.k})",
                                  value_label=score)

    def to_dict(self) -> dict:
        return {
            "n_examples": self.n_examples, "k": self.k, "vocab_sizes": self.vocab_sizes, "d_vocab": self.d_vocab,
            "heads": [{"layer": layer, "head": head, "scores": self.head(layer, head),
                       "non_finite": self.head_non_finite(layer, head),
                       "top_tokens": [[t, c] for t, c in self.top_tokens.get((layer, head), [])]}
                      for layer, head in self.head_keys()],
            **({"heads_per_layer": self.heads_per_layer} if self.heads_per_layer else {}),
        }


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
    model,
    samples: Sequence[Sample],
    lens: HeadLens | None = None,
    k: int = 10,
    batch_size: int = 8,
    vocabularies: Mapping[str, Iterable[str]] | None = None,
    large_count: int = DEFAULT_LARGE_COUNT,
    n_top_tokens: int = 10,
    progress: bool = True,
    sharding: Sharding | None = None,
) -> HeadScores:
    """Run HeadLens at the final position over `samples` and score every head (see module docstring).

    sharding: split the batches across processes (`vlens.parallel`); each batch's sums are added
    in batch order, as in one process, and every process returns the full scores.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    lens = lens or HeadLens(model)
    sharding = sharding or Sharding()
    vocab = vocabulary_token_ids(model.tokenizer, vocabularies)
    for needed in ("visual", "number", "existence", "difficulty"):
        vocab.setdefault(needed, set())
    L, H = model.cfg.n_layers, model.cfg.max_heads
    # cells beyond a layer's own heads (hybrid decoders): HeadLens leaves them empty (-1 / NaN)
    exists = torch.tensor([[head < model.cfg.heads_at(layer) for head in range(H)] for layer in range(L)])
    accumulators = [*SCORE_NAMES, "_difficulty_crowded", "_difficulty_uncrowded"]
    existence_ids = torch.tensor(sorted(vocab["existence"])) if vocab["existence"] else torch.empty(0, dtype=torch.long)

    def run(start: int) -> dict:
        """One batch's sums and counts per accumulator ([L, H] each) and its top-k ids [batch, L, H]."""
        inputs, records = prepare_batch(model, samples[start:start + batch_size])
        out = lens.run(inputs, positions="final", k=k)
        ids = out.top_ids[:, 0]  # [batch, L, H, k]
        if out.image_attention is None:
            raise RuntimeError("HeadLens.run returned no image attention")
        part: dict = {"sums": {}, "counts": {}}

        def add(name: str, values: Tensor, rows: Tensor) -> None:
            """values [batch, L, H] for the rows that count ([batch] bool)."""
            part["sums"][name] = values[rows].sum(0)
            part["counts"][name] = rows.sum()

        everyone = torch.ones(ids.shape[0], dtype=torch.bool)
        add("vgs", _share_in(ids, vocab["visual"]), everyone)
        add("cter", _share_in(ids, vocab["number"]), everyone)
        add("image_attention", out.image_attention[:, 0], out.has_image)
        answer = out.model_top1[:, 0]
        add("answer_alignment", (ids[..., 0] == answer[:, None, None]).float(), everyone)
        if len(existence_ids):
            not_existence_answer = ~torch.isin(answer, existence_ids)
            add("existence_response", torch.isin(ids[..., 0], existence_ids).float(), not_existence_answer)
        if vocab["difficulty"]:
            n_objects = [object_count(r) for r in records]
            known = any(c is not None for c in n_objects)
            crowded = torch.tensor([(c is not None and c >= large_count) if known else True for c in n_objects])
            uncrowded = torch.tensor([c is not None and c < large_count for c in n_objects])
            says_difficult = _share_in(ids[..., :1], vocab["difficulty"])  # top-1 in the vocabulary: 0 / 1
            add("_difficulty_crowded", says_difficult, crowded)
            add("_difficulty_uncrowded", says_difficult, uncrowded)
        part["ids"] = ids
        bad = (ids < 0).any(-1) & exists  # [batch, L, H]: HeadLens found non-finite head logits
        if bool(bad.any()):
            rows = [start + r for r in bad.any(-1).any(-1).nonzero().flatten().tolist()]
            warn_non_finite("HeadLens", f"head logits of examples {rows[:6]}", model, inputs)
        return part

    parts = sharding.map(range(0, len(samples), batch_size), run, desc="head scores", progress=progress)
    sums = {name: torch.zeros(L, H) for name in accumulators}
    counts = {name: torch.zeros(L, H) for name in accumulators}
    frequent: dict[tuple[int, int], Counter] = {(layer, head): Counter() for layer in range(L)
                                                for head in range(model.cfg.heads_at(layer))}
    n_examples = 0
    broken = torch.zeros(L, H, dtype=torch.bool)  # heads with non-finite logits on some example
    for part in parts:  # in batch order: the same float sums as one process
        for name, value in part["sums"].items():
            sums[name] += value
            counts[name] += part["counts"][name]
        ids = part["ids"]
        broken |= (ids < 0).any(-1).any(0) & exists
        for layer in range(L):
            for head in range(model.cfg.heads_at(layer)):
                frequent[(layer, head)].update(i for i in ids[:, layer, head].reshape(-1).tolist() if i >= 0)
        n_examples += ids.shape[0]

    means = {name: torch.where(counts[name] > 0, sums[name] / counts[name].clamp(min=1), torch.nan)
             for name in accumulators}
    crowded, uncrowded = means.pop("_difficulty_crowded"), means.pop("_difficulty_uncrowded")
    means["difficulty_response"] = torch.where(counts["_difficulty_uncrowded"] > 0, crowded - uncrowded, crowded)
    scores = {name: means[name].masked_fill(broken | ~exists, torch.nan) for name in SCORE_NAMES}
    common = {key: counter.most_common(n_top_tokens) for key, counter in frequent.items()}
    ids = sorted({i for pairs in common.values() for i, _ in pairs})
    label = dict(zip(ids, str_tokens(model.tokenizer, ids), strict=True))  # readable, as to_str_tokens
    top_tokens = {key: [(label[i], c) for i, c in pairs] for key, pairs in common.items()}
    return HeadScores(scores=scores, top_tokens=top_tokens, n_examples=n_examples, k=k,
                      vocab_sizes={name: len(ids) for name, ids in vocab.items()}, d_vocab=model.cfg.d_vocab,
                      non_finite=broken,
                      heads_per_layer=None if model.cfg.uniform_heads else [model.cfg.heads_at(x) for x in range(L)])
