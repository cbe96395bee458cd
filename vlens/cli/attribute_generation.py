"""``vlens attribute-generation``: which image tokens each generated token used.

    vlens attribute-generation --model tiny --image dots.png --prompt "How many dots are there?" \\
        --max-new-tokens 8 --out runs/attr
    vlens attribute-generation --model M --image photo.png --prompt "Describe the image." --baseline blank \\
        --region-size 2 --out runs/attr2
    vlens attribute-generation --model M --image a.png --baseline-image b.png --prompt "..." --no-exact --out runs/a3

Generates greedily (or teacher-forces ``--continuation TEXT``), then for every generated token scores each
image token by gradient x activation and attribution patching against the baseline, patches each region
exactly (``--no-exact`` skips it) and reads the logit lens through depth. Writes ``results.json`` (loads
back with ``vlens.load_result``) and ``generation_attribution.html`` (the strip of maps under the generated
text, offline) into ``--out``; prints the agreement of each estimate with exact patching.
"""

from __future__ import annotations

import argparse
import logging

from vlens.cli.console import echo
from vlens.cli.dataset_options import mark_input_paths
from vlens.cli.options import RESULTS_FILE, add_model_options, add_out, load_model_from_args, prepare_out
from vlens.utils.validation import arg_int, arg_path

logger = logging.getLogger(__name__)

HTML_FILE = "generation_attribution.html"
BASELINES = ("mean", "blank", "zero")
METRICS = ("logprob", "logit")


def configure(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser)
    parser.add_argument("--prompt", required=True, metavar="TEXT", help="the prompt to generate from")
    parser.add_argument("--image", type=arg_path, action="append", required=True, metavar="PATH",
                        help="an image of the prompt (repeat for several, in order)")
    parser.add_argument("--continuation", default=None, metavar="TEXT",
                        help="attribute this text after the prompt instead of the greedy generation")
    parser.add_argument("--max-new-tokens", type=arg_int(min=1), default=16, metavar="N",
                        help="tokens generated (default 16; greedy, stopping at the end token)")
    parser.add_argument("--metric", choices=METRICS, default="logprob",
                        help="what is attributed for each token: its log-probability (default) or logit")
    parser.add_argument("--baseline", choices=BASELINES, default="mean",
                        help="image tokens patched to: the mean of their image's tokens (default), a blank image "
                             "(pixels at the processor's mean), or zero")
    parser.add_argument("--baseline-image", type=arg_path, action="append", default=None, metavar="PATH",
                        help="patch to the tokens of this image instead (same size as --image; one per --image)")
    parser.add_argument("--region-size", type=arg_int(min=1), default=1, metavar="K",
                        help="exact patching of K x K token blocks (default 1: every token)")
    parser.add_argument("--no-exact", action="store_true", help="skip exact patching of each region")
    parser.add_argument("--no-lens", action="store_true", help="skip the logit lens")
    parser.add_argument("--max-batch", type=arg_int(min=1), default=8, metavar="N",
                        help="rows per forward of the exact patching (default 8)")
    add_out(parser, f"{RESULTS_FILE} and {HTML_FILE}")
    mark_input_paths(parser, "image", "baseline_image")
    parser.set_defaults(func=run_attribute_generation)


def run_attribute_generation(args: argparse.Namespace) -> int:
    from vlens.generation_attribution import GenerationAttributionSettings, attribute_generation
    from vlens.utils.errors import UserInputError
    from vlens.utils.images import open_image_file

    if args.baseline_image is not None and len(args.baseline_image) != len(args.image):
        raise UserInputError(f"--baseline-image: give one per --image ({len(args.image)}), got "
                             f"{len(args.baseline_image)}")
    out = prepare_out(args, RESULTS_FILE, HTML_FILE)
    settings = GenerationAttributionSettings(max_new_tokens=args.max_new_tokens, metric=args.metric,
                                             baseline=args.baseline, region_size=args.region_size,
                                             exact=not args.no_exact, lens=not args.no_lens,
                                             max_batch=args.max_batch).check()
    model = load_model_from_args(args)
    images = [open_image_file(path, "--image") for path in args.image]
    inputs = model.prepare(images=[images], prompts=[args.prompt])
    baseline = None
    if args.baseline_image is not None:
        others = [open_image_file(path, "--baseline-image") for path in args.baseline_image]
        baseline = model.prepare(images=[others], prompts=[args.prompt])
    continuation = None
    if args.continuation is not None:
        continuation = model.to_tokens(args.continuation, prepend_bos=False, move_to_device=False)[0]
    result = attribute_generation(model, inputs, settings, continuation=continuation, baseline=baseline,
                                  images=images, prompt=args.prompt, progress=not args.quiet)
    path = result.save(out)
    logger.info("wrote %s and %s", path, out / HTML_FILE)
    echo(f"generated: {result.text!r} ({result.n_new} tokens)")
    for image in range(len(result.grids)):
        for method, values in result.agreement(image).items():
            echo(f"image {image}, {method} vs exact patching: pearson {values['pearson_mean']:.3f} (mean over "
                 f"tokens), spearman {values['spearman_mean']:.3f}")
    return 0
