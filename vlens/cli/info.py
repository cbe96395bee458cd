"""`vlens info`: build a model (the embedded one, a path, or a tiny random one) and list its hooks."""

from __future__ import annotations

import argparse


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("info", help="Show a model's config and hook points.")
    parser.add_argument("--model", default="random-tiny",
                        help="'tiny' (embedded model), 'random-tiny' (random Qwen2.5-VL), or a path / hub id")
    parser.add_argument("--hooks", action="store_true", help="print every hook name")
    parser.set_defaults(func=run_info)


def load_model_arg(name: str):
    """The `--model` convention shared by every command: 'tiny', 'random-tiny', or a path / hub id."""
    from vlens.model import HookedVLM

    if name == "tiny":
        import vlens

        return vlens.load()
    if name == "random-tiny":
        from vlens.testing import tiny_hf_model, tiny_qwen_processor

        return HookedVLM.from_hf(tiny_hf_model("qwen2_5_vl"), tiny_qwen_processor())
    return HookedVLM.from_pretrained(name)


def run_info(args: argparse.Namespace) -> int:
    model = load_model_arg(args.model)
    print(model.summary())
    for key, value in model.cfg.to_dict().items():
        print(f"  {key}: {value}")
    names = list(model.hook_dict)
    print(f"{len(names)} hook points" + ("" if args.hooks else " (use --hooks to list them all)"))
    for name in names if args.hooks else names[:12]:
        print(f"  {name}")
    return 0
