"""``vlens data {syndot,synpoly,synreal,pairs,tasks}``: write synthetic imagefolders.

Example: ``vlens data pairs --n 500 --seed 0 --out data/pairs --counts 1-10 --workers 2``
"""

from __future__ import annotations

import argparse
import logging
import math
import time

from vlens.cli.options import add_image_size
from vlens.utils.errors import UserInputError
from vlens.utils.validation import arg_float, arg_int, arg_path

logger = logging.getLogger(__name__)

# the data layer's names, spelled out so that building this parser imports no numpy
# (tests/cli/test_conventions.py checks them against vlens.data)
TASKS = ("counting", "colour", "shape", "spatial", "arithmetic", "existence")
STYLES = ("syndot", "synpoly", "synreal")
PAIR_KINDS = ("count", "move", "colour")
POLY_BACKGROUNDS = ("white", "tint", "gradient")
REAL_BACKGROUNDS = ("noise", "gradient_noise", "stripes")
DEFAULT_IMAGE_SIZE = 224
MAX_SAMPLES = 10_000_000  # vlens.data.generate.MAX_SAMPLES


def parse_int_list(text: str) -> tuple[int, ...]:
    """ "1-10" -> (1, ..., 10); "1,3,5" -> (1, 3, 5); "4" -> (4,)."""
    values: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            values.extend(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like '1-10' or '1,3,5', got {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected non-negative integers like '1-10', got {text!r}")
    return tuple(sorted(set(values)))


def parse_radius(text: str) -> float | tuple[float, float]:
    """ "6" -> 6.0; "4-12" -> (4.0, 12.0) pixels."""
    values: tuple[float, ...]
    try:
        lo, _, hi = text.partition("-")
        values = (float(lo), float(hi)) if hi else (float(lo),)
    except ValueError:
        values = ()
    if not values or not all(math.isfinite(v) and v > 0 for v in values) or values[0] > values[-1]:
        raise argparse.ArgumentTypeError(
            f"expected a positive radius like '6' or '4-12' (pixels), got {text!r}"
        ) from None
    return (values[0], values[1]) if len(values) == 2 else values[0]


def parse_tasks(text: str) -> tuple[str, ...]:
    """ "counting,colour" -> ("counting", "colour"), each checked against the task suites."""
    tasks = tuple(t.strip() for t in text.split(",") if t.strip())
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        raise argparse.ArgumentTypeError(f"unknown task(s) {unknown}; choose from {','.join(TASKS)}")
    return tasks


def _common(p: argparse.ArgumentParser, n_help: str = "number of images") -> None:
    p.add_argument("--n", type=arg_int(min=1, max=MAX_SAMPLES), required=True, help=n_help)
    p.add_argument("--seed", type=arg_int(min=0), default=0, help="dataset seed (default 0)")
    p.add_argument("--out", required=True, type=arg_path, metavar="DIR",
                   help="output folder, created when missing: the imagefolder (PNG files + metadata.jsonl)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a dataset vlens data wrote in --out (only its own files are removed)")
    add_image_size(p, DEFAULT_IMAGE_SIZE)
    p.add_argument(
        "--counts", type=parse_int_list, default=tuple(range(1, 11)), help="object counts, e.g. 1-10"
    )
    p.add_argument("--workers", type=arg_int(min=1), default=1,
                   help="processes (output is identical for any value)")
    p.add_argument("--radius", type=parse_radius, default=None, help="object radius in px: '6' or '4-12'")
    p.add_argument("--min-gap", type=arg_float(min=2), default=None, help="smallest gap between objects in px (>= 2)")


def _run(args: argparse.Namespace) -> int:
    from vlens.data.generate import DatasetSpec, generate_dataset

    options = {"radius": args.radius, "min_gap": args.min_gap}
    if args.data_kind in ("syndot", "synpoly", "synreal", "pairs"):
        options["allow_empty"] = args.allow_empty
    if args.data_kind != "syndot":
        options["background"] = args.background
    if args.data_kind in ("pairs", "tasks"):
        options["style"] = args.style
    if args.data_kind == "pairs":
        options.update(kind=args.kind, deltas=args.delta, n_changed=args.n_changed)
    if args.data_kind == "tasks":
        options["tasks"] = args.tasks
    start = time.perf_counter()
    try:
        spec = DatasetSpec(args.data_kind, args.n, args.seed, args.image_size, args.counts, options)
        out = generate_dataset(spec, args.out, args.workers, args.overwrite, progress=not args.quiet)
    except ValueError as error:
        # the generators raise UserInputError only for requests their options make impossible
        raise UserInputError(str(error)) from error
    unit = "pairs" if args.data_kind == "pairs" else "images"
    logger.info("wrote %d %s to %s in %.1f s", args.n, unit, out, time.perf_counter() - start)
    return 0


def configure(data: argparse.ArgumentParser) -> None:
    """`vlens data KIND ...`."""
    kinds = data.add_subparsers(dest="data_kind", metavar="KIND", required=True)

    for name, help_text in (
        ("syndot", "black dots on white"),
        ("synpoly", "coloured polygons"),
        ("synreal", "held-out style: shaded/textured objects on noisy backgrounds"),
    ):
        p = kinds.add_parser(name, help=help_text, description=f"{name}: {help_text}.")
        _common(p)
        p.add_argument("--allow-empty", action="store_true", help="allow count 0 (empty images)")
        if name != "syndot":
            choices = (POLY_BACKGROUNDS if name == "synpoly" else REAL_BACKGROUNDS) + ("random",)
            p.add_argument(
                "--background", choices=choices, default="white" if name == "synpoly" else "random",
                help="the image background (random: one drawn per image)",
            )
        p.set_defaults(func=_run)

    p = kinds.add_parser("pairs", help="controlled clean/corrupt pairs for activation patching")
    _common(p, n_help="number of pairs")
    p.add_argument("--style", choices=STYLES, default="syndot", help="the images' style (as the data command of that name)")
    p.add_argument("--kind", choices=PAIR_KINDS, default="count", help="count difference, or a control pair")
    p.add_argument("--delta", type=parse_int_list, default=(1, 2, 3), help="count differences, e.g. 1-3")
    p.add_argument("--n-changed", type=arg_int(min=1), default=1, help="objects moved/recoloured in control pairs")
    p.add_argument("--background", default=None, help="background kind (default: the style's)")
    p.add_argument("--allow-empty", action="store_true", help="allow count 0 (empty images)")
    p.set_defaults(func=_run)

    p = kinds.add_parser("tasks", help="task suites (one task per image, cycling through --tasks)")
    _common(p)
    p.add_argument("--style", choices=STYLES, default="synpoly", help="the images' style (as the data command of that name)")
    p.add_argument("--tasks", type=parse_tasks, default=TASKS, help=f"comma list from {','.join(TASKS)}")
    p.add_argument("--background", default=None, help="background kind (default: the style's)")
    p.set_defaults(func=_run)
