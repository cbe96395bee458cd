"""Options shared by the `vlens` commands: one name, one meaning and one help text per flag.

- ``--model SPEC`` (default ``tiny``, the embedded model), ``--device`` (default: cuda when
  available, else cpu), ``--dtype`` (default: bfloat16 on a GPU, float32 on CPU), the placement of
  one model across devices ``--device-map`` / ``--max-memory`` / ``--offload-folder``
  (HF/accelerate, for a model folder or hub id) and the processor's resolution ``--image-size PX`` / ``--min-pixels`` /
  ``--max-pixels``: every command that loads a model (`add_model_options`, then
  `load_model_from_args`). In commands that render their own images, ``--image-size`` is also the
  side they are rendered at.
- ``--out DIR``: always a folder, created when missing. A command writes its results to
  ``results.json`` in it and its figures and reports beside it; what another command reads next
  (a dataset, a lens, a training run, temperatures, a model) is that folder.
- ``--overwrite``: replace results already in ``--out`` (without it the command refuses).
- ``--batch-size N``: examples per forward pass.
- ``--quiet`` and ``-v/--verbose``: every command (added by the dispatcher, `vlens.cli.console`).

Only the standard library is imported here (and light vlens modules), so building a parser
stays fast; models and torch are loaded inside the run functions.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from vlens.cli.dataset_options import check_input_paths, check_out_apart
from vlens.utils.errors import UserInputError
from vlens.utils.strict_json import DuplicateKeyError, loads_strict
from vlens.utils.validation import arg_int, arg_path, check_output_folder
from vlens.zoo.image_sizes import FALLBACK_IMAGE_SIZE, embedded_image_size, render_size

logger = logging.getLogger(__name__)

RESULTS_FILE = "results.json"
MIN_IMAGE_SIZE = 28  # one merged Qwen-VL patch
# 4096 px a side is ~21k Qwen-VL image tokens per image (its default budget is 3584^2 px); more would
# render or resize images of many GB before any error
MAX_IMAGE_SIZE = 4096
MAX_PIXELS = MAX_IMAGE_SIZE * MAX_IMAGE_SIZE
# accelerate's size units (accelerate.utils.convert_file_size_to_int); a bare number is bytes
_SIZE_UNITS = ("GIB", "MIB", "KIB", "GB", "MB", "KB")
MODEL_DEFAULT = "tiny"
DTYPE_CHOICES = ("auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16")  # vlens.core.devices.DTYPE_NAMES


def add_model_options(parser: argparse.ArgumentParser, *, render_default: int | Literal["model"] | None = None,
                      model_default: str | None = MODEL_DEFAULT, dtype_default: str = "auto",
                      recorded_by: str | None = None, recorded_else: str | None = None,
                      render_fallback: int = FALLBACK_IMAGE_SIZE) -> None:
    """--model, --device, --dtype, --image-size, --min-pixels, --max-pixels.

    render_default: the side in px of the images this command renders itself: "model" (the square size
        --model pins, else `render_fallback`: `rendered_size`), a fixed side, or None (it renders none).
    model_default: None makes --model required.
    dtype_default: "auto" (bfloat16 on a GPU, float32 on CPU); training commands keep float32 weights.
    recorded_by: what records the model when --model is not given (e.g. "the SAE folder"): --model then
        defaults to None and the command reads the model from there (`vlens.cli.recorded_model`).
    recorded_else: the model of a run without that input (`vlens steer` without --sae: tiny); the command sets it.
    """
    from vlens.zoo.specs import SPEC_HELP

    group = parser.add_argument_group("model")
    if recorded_by is not None:
        otherwise = f", else {recorded_else}" if recorded_else is not None else ""
        group.add_argument("--model", default=None, metavar="SPEC",
                           help=f"{SPEC_HELP} (default: the model {recorded_by} records{otherwise}; another model "
                                "only when its hook and width fit)")
    elif model_default is None:
        group.add_argument("--model", required=True, metavar="SPEC", help=SPEC_HELP)
    else:
        group.add_argument("--model", default=model_default, metavar="SPEC",
                           help=f"{SPEC_HELP} (default {model_default})")
    group.add_argument("--device", default="auto", help="torch device, e.g. cpu, cuda, cuda:1 "
                       "(default auto: cuda when available, else cpu)")
    dtype_help = ("auto: bfloat16 on a GPU, float32 on CPU" if dtype_default == "auto"
                  else f"{dtype_default}")
    group.add_argument("--dtype", default=dtype_default, choices=DTYPE_CHOICES, metavar="DTYPE",
                       help=f"weights dtype, one of {', '.join(DTYPE_CHOICES)} (default {dtype_help})")
    group.add_argument("--device-map", type=device_map_arg, default=None, metavar="MAP",
                       help="place one model across devices with HF/accelerate instead of --device: auto, balanced, "
                       "balanced_low_0, sequential, one device (e.g. cpu), or JSON {module: device} inline or in a "
                       ".json file; model folders and hub ids only (needs accelerate)")
    group.add_argument("--max-memory", type=max_memory_arg, default=None, metavar="BUDGET",
                       help="per-device budget of --device-map auto/balanced, e.g. 0=70GiB,1=70GiB,cpu=200GiB "
                       "(GPU indices or cpu/disk; sizes as accelerate reads them, or bytes)")
    group.add_argument("--offload-folder", type=arg_path, default=None, metavar="DIR",
                       help="where --device-map keeps the modules it places on disk (when the budget is too small)")
    fixed = ("the model's processor resizes every image to about PX*PX pixels, keeping its aspect ratio "
             "(Qwen-VL: a multiple of 28, 32 for Qwen3-VL; LLaVA-NeXT / OneVision: tiles at most PX x PX pixels "
             "of each image, keeping the image_grid_pinpoints that fit)")
    if render_default is None:
        size_help = f"{fixed}; default: the processor's own setting"
    elif render_default == "model":
        size_help = (f"side in px of the images this command renders (default: the square size the model's processor "
                     f"pins, {embedded_image_size()} for tiny; {render_fallback} for a processor with dynamic "
                     f"resolution); when given, also {fixed}")
    else:
        size_help = (f"side in px of the images this command renders (default {render_default}); when given, "
                     f"also {fixed}")
    group.add_argument("--image-size", type=arg_int(min=MIN_IMAGE_SIZE, max=MAX_IMAGE_SIZE), default=None,
                       metavar="PX", help=f"{size_help} (at most {MAX_IMAGE_SIZE})")
    group.add_argument("--min-pixels", type=arg_int(min=1, max=MAX_PIXELS), default=None, metavar="N",
                       help="Qwen-VL dynamic resolution: smallest image area in pixels after resizing")
    group.add_argument("--max-pixels", type=arg_int(min=1, max=MAX_PIXELS), default=None, metavar="N",
                       help="Qwen-VL dynamic resolution: largest image area in pixels after resizing "
                       f"(bounds the image tokens of large images; at most {MAX_PIXELS} = {MAX_IMAGE_SIZE}^2)")
    parser.set_defaults(model_options=True)  # check_args checks --model and the resolution before the command runs


def add_image_size(parser: argparse.ArgumentParser, default: int, min: int = MIN_IMAGE_SIZE) -> None:
    """--image-size for commands that render images but load no model."""
    parser.add_argument("--image-size", type=arg_int(min=min, max=MAX_IMAGE_SIZE), default=default, metavar="PX",
                        help=f"side of the rendered images in px (default {default}, at most {MAX_IMAGE_SIZE})")


def check_args(args: argparse.Namespace) -> None:
    """The checks argparse cannot make one flag at a time, run before the command starts (and so
    before any model loads or --out is created): the resolution flags together, and --model (its
    spec, and a model folder validated whole: `vlens.core.loading.validate_model_folder`). A command
    that loads no model for some flags sets ``needs_model=lambda args: ...`` in its defaults. Input
    files and folders (--data, --pairs, ...: `vlens.cli.dataset_options.mark_input_paths`) must exist.
    Nothing here imports torch, so a misspelt path fails in about the interpreter's start-up time."""
    if not getattr(args, "model_options", False):
        check_input_paths(args)
        check_out_apart(args)
        return
    image_size, low, high = (getattr(args, name, None) for name in ("image_size", "min_pixels", "max_pixels"))
    if low is not None and high is not None and low > high:
        raise UserInputError(f"--min-pixels {low} is larger than --max-pixels {high}: give min <= max")
    if image_size is not None and (low is not None or high is not None) and getattr(args, "model", None) is not None:
        flags = " / ".join(f for f, v in (("--min-pixels", low), ("--max-pixels", high)) if v is not None)
        raise UserInputError(f"--image-size fixes the processor's resolution, {flags} bound it: give one of them")
    device = getattr(args, "device", None)
    if device not in (None, "auto") and getattr(args, "sharding", None) is None:
        from vlens.core.devices import resolve_device

        resolve_device(device)  # a typo or a GPU this machine lacks, before anything is loaded
    spec = getattr(args, "model", None)
    needs_model = getattr(args, "needs_model", None)  # a command may load no model for some flags
    if isinstance(spec, str) and (needs_model is None or needs_model(args)):
        from vlens.zoo.specs import check_spec

        check_spec(spec)
    check_input_paths(args)
    check_out_apart(args)


def checked_by(parse: Callable[[str], Any]) -> Callable[[str], str]:
    """An argparse type that runs `parse` on the value while the command line is read, so that a value it
    refuses (a `UserInputError`) is argparse's one-line error, before any model loads or --out is created;
    the text itself is kept for the command to parse again where it uses it."""

    def check(text: str) -> str:
        try:
            parse(text)
        except UserInputError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
        return text

    check.__name__ = getattr(parse, "__name__", "value")
    return check


def task_arg(text: str) -> str:
    """--task / --examples-task of generated samples: a task of the suites."""
    from vlens.data.templates import TASKS

    if text not in TASKS:
        raise argparse.ArgumentTypeError(f"unknown task {text!r}: use one of {', '.join(TASKS)}")
    return text


def task_names_arg(text: str) -> str:
    """--tasks of generated samples: comma-separated tasks of the suites (the text is kept)."""
    from vlens.data.templates import TASKS

    tasks = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        raise argparse.ArgumentTypeError(f"unknown task(s) {', '.join(map(repr, unknown)) or 'none given'}: use "
                                         f"comma-separated tasks of {', '.join(TASKS)}")
    return text


def style_arg(text: str) -> str:
    """--style / --examples-style of generated samples: a style of the generators."""
    from vlens.data.styles import STYLES

    if text not in STYLES:
        raise argparse.ArgumentTypeError(f"unknown style {text!r}: use one of {', '.join(STYLES)}")
    return text


def image_nodes_arg(text: str) -> str:
    """--image-nodes: image, token or ROWSxCOLS (`vlens.circuits.graph.parse_image_nodes`)."""
    if text.strip().lower() in ("image", "token"):
        return text  # the defaults: no need to import the circuits package while parsing
    from vlens.circuits.graph import parse_image_nodes

    return checked_by(parse_image_nodes)(text)


def task_list_arg(text: str) -> str:
    """ablate --tasks: comma-separated TASK or TASK@STYLE, each a task of the suites and a known style,
    or "none" (no task suite: the --data sets alone). The text is kept: the command parses it."""
    from vlens.data.styles import STYLES
    from vlens.data.templates import TASKS

    aliases = {"counting_synreal": "counting@synreal", "synreal": "counting@synreal", "color": "colour"}
    if text.strip().lower() == "none":
        return "none"
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        task, _, style = aliases.get(item, item).partition("@")
        if task not in TASKS:
            raise argparse.ArgumentTypeError(f"unknown task {item!r}: use {', '.join(TASKS)}, optionally as "
                                             f"TASK@STYLE with a style of {', '.join(STYLES)}")
        if style and style not in STYLES:
            raise argparse.ArgumentTypeError(f"unknown style {style!r} in {item!r}: use one of {', '.join(STYLES)}")
    return text


def device_map_arg(text: str) -> str | dict[str, Any]:
    """--device-map: a strategy or one device (kept as text), or a {module: device} JSON object
    (inline, or the path of a .json file)."""
    text = text.strip()
    if not text:
        raise argparse.ArgumentTypeError("is empty: use auto, balanced, sequential, a device or a JSON map")
    if text.endswith(".json") and not text.startswith("{"):
        path = Path(text).expanduser()
        if not path.is_file():
            raise argparse.ArgumentTypeError(f"{text}: no such JSON file")
        text = path.read_text()
    elif not text.startswith(("{", "[")):
        return text
    try:
        placement = loads_strict(text, "--device-map")
    except DuplicateKeyError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("--device-map")) from None
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"is not valid JSON ({error.msg} at character {error.pos})") from None
    if not isinstance(placement, dict) or not placement:
        raise argparse.ArgumentTypeError('must be a non-empty JSON object {"module name": device}')
    bad = [name for name, device in placement.items() if not isinstance(device, (str, int)) or isinstance(device, bool)]
    if bad:
        raise argparse.ArgumentTypeError(f"modules {bad[:3]}: a device is a GPU index or a name (cuda:0, cpu, disk)")
    return placement


def max_memory_arg(text: str) -> dict[int | str, int | str]:
    """--max-memory ``0=70GiB,1=70GiB,cpu=200GiB`` -> {0: "70GiB", 1: "70GiB", "cpu": "200GiB"}
    (GPU indices become ints, as accelerate wants them; a plain number is bytes). Each size is
    checked here as accelerate would read it (GiB, MiB, KiB, GB, MB, KB, or bytes), and must be > 0."""
    budget: dict[int | str, int | str] = {}
    for item in text.split(","):
        device, sep, size = (part.strip() for part in item.partition("="))
        if not sep or not device or not size:
            raise argparse.ArgumentTypeError(f"{item.strip()!r} is not DEVICE=SIZE (e.g. 0=70GiB,cpu=200GiB)")
        key: int | str = int(device) if device.isdigit() else device
        if isinstance(key, str) and key not in ("cpu", "disk") and not key.startswith(("cuda", "xpu", "npu", "mps")):
            raise argparse.ArgumentTypeError(f"device {device!r}: use a GPU index (0, 1, ...), cpu or disk")
        if key in budget:
            raise argparse.ArgumentTypeError(f"device {device!r} is given twice")
        budget[key] = _memory_size(size, device)
    return budget


def _memory_size(size: str, device: str) -> int | str:
    expected = f"a size such as 70GiB, 500MB or a number of bytes (units {', '.join(u.replace('I', 'i') for u in _SIZE_UNITS)})"
    if size.isdigit():
        if int(size) <= 0:
            raise argparse.ArgumentTypeError(f"size {size!r} for device {device!r} must be more than 0 bytes")
        return int(size)
    unit = next((u for u in _SIZE_UNITS if size.upper().endswith(u)), None)
    number = size[: -len(unit)].strip() if unit else ""
    try:
        value = float(number)
    except ValueError:
        value = float("nan")
    if unit is None or not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"size {size!r} for device {device!r} is not {expected}")
    return size


def model_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of `vlens.load_model` that the model options hold.

    In a sharded run (torchrun) each process takes its own GPU: ``--device auto`` / ``cuda`` is
    ``cuda:{LOCAL_RANK}`` (`vlens.parallel.rank_device`). ``--device-map`` replaces ``--device``
    (which must then stay auto) and is refused under torchrun (every process would spread its
    own copy over the same GPUs).
    """
    common = {"dtype": args.dtype, "image_size": args.image_size, "min_pixels": args.min_pixels,
              "max_pixels": args.max_pixels, "progress": not args.quiet}
    placement = {key: value for key in ("max_memory", "offload_folder")
                 if (value := getattr(args, key, None)) is not None}
    device_map = getattr(args, "device_map", None)
    sharding = getattr(args, "sharding", None)
    if placement and device_map is None:
        flags = " and ".join("--" + key.replace("_", "-") for key in placement)
        raise UserInputError(f"{flags} only apply to a --device-map placement: add --device-map auto (or balanced)")
    if device_map is not None:
        if args.device != "auto":
            raise UserInputError(f"--device {args.device} and --device-map both place the model: give one of them")
        if sharding is not None and sharding.distributed:
            raise UserInputError("--device-map spreads one model over the GPUs; under torchrun every process loads "
                                 "its own model on its own GPU: drop --device-map or run without torchrun")
        if "offload_folder" in placement:
            placement["offload_folder"] = str(placement["offload_folder"])
        return {"device": None, "device_map": device_map, **placement, **common}
    device = args.device
    if sharding is not None and sharding.distributed:
        from vlens.parallel import rank_device

        try:
            device = rank_device(sharding, device)
        except ValueError as error:
            raise UserInputError(str(error)) from None
    return {"device": device, **common}


def load_model_from_args(args: argparse.Namespace):
    """The HookedVLM the model options name (`vlens.load_model`)."""
    from vlens.zoo.specs import load_model

    return load_model(args.model, **model_options(args))


def rendered_size(args: argparse.Namespace, default: int | None = None, fallback: int = FALLBACK_IMAGE_SIZE) -> int:
    """The side of images a command renders: --image-size when given, else `default` when the command
    fixes one, else the square size --model pins (`vlens.zoo.image_sizes.render_size`: the embedded
    model's own size for tiny and its recipe's folders), else `fallback` (dynamic resolution)."""
    if args.image_size is not None:
        return args.image_size
    if default is not None:
        return default
    return render_size(getattr(args, "model", None), fallback=fallback)


def add_out(parser: argparse.ArgumentParser, contents: str, *, default: str | None = None,
            required: bool = True) -> None:
    """--out DIR (always a folder) and --overwrite."""
    where = f" (default {default})" if default is not None else ""
    parser.add_argument("--out", default=default, required=required and default is None, metavar="DIR",
                        type=arg_path, help=f"output folder, created when missing{where}: {contents}")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace results already in --out (without it the command refuses)")


def add_batch_size(parser: argparse.ArgumentParser, default: int, what: str = "examples per forward pass") -> None:
    parser.add_argument("--batch-size", type=arg_int(min=1), default=default, metavar="N",
                        help=f"{what} (default {default})")


def prepare_out(args: argparse.Namespace, *names: str) -> Path:
    """Create the --out folder (checked writable, never a model folder unless --overwrite); refuse to
    replace `names` already in it unless --overwrite. Call it before any compute."""
    overwrite = getattr(args, "overwrite", False)
    out = check_output_folder(args.out, "--out", overwrite=overwrite)
    existing = [name for name in names if (out / name).exists()]
    if existing and not overwrite:
        raise UserInputError(f"--out {out} already holds {', '.join(existing)}; pass --overwrite to replace "
                             "it, or choose another folder")
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_results(out: Path, payload: dict) -> Path:
    """Write `payload` with its `provenance` to OUT/results.json (NaN / inf as null: strict JSON)."""
    from vlens.utils.fileio import atomic_write_text
    from vlens.utils.finite import json_safe
    from vlens.utils.provenance import stamp

    # whole or absent: an interrupted write never leaves a truncated results.json
    return atomic_write_text(out / RESULTS_FILE, json.dumps(json_safe(stamp(payload)), indent=1, allow_nan=False) + "\n")


def write_figure(make_figure: Callable[[], Any], path: Path) -> Path | None:
    """Write the plotly figure `make_figure()` as HTML that works offline (`vlens.viz.html`: plotly.js
    inlined once); without plotly, log why and write nothing."""
    try:
        figure = make_figure()
        from vlens.viz.html import write_figure_html
    except ImportError as error:
        logger.warning("no %s: %s (install the viz extra: pip install 'vlens[viz]')", path.name, error)
        return None
    return write_figure_html(figure, path)


__all__ = ["DTYPE_CHOICES", "MAX_IMAGE_SIZE", "MAX_PIXELS", "MODEL_DEFAULT", "RESULTS_FILE", "add_batch_size",
           "add_image_size", "add_model_options", "add_out", "check_args", "load_model_from_args", "model_options",
           "task_list_arg",
           "prepare_out", "rendered_size", "write_figure", "write_results"]
