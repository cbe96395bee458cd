"""`vlens info`: load a model (the embedded one by default) and print its config and hook points;
`vlens info --families` lists the model families vlens can convert (no model is loaded);
`vlens info --image PATH --box X0 Y0 X1 Y1 [--figure FILE.html]` lists the image tokens the box covers
through the model's preprocessing (every view, with each token's covered fraction) and draws them."""

from __future__ import annotations

import argparse

from vlens.cli.console import echo
from vlens.cli.dataset_options import mark_input_paths
from vlens.cli.options import add_model_options, load_model_from_args
from vlens.utils.validation import arg_float, arg_int, arg_path

SHOWN_HOOKS = 12


def configure(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser)
    parser.add_argument("--hooks", action="store_true", help=f"print every hook name (default: the first {SHOWN_HOOKS})")
    parser.add_argument("--families", action="store_true",
                        help="list the registered model families (built-in and plugins) and the HF classes each "
                        "converts, without loading a model")
    regions = parser.add_argument_group("image regions (docs/regions.md)")
    regions.add_argument("--image", type=arg_path, default=None, metavar="PATH",
                         help="an image: with --box, list the tokens the box covers on it (every view)")
    regions.add_argument("--box", type=arg_float(), nargs=4, default=None, metavar=("X0", "Y0", "X1", "Y1"),
                         help="a pixel box of the original image (x0, y0, x1, y1)")
    regions.add_argument("--threshold", type=arg_float(min=0, max=1), default=0.0,
                         help="keep tokens whose covered fraction is above this (default 0: any overlap)")
    regions.add_argument("--buffer", type=arg_int(min=0), default=0, metavar="K",
                         help="add the tokens within K cells of the selection (Neo et al.'s buffer)")
    regions.add_argument("--figure", type=arg_path, default=None, metavar="FILE",
                         help="write an HTML figure of the selected tokens over the image")
    mark_input_paths(parser, "image")
    parser.set_defaults(func=run_info, needs_model=lambda args: not args.families)


def run_regions(args: argparse.Namespace, model) -> int:
    """The tokens --box covers on --image, one line each (and --figure)."""
    from vlens.datasets import open_image
    from vlens.utils.errors import UserInputError
    from vlens.viz.html import write_figure_html

    if args.image is None or args.box is None:
        raise UserInputError("--image and --box go together: give both to list the tokens a box covers")
    image = open_image(args.image).convert("RGB")
    inputs = model.prepare(images=[image], prompts=["Describe the image."])
    selection = inputs.regions.from_box(0, args.box, threshold=args.threshold)
    if args.buffer:
        selection = selection.buffer(args.buffer)
    echo(f"{len(selection)} tokens of {args.image} ({image.size[0]} x {image.size[1]}) under box {list(args.box)}:")
    for label, position, cover in zip(selection.labels, selection.positions.tolist(), selection.coverage.tolist(),
                                      strict=True):
        echo(f"  {label} (position {position}): coverage {cover:.3f}")
    if args.figure is not None:
        echo(f"figure: {write_figure_html(selection.plot(image), args.figure, title='image regions')}")
    return 0


def family_lines() -> list[str]:
    """One line per registered family: its name, the HF classes it converts and where its adapter lives."""
    from vlens.core.architectures import registered_adapters

    return [f"  {family}: {', '.join(adapter.hf_class_names)} ({adapter.__module__})"
            + (f" refused: {adapter.refusal}" if adapter.refusal else "")
            for family, adapter in registered_adapters().items()]


def run_info(args: argparse.Namespace) -> int:
    if args.families:
        lines = family_lines()
        echo(f"{len(lines)} model families:")
        for line in lines:
            echo(line)
        return 0
    model = load_model_from_args(args)
    if args.image is not None or args.box is not None:
        return run_regions(args, model)
    echo(model.summary())
    for key, value in model.cfg.to_dict().items():
        echo(f"  {key}: {value}")
    names = list(model.hook_dict)
    echo(f"{len(names)} hook points" + ("" if args.hooks else " (use --hooks to list them all)"))
    for name in names if args.hooks else names[:SHOWN_HOOKS]:
        echo(f"  {name}")
    from vlens.core.architectures import registered_adapters

    echo(f"model families vlens converts: {', '.join(registered_adapters())} (vlens info --families for their "
         "HF classes)")
    return 0
