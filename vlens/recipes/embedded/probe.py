"""Linear probes of the vision tower: what a frozen tower's image tokens say about objects.

For each object of held-out SynPoly scenes (1-6 objects, the data module's renderer, 224 px,
seeds no training stage uses), the feature is the merged image token of the cell that holds
the object's centre. A multinomial logistic regression (torch, full-batch L-BFGS, a small L2
penalty) is fitted on the objects of two thirds of the scenes and scored on the rest: accuracy for the object's shape (6 classes, chance 1/6) and colour (6
classes). Scenes: PROBE_SCENES, two thirds to fit and one third to score. The recipe measures this after every stage, so the card shows what each stage did
to the tower.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from jaxtyping import Float, Int

from vlens.data import make_task_sample
from vlens.data.palette import OBJECT_COLORS, SHAPES
from vlens.recipes.embedded.batches import to_model_image
from vlens.recipes.embedded.train import image_tokens
from vlens.utils.errors import UserInputError
from vlens.zoo.processor import CELL, image_size_of

PROBE_SEED_BASE = 950_000_000  # disjoint from training and held-out seeds
PROBE_SCENES = 600  # two thirds to fit the probe, one third to score it
PROBE_SIZE = 224


def probe_objects(n_scenes: int, seed_base: int, model_size: int) -> tuple[torch.Tensor, list[tuple]]:
    """Images at the model's size [n_scenes, size, size, 3] and per object (scene, cell,
    shape id, colour id)."""
    grid = model_size // CELL
    images, objects = [], []
    for scene in range(n_scenes):
        seed = seed_base + scene
        image, record = make_task_sample(
            "counting",
            seed,
            size=PROBE_SIZE,
            style="synpoly",
            counts=range(1, 7),
            template="How many objects are there?",
        )
        images.append(to_model_image(image, model_size))
        for obj in record["objects"]:
            x, y = obj["center"]
            cell = min(grid - 1, int(y * grid // PROBE_SIZE)) * grid + min(
                grid - 1, int(x * grid // PROBE_SIZE)
            )
            objects.append((scene, cell, SHAPES.index(obj["shape"]), OBJECT_COLORS.index(obj["color"])))
    return torch.from_numpy(np.stack(images)), objects


def fit_softmax_regression(
    train_x: Float[torch.Tensor, "n features"], train_y: Int[torch.Tensor, " n"], l2: float = 1e-3,
    n_classes: int | None = None,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """A multinomial logistic regression on standardised features (full-batch L-BFGS, L2
    penalty `l2`); returns a function from features [m, features] to logits [m, classes]."""
    mean, std = train_x.mean(0), train_x.std(0) + 1e-6
    standard = (train_x - mean) / std
    n_classes = n_classes or int(train_y.max()) + 1
    weight = torch.zeros(train_x.shape[1], n_classes, requires_grad=True)
    bias = torch.zeros(n_classes, requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], max_iter=300, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(standard @ weight + bias, train_y) + l2 * weight.square().sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(closure)
    weight, bias = weight.detach(), bias.detach()
    return lambda x: ((x - mean) / std) @ weight + bias


def fit_linear_probe(
    train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor, l2: float = 1e-3
) -> float:
    """Test accuracy of a softmax regression fitted on standardised features."""
    n_classes = int(max(train_y.max(), test_y.max())) + 1
    predict = fit_softmax_regression(train_x, train_y, l2, n_classes)
    with torch.no_grad():
        return (predict(test_x).argmax(-1) == test_y).float().mean().item()


def probe_tower(model, processor, n_scenes: int = PROBE_SCENES) -> dict:
    """{"shape": accuracy, "colour": accuracy, "n_train": objects, "n_test": objects} of
    linear probes on the frozen tower of `model` (an HF Qwen2/2.5-VL), from `n_scenes`
    held-out scenes (at least 3)."""
    if n_scenes < 3:
        raise UserInputError(f"the probe needs at least 3 scenes (2 to fit, 1 to score), got {n_scenes}")
    size = image_size_of(processor)
    n_fit = (2 * n_scenes) // 3
    splits = []
    for count, base in ((n_fit, PROBE_SEED_BASE), (n_scenes - n_fit, PROBE_SEED_BASE + 100_000)):
        images, objects = probe_objects(count, base, size)
        tokens = image_tokens(model, images)
        index = torch.tensor([(scene, cell) for scene, cell, _, _ in objects])
        features = tokens[index[:, 0], index[:, 1]]
        splits.append(
            (features, torch.tensor([o[2] for o in objects]), torch.tensor([o[3] for o in objects]))
        )
    (train_x, train_shape, train_colour), (test_x, test_shape, test_colour) = splits
    return {  # fit_softmax_regression turns gradients on for its fit, whatever the caller's mode
        "shape": round(fit_linear_probe(train_x, train_shape, test_x, test_shape), 4),
        "colour": round(fit_linear_probe(train_x, train_colour, test_x, test_colour), 4),
        "n_train": len(train_x),
        "n_test": len(test_x),
    }
