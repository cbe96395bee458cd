"""``vlens eval``: score a model on a local counting or multiple-choice set.

    vlens eval --model tiny --data data/syndot_test --format imagefolder --out runs/eval
    vlens eval --model Qwen/Qwen2.5-VL-7B-Instruct --backend hf --data pixmo.parquet \
        --format pixmo --image-dir pixmo_images/ --skip-missing --out runs/pixmo
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vlens.evaluation.formats import FORMATS, get_format
from vlens.evaluation.parsing import ANSWER_PARSERS
from vlens.finite import add_allow_nan_argument, collect_non_finite, non_finite_exit
from vlens.validation import arg_int, check_output_folder

EMBEDDED_MODEL = "tiny"
PARTIAL_PREDICTIONS = "predictions.partial.jsonl"  # written batch by batch while evaluating
# reader options each format accepts; any other given option is an error, not ignored
_READER_OPTIONS = {
    "imagefolder": set(),
    "pixmo": {"image_dir", "image_column", "verify_sha256"},
    "countbenchqa": {"image_dir"},
    "mcq": {"image_dir"},
}


def add_cli(subparsers) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="evaluate a model on a local counting or multiple-choice set",
        description="Generate answers for a local evaluation set, parse and score them "
        "(lmms-eval conventions) and write predictions.jsonl, report.json and report.md.",
    )
    parser.add_argument(
        "--model", required=True, help=f"'{EMBEDDED_MODEL}' (the embedded model) or a local dir / hub id"
    )
    parser.add_argument(
        "--backend", choices=["hooked", "hf"], default="hooked", help="HookedVLM or plain HF model"
    )
    parser.add_argument("--data", required=True, type=Path, help="data file, or the imagefolder directory")
    parser.add_argument("--format", required=True, choices=sorted(FORMATS), dest="data_format")
    parser.add_argument("--out", required=True, type=Path, help="directory for the report files")
    parser.add_argument(
        "--image-dir", type=Path, help="folder that relative image paths (or sha256 names) are in"
    )
    parser.add_argument("--image-column", help="pixmo: the column holding each row's image path")
    parser.add_argument(
        "--verify-sha256", action="store_true", help="pixmo: check images against image_sha256"
    )
    parser.add_argument(
        "--skip-missing", action="store_true", help="skip rows whose image is missing (counted in the report)"
    )
    parser.add_argument("--batch-size", type=arg_int(min=1), default=8)
    parser.add_argument("--max-new-tokens", type=arg_int(min=1), default=32)
    parser.add_argument("--limit", type=arg_int(min=1), help="evaluate only the first N examples")
    parser.add_argument(
        "--parser", choices=sorted(ANSWER_PARSERS), help="answer parser (default: the format's)"
    )
    parser.add_argument("--post-prompt", help="instruction appended to each question (default: the format's)")
    parser.add_argument("--unparsed-value", type=arg_int(min=0), help="score unparsed answers as this count in MAE")
    parser.add_argument("--category-field", help="mcq: row field to break accuracy down by (e.g. subject)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    add_allow_nan_argument(parser)
    parser.set_defaults(func=run_eval)


def load_backend(model: str, backend: str, device: str = "cpu", dtype: str = "float32"):
    """A generation backend for ``--model`` (``tiny`` or a local dir / hub id) and ``--backend``."""
    import torch

    torch_dtype = getattr(torch, dtype)
    if backend == "hooked":
        import vlens
        from vlens.evaluation.backends import HookedVLMBackend

        if model == EMBEDDED_MODEL:
            return HookedVLMBackend(vlens.load(device=device, dtype=torch_dtype))
        return HookedVLMBackend(vlens.HookedVLM.from_pretrained(model, device=device, dtype=torch_dtype))
    if backend == "hf":
        from vlens.evaluation.backends import HFBackend

        if model == EMBEDDED_MODEL:
            from vlens.zoo import load_hf

            return HFBackend(*load_hf(device=device, dtype=torch_dtype))
        return HFBackend(*load_hf_model(model, device, torch_dtype))
    raise ValueError(f"unknown backend {backend!r}; use 'hooked' or 'hf'")


def load_hf_model(model: str, device: str, torch_dtype):
    """Any HF image-text-to-text model (safetensors only) and its processor."""
    from transformers import AutoModelForImageTextToText

    from vlens.loading import from_pretrained_checked, load_processor_for

    hf_model = from_pretrained_checked(AutoModelForImageTextToText, model, dtype=torch_dtype, use_safetensors=True)
    # the processor fallback covers machines without torchvision (Qwen's video processor needs it)
    return hf_model.to(device).eval(), load_processor_for(model)


def reader_options(args: argparse.Namespace) -> dict:
    """The reader keyword arguments given on the command line, checked against the format."""
    given = {
        "image_dir": args.image_dir,
        "image_column": args.image_column,
        "verify_sha256": args.verify_sha256 or None,
    }
    given = {k: v for k, v in given.items() if v is not None}
    unsupported = sorted(set(given) - _READER_OPTIONS[args.data_format])
    if unsupported:
        flags = ", ".join("--" + name.replace("_", "-") for name in unsupported)
        raise SystemExit(f"vlens eval: {flags} do(es) not apply to --format {args.data_format}")
    return given


def run_eval(args: argparse.Namespace) -> int:
    from vlens.evaluation.report import write_report
    from vlens.evaluation.runner import evaluate

    check_output_folder(args.out, "--out")  # before reading data or loading the model
    fmt = get_format(args.data_format)
    options = reader_options(args)
    dataset = fmt.reader(args.data, skip_missing=args.skip_missing, **options)
    if dataset.skipped:
        print(f"skipped {len(dataset.skipped)} rows with missing images (listed in the report)")
    backend = load_backend(args.model, args.backend, args.device, args.dtype)
    partial = args.out / PARTIAL_PREDICTIONS
    with collect_non_finite() as problems:
        try:
            result = evaluate(
                backend,
                dataset,
                fmt,
                batch_size=args.batch_size,
                max_new_tokens=args.max_new_tokens,
                parser=args.parser,
                post_prompt=args.post_prompt,
                limit=args.limit,
                unparsed_value=args.unparsed_value,
                category_field=args.category_field,
                progress=not args.no_progress,
                stream_to=partial,
            )
        except BaseException:
            if partial.is_file() and partial.stat().st_size:
                print(f"vlens eval: the predictions made before the failure are in {partial}", file=sys.stderr)
            raise
    paths = write_report(result, args.out, model_name=args.model)
    partial.unlink(missing_ok=True)  # predictions.jsonl holds them all now
    metrics = result.metrics
    summary = f"{fmt.name}: n={metrics.n} accuracy={metrics.accuracy * 100:.2f}%"
    if fmt.task == "count":
        summary += f" MAE={'n/a' if metrics.mae is None else f'{metrics.mae:.3f}'}"
    print(f"{summary} unparsed={metrics.n_unparsed} skipped={len(result.skipped)} -> {paths['markdown']}")
    return non_finite_exit(problems, args.allow_nan, "vlens eval")
