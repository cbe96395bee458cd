"""``vlens eval``: score a model on a local counting or multiple-choice set.

    vlens eval --model tiny --data data/syndot_test --out runs/eval            # format detected
    vlens eval --model PATH --data mmmu_val/ --format mcq --split validation --out runs/mmmu  # save_to_disk
    vlens eval --model Qwen/Qwen2.5-VL-7B-Instruct --backend hf --data pixmo.parquet \
        --format pixmo --image-dir pixmo_images/ --skip-missing --max-pixels 200704 --out runs/pixmo
"""

from __future__ import annotations

import argparse
import logging

from vlens.cli.console import echo, non_finite_exit
from vlens.cli.dataset_options import DATA_FORMATS as FORMATS  # noqa: F401 (tests/cli/test_conventions.py)
from vlens.cli.dataset_options import add_data_arguments
from vlens.cli.options import (
    add_batch_size,
    add_model_options,
    add_out,
    load_model_from_args,
    model_options,
    prepare_out,
)
from vlens.utils.errors import UserInputError
from vlens.utils.finite import add_allow_nan_argument
from vlens.utils.validation import arg_int

logger = logging.getLogger(__name__)

# spelled out so that building this parser imports nothing heavy (checked against
# vlens.evaluation in tests/cli/test_conventions.py)
ANSWER_PARSERS = ("choice", "count", "count_strict")
PARTIAL_PREDICTIONS = "predictions.partial.jsonl"  # written batch by batch while evaluating


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Generate answers for a local evaluation set, parse and score them (lmms-eval "
                          "conventions) and write predictions.jsonl, results.json and report.md.")
    add_model_options(parser)
    parser.add_argument(
        "--backend", choices=["hooked", "hf"], default="hooked", help="HookedVLM or plain HF model"
    )
    add_data_arguments(parser, required=True)
    add_out(parser, "predictions.jsonl, results.json, report.md, confusion_matrix.html")
    parser.add_argument("--image-column", help="pixmo: the column holding each row's image path")
    parser.add_argument(
        "--verify-sha256", action="store_true", help="pixmo: check images against image_sha256"
    )
    add_batch_size(parser, 8, "examples per generate call")
    parser.add_argument("--max-new-tokens", type=arg_int(min=1), default=32, help="tokens generated per answer")
    parser.add_argument("--limit", type=arg_int(min=1), help="evaluate only the first N examples")
    parser.add_argument("--parser", choices=ANSWER_PARSERS, help="answer parser (default: the format's)")
    parser.add_argument("--post-prompt", help="instruction appended to each question (default: none for the embedded "
                        "model, the format's lmms-eval instruction for real checkpoints; '' for none)")
    parser.add_argument("--unparsed-value", type=arg_int(min=0), help="score unparsed answers as this count in MAE")
    parser.add_argument("--category-field", help="mcq: row field to break accuracy down by (e.g. subject)")
    add_allow_nan_argument(parser)
    parser.set_defaults(func=run_eval, shardable=True)  # torchrun splits the batches (vlens.parallel)


def load_backend(args: argparse.Namespace):
    """The generation backend the model options and ``--backend`` name."""
    if args.backend == "hooked":
        from vlens.evaluation.backends import HookedVLMBackend

        return HookedVLMBackend(load_model_from_args(args))
    from vlens.evaluation.backends import HFBackend

    return HFBackend(*load_hf_model(args))


def load_hf_model(args: argparse.Namespace):
    """(plain HF image-text-to-text model, processor) for ``--backend hf`` (safetensors only)."""
    from vlens.core.devices import configure_resolution, resolve_device, resolve_dtype, sync_resolution
    from vlens.zoo.specs import hf_progress_bars, resolve_spec

    kind, target = resolve_spec(args.model)
    options = model_options(args)
    placement = {key: options[key] for key in ("device_map", "max_memory", "offload_folder")
                 if key in options}
    if placement and kind != "folder" and kind != "hub":
        raise UserInputError(f"--device-map: only for a model folder or hub id, not {args.model!r}")
    device = resolve_device(options["device"])  # cuda:{LOCAL_RANK} under torchrun
    dtype = resolve_dtype(args.dtype, None if placement else device)
    with hf_progress_bars(not args.quiet):
        if kind == "embedded":
            from vlens.zoo import load_hf

            model, processor = load_hf(device=device, dtype=dtype)
        elif kind == "random":
            raise UserInputError("--backend hf needs a model folder, a hub id or 'tiny' (random-tiny is "
                                 "built as a HookedVLM: use --backend hooked)")
        else:
            from transformers import AutoModelForImageTextToText

            from vlens.core.architectures import adapter_for
            from vlens.core.loading import from_pretrained_checked, load_processor_for
            from vlens.utils.errors import failure_context

            with failure_context(f"loading the model {args.model}", "check the model folder or hub id"):
                model = from_pretrained_checked(AutoModelForImageTextToText, target, dtype=dtype,
                                                use_safetensors=True, **placement)
            if not placement:  # accelerate placed the modules; moving the whole model would break its hooks
                model = model.to(device)
            # the processor fallback covers machines without torchvision (Qwen's video processor needs it)
            try:
                family = adapter_for(model)
            except UserInputError:  # the HF backend also runs families vlens has no adapter for
                family = None
            model, processor = model.eval(), load_processor_for(target, adapter=family)
    configure_resolution(processor, args.min_pixels, args.max_pixels, args.image_size)
    sync_resolution(model, processor)
    return model, processor


def read_data(args: argparse.Namespace):
    """The dataset ``--data`` names, read with the data options (format detected when not given)."""
    from vlens.datasets import load_dataset

    options = {"image_column": args.image_column, "verify_sha256": args.verify_sha256 or None}
    return load_dataset(args.data, args.data_format, limit=args.limit, image_dir=args.image_dir, split=args.split,
                        skip_missing=args.skip_missing or None, **options)


def run_eval(args: argparse.Namespace) -> int:
    from vlens.evaluation.datasets import check_counting
    from vlens.evaluation.formats import get_format
    from vlens.evaluation.metrics import CountingMetrics
    from vlens.evaluation.report import PREDICTIONS_FILE, REPORT_JSON, REPORT_MD, write_report
    from vlens.evaluation.runner import EvalSettings, check_settings_apply, evaluate
    from vlens.parallel.options import SweepOptions
    from vlens.utils.finite import collect_non_finite

    out = prepare_out(args, PREDICTIONS_FILE, REPORT_JSON, REPORT_MD)  # before reading data or loading the model
    dataset = read_data(args)
    fmt = get_format(dataset.format)
    settings = EvalSettings(max_new_tokens=args.max_new_tokens, parser=args.parser, post_prompt=args.post_prompt,
                            limit=args.limit, unparsed_value=args.unparsed_value, category_field=args.category_field)
    check_settings_apply(settings, fmt)  # an ignored flag is refused before the model loads
    if fmt.task == "count":
        check_counting(dataset)
    if dataset.skipped:
        logger.warning("skipped %d rows (missing images or open questions; listed in the report)", len(dataset.skipped))
    backend = load_backend(args)
    partial = out / PARTIAL_PREDICTIONS
    with collect_non_finite() as problems:
        try:
            result = evaluate(
                backend,
                dataset,
                settings,
                data_format=fmt,
                stream_to=partial,
                options=SweepOptions(batch_size=args.batch_size, progress=not args.quiet, sharding=args.sharding),
            )
        except BaseException:
            if partial.is_file() and partial.stat().st_size:
                logger.warning("the predictions made before the failure are in %s", partial)
            raise
    if not args.sharding.is_main:  # every rank holds the predictions; rank 0 writes them
        return non_finite_exit(problems, True, "vlens eval")
    paths = write_report(result, out, model_name=args.model)
    partial.unlink(missing_ok=True)  # predictions.jsonl holds them all now
    metrics = result.metrics
    summary = f"{fmt.name}: n={metrics.n} accuracy={metrics.accuracy * 100:.2f}%"
    if isinstance(metrics, CountingMetrics):
        summary += f" MAE={'n/a' if metrics.mae is None else f'{metrics.mae:.3f}'}"
    echo(f"post-prompt: {result.settings['post_prompt']!r} ({result.settings['post_prompt_source']})")
    echo(f"{summary} unparsed={metrics.n_unparsed} skipped={len(result.skipped)}")
    logger.info("wrote %s", ", ".join(str(path) for path in paths.values()))
    return non_finite_exit(problems, args.allow_nan, "vlens eval")
