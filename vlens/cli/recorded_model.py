"""The model a dictionary (SAE, transcoders) was trained on: the model `sae evaluate`, `sae dashboard`,
`transcoder evaluate`, `steer --sae` and `graph` load.

A dictionary only means something on the activations it was trained on. Its folder records that model
(``metadata.model_name``: written by `vlens sae train` / `vlens transcoder train`, and by SAELens and
circuit-tracer). Without --model the command loads the recorded model (and says so); a folder that records
none, or one vlens cannot load, is refused with what to pass. --model overrides the record (with a note when
they differ), and the method then checks that the model fits (the hook exists and has the dictionary's width;
a transcoder's d_model and layers; a steering direction's width), so another model is used only when it is
compatible.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from vlens.cli.console import echo
from vlens.utils.errors import UserInputError

logger = logging.getLogger(__name__)


def recorded_spec(spec: str) -> str:
    """What a trainer records as the model: a local folder as its absolute path (so that a command run
    from another folder finds it), anything else (tiny, random-tiny, a hub id) as given."""
    from vlens.zoo.specs import looks_like_path

    if (looks_like_path(spec) or os.path.isdir(spec)) and spec not in ("tiny", "random-tiny"):
        return os.path.abspath(os.path.expanduser(spec))
    return spec


def choose_model(args: argparse.Namespace, metadata: dict[str, Any] | None, what: str,
                 use: str = "evaluating it") -> None:
    """Set ``args.model`` to the model `what` (e.g. "the SAE folder runs/sae") was trained on, unless
    --model was given; refuse when it records none or one that cannot be loaded.
    use: what the command does with the dictionary, for the note when --model differs from the record."""
    from vlens.zoo.specs import check_spec

    recorded = (metadata or {}).get("model_name")
    recorded = recorded if isinstance(recorded, str) and recorded.strip() else None
    if args.model is not None:
        if recorded is not None and recorded != args.model:
            echo(f"note: {what} was trained on {recorded!r}; {use} on --model {args.model!r} "
                 "(its hook and width are checked)")
        return
    if recorded is None:
        raise UserInputError(f"{what} records no model (metadata.model_name): pass --model SPEC, the model it was "
                             "trained on")
    try:
        check_spec(recorded)
    except UserInputError as error:
        raise UserInputError(f"{what} was trained on the model {recorded!r}, which cannot be loaded here ({error}): "
                             "pass --model SPEC for that model, or a model with the same hook and width") from None
    args.model = recorded
    logger.info("model %s: the one %s was trained on (pass --model to choose another)", recorded, what)


__all__ = ["choose_model", "recorded_spec"]
