"""What each data format means for evaluation: its reader, answer parser, task and prompt.

The answer-format instructions appended to each question are lmms-eval's defaults
(pixmo_count, countbenchqa, mmmu_val), the prompts the paper's numbers for real checkpoints
are measured with, so scores are comparable with its tables. The vlens imagefolder's
questions already say how to answer, so nothing is appended there. The embedded model was
trained on bare questions and gets no instruction either (:func:`default_post_prompt`): an
instruction it never saw in training lowers its accuracy on the same images (40 SynDot images:
92.5% without, 2.5% with "Answer with a single number."; benchmarks/RESULTS.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from vlens.evaluation.datasets import (
    read_countbenchqa,
    read_counting_imagefolder,
    read_mcq,
    read_pixmo,
    read_qa,
)
from vlens.evaluation.examples import EvalDataset, EvalExample
from vlens.utils.errors import UserInputError
from vlens.zoo import is_embedded


@dataclass(frozen=True)
class EvalFormat:
    """How to read, prompt and score one kind of local evaluation data.

    Attributes:
        name: the format's name (the CLI's ``--format``).
        reader: reads a path (plus reader options) into an EvalDataset.
        parser: default answer parser name (see ``vlens.evaluation.parsing``).
        task: ``"count"`` (integer targets, accuracy + MAE) or ``"choice"`` (letter targets).
        post_prompt: appended to every question (after the options, for multiple choice).
    """

    name: str
    reader: Callable[..., EvalDataset]
    parser: str
    task: str
    post_prompt: str


FORMATS: dict[str, EvalFormat] = {
    "imagefolder": EvalFormat("imagefolder", read_counting_imagefolder, "count", "count", ""),
    "pixmo": EvalFormat("pixmo", read_pixmo, "count", "count", "\nAnswer with a single number."),
    "countbenchqa": EvalFormat(
        "countbenchqa", read_countbenchqa, "count_strict", "count", "\nAnswer with a single number."
    ),
    "qa": EvalFormat("qa", read_qa, "count", "count", "\nAnswer with a single number."),
    "mcq": EvalFormat(
        "mcq",
        read_mcq,
        "choice",
        "choice",
        "\nAnswer with the option's letter from the given choices directly.",
    ),
}


def get_format(name: str) -> EvalFormat:
    """The format called ``name``; a clear error lists the known ones."""
    if name not in FORMATS:
        raise UserInputError(f"unknown evaluation format {name!r}; choose one of {sorted(FORMATS)}")
    return FORMATS[name]


def format_prompt(example: EvalExample, post_prompt: str) -> str:
    """The text sent to the model: question, then ``"A. option"`` lines, then the instruction."""
    return example.prompt_text() + post_prompt


def default_post_prompt(fmt: EvalFormat, model=None) -> tuple[str, str]:
    """(instruction, why): none for the embedded model, else the format's lmms-eval instruction.

    ``model``: a HookedVLM, an HF model, or a generation backend holding one (``.model``).
    """
    inner = getattr(model, "model", model)
    if inner is not None and is_embedded(inner):
        return "", "none: the embedded model was trained on bare questions"
    if not fmt.post_prompt:
        return "", f"none: {fmt.name} questions say how to answer"
    return fmt.post_prompt, f"the {fmt.name} default (lmms-eval, as in the paper) for real checkpoints"
