"""``vlens steer``: add a direction at chosen layers while generating, over a strength sweep.

    vlens steer --model tiny --image dots.png --prompt "How many dots are there?" \\
        --positive "red" --negative "blue" --layers 1 --strengths 0,2,4,8 --out runs/steer
    vlens steer --prompt "Describe the image." --image photo.png --sae saes/L3 --feature 17 --out runs/steer_sae
    vlens steer --prompt "How many dots are there?" --sae transcoders/ --layers 2 --feature 5 --out runs/steer_tc
    vlens steer --model M --prompt "..." --direction probe.pt --layers 5 --from-step 2 --region none --out runs/s

The direction is one of: ``--direction FILE`` (a saved tensor [d_model], .pt or .npy), ``--sae DIR
--feature N`` (an SAE folder in SAELens's format, or per-layer transcoders in vlens's or SAELens's format:
the feature's decoder row), or ``--positive TEXT ... --negative TEXT ...`` (the difference of the mean
activations at the final prompt position, at the hook of the first steered layer). With ``--sae`` and no
``--model`` the model is the one the folder records (`vlens.cli.recorded_model`), else the embedded model.
With ``--sae`` and no ``--layers`` / ``--hook`` the direction is added where the features are written: an
SAE's own hook (``cfg.hook_name``), a transcoder's layer's ``hook_mlp_out`` (a set covering several layers
needs ``--layers L``: the layer whose feature it is); a site given that differs is noted. Writes
``results.json`` (loads back with ``vlens.load_result``) and ``steering.html`` (the texts side by side) into
``--out``; prints the table.
"""

from __future__ import annotations

import argparse
import logging

from vlens.cli.console import echo
from vlens.cli.dataset_options import mark_input_paths
from vlens.cli.options import (
    MODEL_DEFAULT,
    RESULTS_FILE,
    add_model_options,
    add_out,
    load_model_from_args,
    prepare_out,
)
from vlens.cli.recorded_model import choose_model
from vlens.utils.validation import arg_int, arg_path

logger = logging.getLogger(__name__)

HTML_FILE = "steering.html"
REGIONS = ("all", "final", "image", "text", "none")
DEFAULT_LAYERS = (0,)
DEFAULT_HOOK = "hook_resid_post"


def _numbers(text: str) -> tuple[float, ...]:
    from vlens.utils.errors import UserInputError

    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UserInputError(f"--strengths {text!r}: give comma-separated numbers, e.g. 0,2,4,8") from None
    if not values:
        raise UserInputError("--strengths: give at least one number, e.g. 0,2,4,8")
    return values


def _layers(text: str) -> tuple[int, ...]:
    from vlens.utils.errors import UserInputError

    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UserInputError(f"--layers {text!r}: give comma-separated layer numbers, e.g. 2,3") from None


def configure(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser, recorded_by="the --sae folder", recorded_else=MODEL_DEFAULT)
    parser.add_argument("--prompt", action="append", required=True, metavar="TEXT",
                        help="a prompt to generate from (repeat for a batch)")
    parser.add_argument("--image", type=arg_path, default=None, metavar="PATH",
                        help="an image given with every prompt (default: text only)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--direction", type=arg_path, metavar="FILE", help="a saved direction [d_model] (.pt / .npy)")
    source.add_argument("--sae", type=arg_path, metavar="DIR", help="an SAE folder (SAELens format) or per-layer "
                        "transcoders (vlens's or SAELens's folder); with --feature")
    source.add_argument("--positive", nargs="+", metavar="TEXT", help="prompts of the positive set (with --negative)")
    parser.add_argument("--negative", nargs="+", metavar="TEXT", help="prompts of the negative set")
    parser.add_argument("--feature", type=arg_int(min=0), default=None, metavar="N", help="the SAE feature (--sae)")
    parser.add_argument("--layers", type=_layers, default=None, metavar="L,L",
                        help=f"decoder layers to steer (default {DEFAULT_LAYERS[0]}; with --sae: the SAE's layer)")
    parser.add_argument("--hook", default=None,
                        help=f"per-layer hook the direction is added to (default {DEFAULT_HOOK}; with --sae: the "
                        "hook the SAE reads, a transcoder's hook_mlp_out)")
    parser.add_argument("--strengths", type=_numbers, default=(0.0, 2.0, 4.0, 8.0), metavar="S,S",
                        help="the strength sweep (default 0,2,4,8; 0 is the plain generation)")
    parser.add_argument("--region", choices=REGIONS, default="all",
                        help="prompt positions steered (default all; none: generated tokens only)")
    parser.add_argument("--no-generated", action="store_true", help="do not steer the generated tokens")
    parser.add_argument("--from-step", type=arg_int(min=0), default=0, metavar="K",
                        help="steer generated tokens from decoding step K on (default 0)")
    parser.add_argument("--max-new-tokens", type=arg_int(min=1), default=16, metavar="N",
                        help="tokens generated per prompt (default 16)")
    add_out(parser, f"{RESULTS_FILE} and {HTML_FILE}")
    mark_input_paths(parser, "image", "direction", "sae")
    parser.set_defaults(func=run_steer)


def _load_dictionary(args: argparse.Namespace):
    """The --sae folder's SAE or per-layer transcoders (either also says which model it was trained on)."""
    from vlens.sae import load_sae
    from vlens.transcoders.formats import holds_transcoders, load_transcoders
    from vlens.utils.errors import UserInputError, failure_context

    if args.feature is None:
        raise UserInputError("--sae needs --feature N (the feature whose decoder row is the direction)")
    if holds_transcoders(args.sae):
        with failure_context(f"loading the transcoders {args.sae}"):
            return load_transcoders(args.sae)
    with failure_context(f"loading the SAE {args.sae}"):
        return load_sae(args.sae)


def _is_transcoders(dictionary) -> bool:
    from vlens.transcoders import Transcoders

    return isinstance(dictionary, Transcoders)


def _feature_site(args: argparse.Namespace, dictionary) -> tuple[int, str] | None:
    """(layer, per-layer hook) where the dictionary's features are written: an SAE's decoder reconstructs
    its own ``cfg.hook_name``; a per-layer transcoder's writes its layer's ``hook_mlp_out`` (a set covering
    several layers: the one --layers names). None when an SAE's hook is not ``blocks.L.<hook>``."""
    from vlens.utils.errors import UserInputError

    if _is_transcoders(dictionary):
        covered = dictionary.cfg.layers
        if len(covered) == 1:
            return covered[0], "hook_mlp_out"
        if args.layers is not None and len(args.layers) == 1 and args.layers[0] in covered:
            return args.layers[0], "hook_mlp_out"
        raise UserInputError(f"the transcoders {args.sae} cover layers {', '.join(map(str, covered))}: pass --layers L "
                             "(one of them: the layer whose feature --feature is, steered where it writes)")
    parts = str(dictionary.cfg.hook_name or "").split(".")
    if len(parts) == 3 and parts[0] == "blocks" and parts[1].isdigit():
        return int(parts[1]), parts[2]
    return None


def _steering_site(args: argparse.Namespace, site: tuple[int, str] | None) -> None:
    """Fill --layers / --hook from the features' site with --sae (a differing site given is noted), else the
    defaults."""
    from vlens.utils.errors import UserInputError

    if args.sae is not None and site is None and (args.layers is None or args.hook is None):
        raise UserInputError(f"the SAE folder {args.sae} records no per-layer hook 'blocks.L.<hook>' (cfg.hook_name "
                             "is not one): pass --layers and --hook")
    if site is not None:
        layer, hook = site
        given = (args.layers, args.hook)
        args.layers = (layer,) if args.layers is None else args.layers
        args.hook = hook if args.hook is None else args.hook
        if given != (None, None) and (tuple(args.layers), args.hook) != ((layer,), hook):
            echo(f"note: the features of {args.sae} are written at blocks.{layer}.{hook}; steering at layers "
                 f"{','.join(map(str, args.layers))} {args.hook} as given")
    args.layers = DEFAULT_LAYERS if args.layers is None else args.layers
    args.hook = DEFAULT_HOOK if args.hook is None else args.hook


def _direction(args: argparse.Namespace, model, hook: str, dictionary=None, site: tuple[int, str] | None = None):
    import numpy as np
    import torch

    from vlens.steering import mean_difference, sae_direction, transcoder_direction
    from vlens.utils.errors import UserInputError, failure_context
    from vlens.utils.fileio import load_tensor_file

    if args.direction is not None:
        with failure_context(f"reading the direction {args.direction}"):
            if args.direction.suffix == ".npy":
                vector = torch.from_numpy(np.load(args.direction))
            else:  # plain data only; torch's own "Weights only load failed ..." said nothing of the file
                vector = load_tensor_file(args.direction, "--direction",
                                          "give a .pt file holding one tensor [d_model] (torch.save(v, path)) or a .npy")
        if not isinstance(vector, torch.Tensor):
            raise UserInputError(f"--direction {args.direction}: holds a {type(vector).__name__}, not a tensor")
        vector = vector.float()
        if vector.numel() == model.cfg.d_model:  # [1, d_model] and the like
            vector = vector.flatten()
        return vector, f"--direction {args.direction.name}"
    if dictionary is not None and _is_transcoders(dictionary):
        assert site is not None  # _feature_site gives a transcoder set its layer or refuses
        return (transcoder_direction(dictionary, site[0], args.feature),
                f"transcoder {args.sae.name} layer {site[0]} feature {args.feature}")
    if dictionary is not None:
        return sae_direction(dictionary, args.feature), f"SAE {args.sae.name} feature {args.feature}"
    if not args.negative:
        raise UserInputError("--positive needs --negative (the direction is their difference of means)")
    positive = model.prepare(prompts=list(args.positive))
    negative = model.prepare(prompts=list(args.negative))
    return mean_difference(model, positive, negative, hook), f"mean difference at {hook} (final position)"


def run_steer(args: argparse.Namespace) -> int:
    from vlens.steering import SteeringSettings, steer
    from vlens.utils.errors import UserInputError
    from vlens.utils.images import open_image_file

    if args.negative and not args.positive:
        raise UserInputError("--negative goes with --positive")
    if args.feature is not None and args.sae is None:
        raise UserInputError("--feature goes with --sae")
    dictionary, site = None, None
    if args.sae is not None:  # before the model: the folder says which model its features belong to
        dictionary = _load_dictionary(args)
        site = _feature_site(args, dictionary)
        what = f"the transcoders {args.sae}" if _is_transcoders(dictionary) else f"the SAE folder {args.sae}"
        choose_model(args, dictionary.cfg.metadata, what, use="steering with its feature")
    elif args.model is None:
        args.model = MODEL_DEFAULT
    _steering_site(args, site)
    out = prepare_out(args, RESULTS_FILE, HTML_FILE)
    model = load_model_from_args(args)
    settings = SteeringSettings(layers=args.layers, hook=args.hook, strengths=args.strengths,
                                prompt_region=None if args.region == "none" else args.region,
                                generated=not args.no_generated, from_step=args.from_step,
                                max_new_tokens=args.max_new_tokens)
    settings.check(model)
    images = None
    if args.image is not None:
        image = open_image_file(args.image, "--image")
        images = [image] * len(args.prompt)
    inputs = model.prepare(images=images, prompts=list(args.prompt))
    direction, source = _direction(args, model, settings.hook_names()[0], dictionary, site)
    result = steer(model, inputs, direction, settings, source=source, progress=not args.quiet)
    path = result.save(out)
    logger.info("wrote %s and %s", path, out / HTML_FILE)
    for row in result.table():
        echo(" | ".join(f"{key}: {value}" for key, value in row.items()))
    return 0
