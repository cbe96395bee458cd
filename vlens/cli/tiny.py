"""``vlens tiny``: write a family's tiny random model as a model folder (config, safetensors weights,
processor, tokenizer), for trying a family's code paths offline or writing a test.

    vlens tiny --family llava --out tiny-llava
    vlens tiny --family qwen2_5_vl --config n_layers=3 --config d_model=48 --out tiny-qwen
    vlens tiny --list

The folder loads with ``HookedVLM.from_pretrained(DIR)``, ``--model DIR`` and the family's HF class;
the weights are random (nothing is downloaded). `vlens.testing.write_tiny_folder` is the same in
Python; docs/tiny-models.md.
"""

from __future__ import annotations

import argparse
import json
import shutil

from vlens.cli.console import echo
from vlens.cli.options import add_out
from vlens.utils.errors import UserInputError
from vlens.utils.validation import arg_int

MARKER = "tiny.json"  # what write_tiny_folder writes beside the model: a folder --overwrite may replace


def size_arg(text: str) -> tuple[str, object]:
    """KEY=VALUE, the value read as JSON (3, 0.5, [2, 2]) or else kept as text."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (e.g. n_layers=3), got {text!r}")
    try:
        return key.strip(), json.loads(value)
    except json.JSONDecodeError:
        return key.strip(), value


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--family", help="the model family (vlens tiny --list prints them), e.g. llava, qwen2_5_vl")
    parser.add_argument("--list", action="store_true", help="print the families with a tiny model and exit")
    parser.add_argument("--config", type=size_arg, action="append", default=[], metavar="KEY=VALUE",
                        help="a config size of the family's tiny builder (repeatable): n_layers=3, d_model=48, ... "
                             "(see vlens.testing's tiny_<family> builders)")
    parser.add_argument("--seed", type=arg_int(min=0), default=0, help="seed of the random weights")
    add_out(parser, f"the model folder (config.json, model.safetensors, processor and tokenizer files, {MARKER})",
            required=False)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vlens.testing.families import tiny_families, write_tiny_folder

    if args.list:
        echo("\n".join(tiny_families()))
        return 0
    if args.family is None or args.out is None:
        raise UserInputError("give --family F and --out DIR (vlens tiny --list prints the families)")
    out = args.out
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        if not args.overwrite:
            raise UserInputError(f"--out {out} is not empty; pass --overwrite to replace a tiny model written there, "
                                 "or choose another folder")
        if not (out / MARKER).is_file():
            raise UserInputError(f"--out {out} holds files vlens tiny did not write (no {MARKER}): choose another folder")
        shutil.rmtree(out)
    sizes = dict(args.config)
    folder = write_tiny_folder(args.family, out, seed=args.seed, **sizes)
    echo(f"tiny {args.family} model (seed {args.seed}{''.join(f', {k}={v}' for k, v in sizes.items())}) -> {folder}")
    return 0
