"""Where the embedded model's attribute binding stalls: the experiments behind RESULTS.md's
"Embedded model: why attribute binding is slow to learn".

    python benchmarks/bench_vision_shape.py capped FOLDER [--n 30]
        held-out accuracy of colour/shape/existence/spatial/arithmetic with at most 1, 2, 3
        objects and uncapped (greedy generation, exact match)
    python benchmarks/bench_vision_shape.py probe FOLDER
        linear probe (scikit-learn logistic regression; pip install scikit-learn) for the
        shape and colour of a lone object from the merged image tokens
    python benchmarks/bench_vision_shape.py centre-probe FOLDER
        the recipe's probe (vlens.recipes.embedded.probe, what every model card reports): shape
        and colour of each object from the merged token at its centre, held-out SynPoly scenes
        with 1-6 objects, torch softmax regression (no scikit-learn)
    python benchmarks/bench_vision_shape.py count-probe FOLDER [--n 300] [--n-fit 3000] [--image-size 224]
                                                          [--save FILE.json] [--against OTHER.json]
        how far the frozen tower's tokens carry SynPoly's count: a linear centre-count probe per
        merged token (0, 1, 2, 3+ object centres in its cell, the vision stage's own dense label),
        fitted on training-style SynPoly images, its per-image count (the sum over cells) scored on
        the card's held-out SynPoly images beside the model's own answers, per count band; --save
        keeps each image's 0 / 1, --against pairs them with another run's saved file (exact McNemar)
    python benchmarks/bench_vision_shape.py supervise FOLDER [--steps 600] [--image-size 168]
        train the vision tower alone (plus a linear head on soft-max-pooled image tokens)
        on single-object shape labels; held-out accuracy every 100 steps

All run on one torch thread; FOLDER is a model folder `vlens zoo train` wrote.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from transformers import Qwen2_5_VLForConditionalGeneration

from vlens.data.palette import OBJECT_COLORS, SHAPES
from vlens.flow import mcnemar_exact
from vlens.recipes.embedded.batches import patchify, to_model_image
from vlens.recipes.embedded.evaluate import answer_questions, evaluate_samples, is_correct
from vlens.recipes.embedded.probe import fit_softmax_regression, probe_tower
from vlens.recipes.embedded.train import image_tokens
from vlens.recipes.embedded.training_set import HELD_OUT_SEED_BASE, held_out_samples, source_makers
from vlens.recipes.embedded.vision_aux import MAX_CENTRES, centre_counts
from vlens.zoo.processor import CELL, image_size_of, load_processor

CAPPED_TASKS = ("colour", "shape", "existence", "spatial", "arithmetic")


def capped(folder: str, n: int) -> None:
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder).eval()
    processor = load_processor(folder)
    for cap in (1, 2, 3, None):
        makers = source_makers(False, cap)
        samples = []
        for task in CAPPED_TASKS:
            for i in range(n):
                image, record = makers[task](HELD_OUT_SEED_BASE + 77_000_000 + i)
                samples.append((image, {**record, "source": task}))
        report = evaluate_samples(model, processor, samples)
        print(cap, {task: round(row["accuracy"], 2) for task, row in report["per_task"].items()}, flush=True)


def _single_object_images(
    n: int, seed_base: int, size: int, vary: bool
) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """uint8 images [n, size, size, 3] of one object each, with shape and colour class ids
    (`vary`: the training variety of drawn image sizes)."""
    makers = source_makers(vary, 1)
    images, shapes, colours = [], [], []
    for i in range(n):
        image, record = makers["shape"](seed_base + i)
        obj = record["objects"][0]
        images.append(to_model_image(image, size))
        shapes.append(SHAPES.index(obj["shape"]))
        colours.append(OBJECT_COLORS.index(obj["color"]))
    return torch.from_numpy(np.stack(images)), np.array(shapes), np.array(colours)


def _image_tokens(vision, images: torch.Tensor) -> torch.Tensor:
    """Merged image tokens [n_images, cells, width]."""
    pixel_values, grid_thw = patchify(images)
    tokens = vision(pixel_values, grid_thw=grid_thw).pooler_output
    return tokens.view(len(images), -1, tokens.shape[-1])


def probe(folder: str) -> None:
    try:
        from sklearn.linear_model import LogisticRegression
        from sklearn.metrics import confusion_matrix
    except ImportError:
        raise SystemExit("the probe needs scikit-learn: pip install scikit-learn") from None
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder).eval()
    size = image_size_of(load_processor(folder))
    images, shapes, colours = _single_object_images(1500, 123_000_000, size, vary=False)
    features = []
    with torch.no_grad():
        for start in range(0, len(images), 100):
            tokens = _image_tokens(model.model.visual, images[start : start + 100])
            # the two tokens farthest from the image's median token (the object), and the mean
            farthest = (
                (tokens - tokens.median(dim=1, keepdim=True).values).norm(dim=-1).topk(2, dim=1).indices
            )
            rows = torch.arange(len(tokens))
            features.append(
                torch.cat([tokens[rows, farthest[:, 0]], tokens[rows, farthest[:, 1]], tokens.mean(1)], -1)
            )
    features = torch.cat(features).numpy()
    for name, target in (("shape", shapes), ("colour", colours)):
        classifier = LogisticRegression(max_iter=3000).fit(features[:1200], target[:1200])
        print(name, "probe accuracy", classifier.score(features[1200:], target[1200:]))
        print(confusion_matrix(target[1200:], classifier.predict(features[1200:])))


def supervise(folder: str, steps: int, size: int) -> None:
    vision = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder).model.visual.train()
    start = time.time()
    train_images, train_shapes, _ = _single_object_images(6000, 40_000_000, size, vary=True)
    test_images, test_shapes, _ = _single_object_images(600, 41_000_000, size, vary=True)
    train_shapes, test_shapes = torch.from_numpy(train_shapes), torch.from_numpy(test_shapes)
    torch.manual_seed(0)  # the head's initialisation
    head = torch.nn.Linear(vision.config.out_hidden_size, len(SHAPES))
    optimizer = torch.optim.AdamW([*vision.parameters(), *head.parameters()], lr=1e-3)

    def logits(images: torch.Tensor) -> torch.Tensor:
        return head(_image_tokens(vision, images)).logsumexp(1)  # soft max-pool over the cells

    generator = torch.Generator().manual_seed(0)
    print(f"{size} px: {(size // CELL) ** 2} image tokens", flush=True)
    for step in range(steps + 1):
        if step % 100 == 0:
            vision.eval()
            with torch.no_grad():
                predicted = torch.cat(
                    [logits(test_images[i : i + 100]).argmax(-1) for i in range(0, 600, 100)]
                )
            vision.train()
            accuracy = (predicted == test_shapes).float().mean().item()
            print(step, round(time.time() - start), "test accuracy", accuracy, flush=True)
        rows = torch.randint(len(train_images), (64,), generator=generator)
        loss = torch.nn.functional.cross_entropy(logits(train_images[rows]), train_shapes[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


COUNT_PROBE_SEED_BASE = 124_000_000  # fit images: SynPoly's training variety, seeds no stage or held-out set uses
BANDS = ((1, 1), (2, 4), (5, 7), (8, 10))


def _synpoly(samples: list, size: int) -> tuple[torch.Tensor, np.ndarray]:
    grid = size // CELL
    images = torch.from_numpy(np.stack([to_model_image(image, size) for image, _ in samples]))
    cells = np.stack([centre_counts(record["objects"], image.size[0], grid) for image, record in samples])
    return images, cells


def count_probe(folder: str, n: int, n_fit: int, size: int | None, save: str | None = None,
                against: str | None = None) -> None:
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder).eval()
    processor = load_processor(folder)
    size = size or image_size_of(processor)
    make = source_makers(vary=True)["counting/synpoly"]
    fit = [make(COUNT_PROBE_SEED_BASE + i, 1 + i % 10) for i in range(n_fit)]
    test = held_out_samples(n, ["counting/synpoly"])
    fit_images, fit_cells = _synpoly(fit, size)
    test_images, test_cells = _synpoly(test, size)
    with torch.no_grad():
        fit_x, test_x = image_tokens(model, fit_images), image_tokens(model, test_images)
    width = fit_x.shape[-1]
    labels = torch.from_numpy(np.minimum(fit_cells, MAX_CENTRES)).reshape(-1)
    predict = fit_softmax_regression(fit_x.reshape(-1, width), labels, n_classes=MAX_CENTRES + 1)
    with torch.no_grad():
        per_cell = predict(test_x.reshape(-1, width)).argmax(-1).view(len(test), -1)
    probe_count = per_cell.sum(1).numpy()
    truth = np.array([len(record["objects"]) for _, record in test])  # held-out SynPoly: every object is asked for
    probe_right = probe_count == truth
    cell_right = (per_cell.numpy() == np.minimum(test_cells, MAX_CENTRES)).mean()
    if size == image_size_of(processor):  # the model's own answers on the same images, at its own size
        answers = answer_questions(model, processor, [image for image, _ in test], [r["question"] for _, r in test])
        model_right = np.array([is_correct(a, record) for a, (_, record) in zip(answers, test, strict=True)])
    else:
        model_right = None
    crowded = (test_cells >= 2).any(1)
    print(f"{folder} at {size} px ({(size // CELL) ** 2} image tokens); probe fitted on {n_fit} SynPoly images, "
          f"scored on the card's first {n} held-out SynPoly images")
    print(f"cell accuracy {cell_right:.4f}; count from the probe {probe_right.mean():.3f}"
          + ("" if model_right is None else f"; the model's answers {model_right.mean():.3f}"))
    print(f"images with two or more centres in one cell: {int(crowded.sum())} of {len(test)} (the probe right on "
          f"{int(probe_right[crowded].sum())} of them, on {probe_right[~crowded].mean():.3f} of the others)")
    for low, high in BANDS:
        band = (truth >= low) & (truth <= high)
        line = f"count {low}-{high} (n {band.sum()}): probe {probe_right[band].mean():.3f}"
        if model_right is not None:
            line += f", model {model_right[band].mean():.3f}"
        print(line)
    if model_right is not None:
        both = int((probe_right & model_right).sum())
        print(f"both right {both}, only the probe {int((probe_right & ~model_right).sum())}, only the model "
              f"{int((~probe_right & model_right).sum())}, neither {int((~probe_right & ~model_right).sum())}")
        misses = probe_count[~probe_right] - truth[~probe_right]
        print(f"probe misses: {int((misses < 0).sum())} too few, {int((misses > 0).sum())} too many")
    saved = {"folder": folder, "image_size": size, "n_fit": n_fit, "probe_right": probe_right.astype(int).tolist(),
             "model_right": None if model_right is None else model_right.astype(int).tolist()}
    if save:
        Path(save).write_text(json.dumps(saved), encoding="utf-8")
    if against:
        other = json.loads(Path(against).read_text(encoding="utf-8"))
        if len(other["probe_right"]) != n:
            raise SystemExit(f"{against} holds {len(other['probe_right'])} images, this run {n}: pass the same --n")
        paired = mcnemar_exact(other["probe_right"], saved["probe_right"])
        print(f"against {other['folder']} at {other['image_size']} px: probe {np.mean(other['probe_right']):.3f} -> "
              f"{probe_right.mean():.3f}; only the other right {paired['a_only']}, only this {paired['b_only']}, "
              f"McNemar p {paired['p']:.3g}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("experiment", choices=["capped", "probe", "centre-probe", "count-probe", "supervise"])
    parser.add_argument("folder", help="a model folder written by `vlens zoo train`")
    parser.add_argument("--n", type=int, default=None,
                        help="capped: samples per task and cap (default 30); count-probe: held-out images (default 300)")
    parser.add_argument("--n-fit", type=int, default=3000, help="count-probe: SynPoly images to fit the probe on")
    parser.add_argument("--save", help="count-probe: write each image's 0 / 1 (probe, model) to this JSON file")
    parser.add_argument("--against", help="count-probe: a file --save wrote, paired with this run (exact McNemar)")
    parser.add_argument("--steps", type=int, default=600, help="supervise: training steps of batch 64")
    parser.add_argument("--image-size", type=int, default=None,
                        help="supervise: input size in px, a multiple of 28 (default 168); count-probe: the size the "
                             "tower reads (default the folder's own)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.experiment == "capped":
        capped(args.folder, args.n or 30)
    elif args.experiment == "probe":
        probe(args.folder)
    elif args.experiment == "centre-probe":
        model = Qwen2_5_VLForConditionalGeneration.from_pretrained(args.folder).eval()
        print(probe_tower(model, load_processor(args.folder)))
    elif args.experiment == "count-probe":
        count_probe(args.folder, args.n or 300, args.n_fit, args.image_size, args.save, args.against)
    else:
        supervise(args.folder, args.steps, args.image_size or 168)


if __name__ == "__main__":
    main()
