"""The embedded model's training and held-out data: a weighted mix of task-suite sources.

Each source maps a seed to (image, record) with record["task"], ["question"],
["answer"] and, for counting, ["count"]. Training seeds and held-out seeds come from
disjoint ranges, so held-out images are never seen in training. A foreign renderer of
colour, shape, counting, existence and spatial questions (vlens.recipes.embedded.foreign) is held out of every
training stage: its held-out accuracy is the unseen-renderer figure. The second dot renderer
(`counting/dot_variants`, vlens.recipes.embedded.dot_variants) is NOT held out by rule: an
earlier shipped model (v3, six of its seven stages) trained on it, so a stage may use it, and
whether a model saw it is read from its stages' mixes (vlens.recipes.embedded.claims), never
assumed (no stage of the v5 / v6 lineage has it in its mix). `counting/subset` counts a named colour or shape among other objects (SynPoly's
held-out counting fixes the count and so draws no distractors); `counting/groups` does the same beside one
group of another colour or shape, which can outnumber the asked one. Both are evaluated with the rest and
train only where a mix names them. Training images are
redrawn with appearance variety (vlens.recipes.embedded.appearance); held-out images are the
data module's own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
from PIL import Image
from tqdm.auto import tqdm

from vlens.data import LayoutError, make_task_sample
from vlens.data.templates import COUNT_COLOR, COUNT_DOTS, COUNT_SHAPE
from vlens.recipes.embedded.appearance import id_map_of, photometric, redraw
from vlens.recipes.embedded.batches import EncodedExample, encode_example, to_model_image
from vlens.recipes.embedded.dot_variants import render_dot_variant
from vlens.recipes.embedded.foreign import foreign_sample
from vlens.recipes.embedded.image_store import ImageStore
from vlens.recipes.embedded.minimal_pairs import counterpart
from vlens.recipes.embedded.vision_aux import dense_labels
from vlens.utils.errors import UserInputError
from vlens.utils.validation import check_float
from vlens.zoo.processor import CELL, image_size_of

Sample = tuple[Image.Image, dict]
DEFAULT_SIZE = 224  # the data module's default image size: what users and the checks draw
TRAIN_SEED_BASE = 1_000_000  # train seeds: TRAIN_SEED_BASE * (recipe seed + 1) + index
HELD_OUT_SEED_BASE = 900_000_000  # never used for training
# A second held-out range for choosing between models (seeds, mixes, which stage to ship): a choice made on the
# cards' own images would make the shipped card optimistic. Both ranges lie below the probes' (950M).
SELECTION_SEED_BASE = 920_000_000
HELD_OUT_SPLITS = {"card": HELD_OUT_SEED_BASE, "selection": SELECTION_SEED_BASE}


REDRAW_SHARE = 0.7  # training SynDot / SynPoly images redrawn with appearance variety


def _size_for(rng: np.random.Generator) -> int:
    """Image size before the processor's resize: mostly the default, some variety."""
    draw = rng.random()
    if draw < 0.55:
        return DEFAULT_SIZE
    if draw < 0.7:
        return 168
    return int(rng.integers(112, 449))


def _varied_radius(style: str, size: int, rng: np.random.Generator) -> tuple[float, float] | None:
    """Sometimes other object sizes than the style's default (None: the default)."""
    if style == "syndot" and rng.random() < 0.5:  # dots smaller or larger than 2.5%-5.5% of the side
        low = rng.uniform(0.018, 0.04)
        return low * size, low * size * 1.6
    if style == "synpoly" and rng.random() < 0.35:  # polygons from 3% up to 22% of the side
        low = rng.uniform(0.03, 0.09)
        return low * size, min(0.22, low * rng.uniform(1.2, 2.4)) * size
    return None


# Fewest objects a capped (curriculum) task still needs: spatial compares two objects;
# arithmetic needs room for a non-trivial sum and difference.
MIN_OBJECTS = {"spatial": 2, "arithmetic": 3}


def _object_counts(task: str, max_objects: int | None) -> tuple[int, ...]:
    """Allowed object counts of a non-counting task: 1..10, or 1..max_objects (at least the
    task's minimum) in a curriculum stage."""
    if max_objects is None:
        return tuple(range(1, 11))
    return tuple(range(1, max(max_objects, MIN_OBJECTS.get(task, 1)) + 1))


def _task_source(task: str, style: str, vary: bool, max_objects: int | None = None) -> Callable[..., Sample]:
    def make(seed: int, count: int | None = None) -> Sample:
        rng = np.random.default_rng([seed, 7])
        size = _size_for(rng) if vary else DEFAULT_SIZE
        counts: tuple[int, ...]
        if count is not None:
            counts = (count,)
        elif task == "counting":  # counting always spans 1..10: its answers are the counts
            counts = tuple(range(1, 11))
        else:
            counts = _object_counts(task, max_objects)
        radius = _varied_radius(style, size, rng) if vary else None
        return _with_radius(partial(make_task_sample, task, seed, size=size, style=style, counts=counts), radius)

    return make


def _with_radius(draw: Callable[..., Sample], radius: tuple[float, float] | None) -> Sample:
    """`draw(radius=radius)`; at the style's default object sizes when `radius` is None or too crowded."""
    if radius is not None:
        try:
            return draw(radius=radius)
        except LayoutError:  # too crowded for these sizes: the default sizes
            pass
    return draw()


def _dot_variant_source(seed: int, count: int | None = None) -> Sample:
    count = count if count is not None else 1 + seed % 10
    image, centres = render_dot_variant(count, seed)
    return image, {
        "seed": seed,
        "task": "counting",
        "question": COUNT_DOTS,
        "answer": str(count),
        "count": count,
        "centres": centres,
    }


SUBSET_TEMPLATES = (COUNT_COLOR, COUNT_SHAPE)
MAX_SUBSET_OBJECTS = 10  # answer + distractors, except that 10 asked objects still get one distractor


def _subset_source(vary: bool, stream: int = 19, distractor_kinds: int | None = None) -> Callable[..., Sample]:
    """SynPoly counting of a named colour or shape among at least one other object ("How many red
    objects are there?" with objects of other colours): the sub-count that arithmetic needs
    (benchmarks/bench_arithmetic_limits.py). `count` fixes the answer; the distractors stay drawn.
    `stream`: the source's own random stream ([seed, stream]; varied_sample draws [seed, 11]);
    `distractor_kinds`: draw the distractors from that many other colours (shapes) only
    (`make_task_sample`), so that they form groups."""

    def make(seed: int, count: int | None = None) -> Sample:
        rng = np.random.default_rng([seed, stream])
        size = _size_for(rng) if vary else DEFAULT_SIZE
        answer = count if count is not None else int(rng.integers(1, MAX_SUBSET_OBJECTS))
        distractors = int(rng.integers(1, max(1, MAX_SUBSET_OBJECTS - answer) + 1))
        template = SUBSET_TEMPLATES[int(rng.integers(len(SUBSET_TEMPLATES)))]
        radius = _varied_radius("synpoly", size, rng) if vary else None
        return _with_radius(partial(make_task_sample, "counting", seed, size=size, style="synpoly",
                                    counts=(answer,), template=template, distractors=distractors,
                                    distractor_kinds=distractor_kinds), radius)

    return make


def _groups_source(vary: bool) -> Callable[..., Sample]:
    """SynPoly counting of a named colour or shape beside one group of another (all its distractors
    share one colour or shape), which outnumbers the asked ones on about 40% of the images. In SynPoly's
    own counting (and counting/subset) each distractor's colour is drawn alone, so the asked colour is
    nearly always the largest group and "count the largest group" answers it; here it does not
    (benchmarks/bench_count_selection.py: v5 stage 4, trained without it, counted the dominant colour's objects).
    With minimal pairs the same image is also asked the other group's count."""
    return _subset_source(vary, stream=23, distractor_kinds=1)


def source_makers(vary: bool, max_objects: int | None = None) -> dict[str, Callable[..., Sample]]:
    """name -> (seed, count=None) -> (image, record); `count` fixes the object count of
    counting sources. `vary`: training variety of image size and dot radius.
    `max_objects` (a curriculum stage) caps the objects of the non-counting tasks."""
    if max_objects is not None and max_objects < 1:
        raise UserInputError(f"max_objects must be a positive integer or None, got {max_objects}")

    def task(name: str) -> Callable[..., Sample]:
        return _task_source(name, "synpoly", vary, max_objects)

    return {
        "counting/syndot": _task_source("counting", "syndot", vary),
        "counting/dot_variants": _dot_variant_source,
        "counting/synpoly": _task_source("counting", "synpoly", vary),
        "counting/synreal": _task_source("counting", "synreal", vary),
        **{name: task(name) for name in ("colour", "shape", "spatial", "arithmetic", "existence")},
        **{f"foreign/{name}": _foreign_source(name) for name in ("counting", "colour", "shape")},
        # last: a source's held-out seeds follow its place in this order (held_out_samples)
        "counting/subset": _subset_source(vary),
        "counting/groups": _groups_source(vary),
        # added after the others so that their held-out seeds stay what the shipped cards measured
        **{f"foreign/{name}": _foreign_source(name) for name in ("existence", "spatial")},
    }


def _foreign_source(task: str) -> Callable[..., Sample]:
    def make(seed: int, count: int | None = None) -> Sample:
        if count is not None and task == "counting":
            seed = seed - seed % 10 + (count - 1)  # foreign_sample counts 1 + seed % 10
        return foreign_sample(task, seed)

    return make


# Sources no training stage may use: their held-out accuracy measures unseen renderers.
# (counting/dot_variants is not among them: the v3 model's stages trained on it.)
HELD_OUT_ONLY: tuple[str, ...] = (
    "foreign/counting",
    "foreign/colour",
    "foreign/shape",
    "foreign/existence",
    "foreign/spatial",
)

# Every source a stage's --mix may name: the default mix's and the second dot renderer.
TRAINABLE_SOURCES: tuple[str, ...] = (
    "counting/syndot",
    "counting/dot_variants",
    "counting/synpoly",
    "counting/synreal",
    "colour",
    "shape",
    "spatial",
    "arithmetic",
    "existence",
    "counting/subset",
    "counting/groups",
)

# Share of each source in the training set (the default mix of a language stage).
TRAINING_MIX: dict[str, float] = {
    "counting/syndot": 0.16,
    "counting/synpoly": 0.16,
    "counting/synreal": 0.04,
    "colour": 0.13,
    "shape": 0.13,
    "spatial": 0.13,
    "arithmetic": 0.13,
    "existence": 0.12,
}


@dataclass(frozen=True)
class PairOptions:
    """Which training samples get a minimal-pair partner (vlens.recipes.embedded.minimal_pairs)."""

    binding: bool = False  # existence, spatial, colour, shape and counting among distractors
    arithmetic: bool = False  # with binding: arithmetic too, asked with the other operation

    def __post_init__(self) -> None:
        if self.arithmetic and not self.binding:
            raise UserInputError("arithmetic pairs are added to the binding pairs: set binding=True too")


@dataclass
class RenderedSet:
    """Pre-rendered examples: the images at the model's input size (PNG-compressed; index
    them like a uint8 tensor [n, H, W, 3]), their encoded token sequences, and per image the
    dense (shape, colour, centre-count) label of each merged-token cell [n, 3, cells]
    (vlens.recipes.embedded.vision_aux)."""

    images: ImageStore
    examples: list[EncodedExample]
    sources: list[str]
    cell_labels: torch.Tensor
    # example index -> its minimal-pair partner's index (same image, other noun), or None;
    # None for the whole set when it was rendered without minimal pairs
    partners: list[int | None] | None = None

    def to_plain(self) -> dict:
        """Plain data (tensors, numbers, strings, lists, dicts) that `torch.load(weights_only=True)` reads back."""
        return {
            "image_size": self.images.size,
            "images": self.images.to_tensors(),
            "examples": [[e.input_ids, e.labels, e.image_index] for e in self.examples],
            "sources": list(self.sources),
            "cell_labels": self.cell_labels,
            "partners": [-1 if p is None else p for p in self.partners] if self.partners is not None else None,
        }

    @classmethod
    def from_plain(cls, data: dict) -> RenderedSet:
        """The set `to_plain` wrote (KeyError / TypeError / ValueError on anything else)."""
        return cls(
            ImageStore.from_tensors(int(data["image_size"]), data["images"]),
            [EncodedExample(list(ids), list(labels), int(index)) for ids, labels, index in data["examples"]],
            [str(source) for source in data["sources"]],
            data["cell_labels"],
            None if data.get("partners") is None else [None if p < 0 else int(p) for p in data["partners"]],
        )


def parse_mix(text: str) -> dict[str, float]:
    """ "colour=0.2,shape=0.2" -> {"colour": 0.2, "shape": 0.2}; unknown sources are an error."""
    mix = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, weight = item.partition("=")
        if name in HELD_OUT_ONLY:
            raise UserInputError(
                f"--mix: {name} is held out of every training stage (the unseen-renderer figure)"
            )
        if name not in TRAINABLE_SOURCES or not weight:
            raise UserInputError(
                f"--mix: bad entry {item!r}: use source=weight with sources {sorted(TRAINABLE_SOURCES)}"
            )
        mix[name] = float(weight)
    if not mix or min(mix.values()) < 0 or sum(mix.values()) <= 0:
        raise UserInputError(f"--mix {text!r} needs non-negative weights with a positive sum")
    return mix


def training_sources(
    n_examples: int, seed: int, mix: dict[str, float] | None = None
) -> list[tuple[str, int]]:
    """(source, sample seed) for each training example, deterministic in `seed`; `mix`
    (default TRAINING_MIX) gives each source's relative weight."""
    mix = mix or TRAINING_MIX
    held_out = sorted(set(mix) & set(HELD_OUT_ONLY))
    if held_out:
        raise UserInputError(f"{held_out} are held out of every training stage")
    rng = np.random.default_rng(seed)
    names = list(mix)
    weights = np.array([mix[name] for name in names])
    picks = rng.choice(len(names), size=n_examples, p=weights / weights.sum())
    base = TRAIN_SEED_BASE * (seed + 1)
    return [(names[pick], base + index) for index, pick in enumerate(picks)]


def render_training_set(
    processor,
    n_examples: int,
    seed: int,
    progress: bool = True,
    mix: dict[str, float] | None = None,
    max_objects: int | None = None,
    minimal_pairs: bool | PairOptions = False,
    question_first: float = 0.0,
) -> RenderedSet:
    """Render and encode `n_examples` training examples once (images kept as uint8);
    `max_objects` caps the non-counting tasks' objects (see :func:`source_makers`).
    `minimal_pairs`: every binding sample (existence, spatial, colour, shape) with a
    counterpart also gets it as a second example on the same image
    (vlens.recipes.embedded.minimal_pairs), recorded in `partners`.
    `question_first` (a probability P in [0, 1]): each sample puts its question before the image
    with probability P (:func:`asks_question_first`, fixed by its seed); a minimal-pair partner
    keeps its sample's order. P = 0 encodes exactly what the recipe did before the option.
    `minimal_pairs=PairOptions(arithmetic=True)`: arithmetic samples are paired too, with the other
    operation about the same two colours (`counterpart(..., arithmetic=True)`)."""
    if n_examples < 1:
        raise UserInputError(f"n_examples must be positive, got {n_examples}")
    question_first = check_float(question_first, "question_first", min=0, max=1)
    pairing = minimal_pairs if isinstance(minimal_pairs, PairOptions) else PairOptions(binding=bool(minimal_pairs))
    makers = source_makers(vary=True, max_objects=max_objects)
    size = image_size_of(processor)
    images, examples, sources, labels = ImageStore(size), [], [], []
    partners: list[int | None] = []
    for index, (name, sample_seed) in enumerate(
        tqdm(training_sources(n_examples, seed, mix), desc="render training set", disable=not progress)
    ):
        image, id_map, record = varied_sample(makers[name], sample_seed)
        images.append(to_model_image(image, size))
        first = asks_question_first(sample_seed, question_first)
        examples.append(encode_example(processor, record["question"], record["answer"], index, first))
        sources.append(name)
        labels.append(dense_labels(id_map, record["objects"], size // CELL))
        partners.append(None)
        pair = (counterpart(record, np.random.default_rng([sample_seed, 13]), arithmetic=pairing.arithmetic)
                if pairing.binding else None)
        if pair is not None:
            row = len(examples) - 1
            examples.append(encode_example(processor, pair[0], pair[1], index, first))  # the same order
            sources.append(name)
            partners[row] = row + 1
            partners.append(row)
    return RenderedSet(
        images, examples, sources, torch.from_numpy(np.stack(labels)), partners if pairing.binding else None
    )


def asks_question_first(sample_seed: int, probability: float) -> bool:
    """Whether the training sample of `sample_seed` puts its question before the image: a draw
    of its own stream (no other draw of the sample moves), true with `probability`; never at 0,
    always at 1."""
    if probability <= 0:
        return False
    return bool(np.random.default_rng([sample_seed, 17]).random() < probability)


def varied_sample(make: Callable[..., Sample], seed: int) -> tuple[Image.Image, np.ndarray, dict]:
    """A training sample with appearance variety: (image, id map, record). SynDot and
    SynPoly scenes are mostly redrawn (`appearance.redraw`); every image may get blur,
    grain or JPEG."""
    image, record = make(seed)
    rng = np.random.default_rng([seed, 11])
    if record.get("style") in ("syndot", "synpoly") and rng.random() < REDRAW_SHARE:
        image, id_map = redraw(record, rng)
    else:
        id_map = id_map_of(record)
    return photometric(image.convert("RGB"), rng), id_map, record


def held_out_samples(
    per_source: int, sources: list[str] | None = None, split: str = "card"
) -> list[tuple[Image.Image, dict]]:
    """`per_source` held-out samples per source (default size, unseen seeds); counting
    sources cycle through counts 1..10 evenly. Records get a "source" key.

    A source's samples are the same whichever other sources are asked for: its seeds follow its
    place among all sources (the order of `source_makers`), so a subset is a slice of the full
    evaluation that model cards report. `split` "selection" draws from a second held-out range, for
    choosing between models without touching the images their cards report ("card")."""
    makers = source_makers(vary=False)
    order = list(makers)
    unknown = [name for name in sources or [] if name not in makers]
    if unknown:
        raise UserInputError(f"unknown held-out source(s) {unknown}; choose from {order}")
    if split not in HELD_OUT_SPLITS:
        raise UserInputError(f"unknown held-out split {split!r}; choose from {sorted(HELD_OUT_SPLITS)}")
    if not 0 <= per_source < 1_000_000:
        raise UserInputError(f"per_source must be between 0 and 999,999 (each source's seed range), got {per_source}")
    samples = []
    for name in sources or order:
        source_index = order.index(name)
        for index in range(per_source):
            sample_seed = HELD_OUT_SPLITS[split] + 1_000_000 * source_index + index
            count = 1 + index % 10 if name.startswith("counting/") else None
            image, record = makers[name](sample_seed, count)
            samples.append((image, {**record, "source": name}))
    return samples
