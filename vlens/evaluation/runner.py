"""The evaluation loop: batch the examples, generate, parse, score."""

from __future__ import annotations

import dataclasses
import json
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, cast

from vlens.core.processing import refused_message
from vlens.datasets.records import describe_image
from vlens.evaluation.backends import GenerationBackend
from vlens.evaluation.examples import (
    EvalDataset,
    MissingImageError,
    SkippedExample,
    UnreadableImageError,
    open_images,
)
from vlens.evaluation.formats import EvalFormat, default_post_prompt, format_prompt, get_format
from vlens.evaluation.metrics import (
    ChoiceMetrics,
    CountBreakdown,
    CountingMetrics,
    choice_metrics,
    confusion_matrix,
    counting_metrics,
)
from vlens.evaluation.parsing import get_parser
from vlens.evaluation.plots import plot_confusion_matrix
from vlens.parallel.options import SweepOptions, fold_legacy
from vlens.utils.errors import UserInputError
from vlens.utils.finite import json_safe
from vlens.utils.results import Result
from vlens.utils.validation import check_count
from vlens.viz.optional import require_plotly


@dataclass
class Prediction:
    """One example's prompt, the model's raw output, the parsed answer and its score.

    target_tokens / target_logprob: the target answer's token ids and its teacher-forced
    log-probability after the prompt (vlens.core.answers), where the backend can score answers.
    """

    id: str
    prompt: str
    output: str
    parsed: int | str | None
    target: int | str
    correct: bool
    extra: dict = field(default_factory=dict)
    target_tokens: list[int] | None = None
    target_logprob: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class EvalResult(Result):
    """Everything a report needs: settings, per-example predictions, skipped rows, scores."""

    format: str
    task: str
    source: str
    settings: dict
    predictions: list[Prediction]
    skipped: list
    metrics: CountingMetrics | ChoiceMetrics
    model_name: str | None = None  # what reports call the model

    kind: ClassVar[str] = "evaluation"
    predictions_file: ClassVar[str] = "predictions.jsonl"  # beside results.json (`write_report`)

    def to_dict(self) -> dict:
        """The JSON summary (`results.json` of `write_report`): settings, metrics, skipped rows and,
        for counting, the confusion matrix; the per-example predictions go to predictions.jsonl."""
        summary = {
            "model": self.model_name,
            "format": self.format,
            "task": self.task,
            "source": self.source,
            "settings": self.settings,
            "n_evaluated": len(self.predictions),
            "n_skipped": len(self.skipped),
            "skipped": [asdict(s) for s in self.skipped],
            "metrics": self.metrics.to_dict(),
        }
        if self.task == "count":
            rows, columns, matrix = confusion_matrix(*counts_of(self.predictions))
            summary["confusion_matrix"] = {"true": rows, "predicted": columns, "matrix": matrix}
        return summary

    @classmethod
    def from_dict(cls, data: dict) -> EvalResult:
        """The summary `to_dict` wrote, with data["predictions"]: the per-example predictions (what
        predictions.jsonl holds, one dict per example; `load` reads them from the folder)."""
        if "predictions" not in data:
            raise UserInputError("an evaluation result needs its predictions: load the --out folder (or its "
                                 f"results.json) with {cls.predictions_file} beside it")
        metrics = dict(data["metrics"])
        parsed: CountingMetrics | ChoiceMetrics
        if data["task"] == "count":
            per_count = {int(k): CountBreakdown(**v) for k, v in (metrics.pop("per_count", None) or {}).items()}
            parsed = CountingMetrics(**metrics, per_count=per_count)
        else:
            parsed = ChoiceMetrics(**metrics)
        return cls(format=data["format"], task=data["task"], source=data["source"], settings=dict(data["settings"]),
                   predictions=[Prediction(**p) for p in data["predictions"]],
                   skipped=[SkippedExample(**s) for s in data.get("skipped", [])], metrics=parsed,
                   model_name=data.get("model"))

    @classmethod
    def from_saved(cls, data: dict, folder: Path | None = None) -> EvalResult:
        """`from_dict` of a saved summary with the predictions.jsonl of its folder."""
        file = None if folder is None else folder / cls.predictions_file
        if file is None or not file.is_file():
            raise UserInputError(f"no {cls.predictions_file} in {folder}: an evaluation result is read from the "
                                 "--out folder of `vlens eval` (results.json and predictions.jsonl)")
        with file.open(encoding="utf-8") as handle:
            predictions = [json.loads(line) for line in handle if line.strip()]
        result = cls.from_dict({**data, "predictions": predictions})
        body = {key: value for key, value in data.items() if key not in ("kind", "provenance")}
        return cls.attach_saved(result, body, data.get("provenance"))

    def plot(self, title: str | None = None):
        """Counting: the confusion matrix of true against parsed counts; multiple choice: accuracy
        per category (overall without categories)."""
        if self.task == "count":
            return plot_confusion_matrix(*counts_of(self.predictions), title=title or "Counting confusion matrix")
        go = require_plotly()
        metrics = self.metrics.to_dict()
        per_category = metrics.get("per_category") or {"all": {"accuracy": metrics["accuracy"]}}
        figure = go.Figure(go.Bar(x=list(per_category), y=[v["accuracy"] for v in per_category.values()]))
        return figure.update_layout(title=title or f"Accuracy ({self.format})", yaxis={"title": "accuracy",
                                                                                       "range": [0, 1.05]})


def counts_of(predictions: list[Prediction]) -> tuple[list[int | None], list[int]]:
    """(parsed, target) counts of a counting run's predictions (its parser returns int or None)."""
    return cast(list[int | None], [p.parsed for p in predictions]), cast(list[int], [p.target for p in predictions])


def _plain(extra: dict) -> dict:
    """Row fields as JSON types (what predictions.jsonl holds anyway), so they can be stored and gathered."""
    return json.loads(json.dumps(extra, default=str))


def score_predictions(
    task: str,
    predictions: list[Prediction],
    unparsed_value: int | None = None,
    category_field: str | None = None,
) -> CountingMetrics | ChoiceMetrics:
    """Metrics from predictions (also used to re-score a saved predictions.jsonl)."""
    if task == "count":
        metrics = counting_metrics(*counts_of(predictions), unparsed_value=unparsed_value)
        scored = [p.target_logprob for p in predictions if p.target_logprob is not None]
        if scored:
            metrics.mean_target_logprob = sum(scored) / len(scored)
        return metrics
    if task == "choice":
        categories = [p.extra.get(category_field) for p in predictions] if category_field else None
        # a multiple-choice run parses option letters (str or None)
        return choice_metrics(cast(list[str | None], [p.parsed for p in predictions]),
                              cast(list[str], [p.target for p in predictions]), categories=categories)
    raise UserInputError(f"unknown task {task!r}; use 'count' or 'choice'")


def check_settings_apply(settings: EvalSettings, fmt: EvalFormat) -> None:
    """Refuse a setting the format would silently ignore (`category_field` breaks multiple-choice
    accuracy down: a counting set has no such breakdown)."""
    if settings.category_field and fmt.task != "choice":
        raise UserInputError(f"category_field / --category-field {settings.category_field!r} breaks multiple-choice "
                             f"accuracy down by a row field, but the {fmt.name} format is a {fmt.task} task: drop it")


@dataclass(frozen=True)
class EvalSettings:
    """What an evaluation generates and how it scores (how it runs is `vlens.SweepOptions`).

    Attributes:
        max_new_tokens: generation length (lmms-eval uses 32 for counting).
        parser: answer parser name; None: the format's (see ``vlens.evaluation.parsing``).
        post_prompt: instruction appended to each question; None: the model's default (none for
            the embedded model, the format's lmms-eval instruction otherwise), recorded in the settings.
        limit: evaluate only the first ``limit`` examples (recorded in the settings).
        unparsed_value: count that an unparsed answer is scored as in MAE (None: left out).
        category_field: ``extra`` field to break multiple-choice accuracy down by.
    """

    max_new_tokens: int = 32
    parser: str | None = None
    post_prompt: str | None = None
    limit: int | None = None
    unparsed_value: int | None = None
    category_field: str | None = None

    def __post_init__(self) -> None:
        check_count(self.max_new_tokens, "max_new_tokens")
        check_count(self.limit, "limit", allow_none=True)

    def replace(self, **changes: Any) -> EvalSettings:
        """A copy with some fields changed (checked again)."""
        return dataclasses.replace(self, **changes)


EVAL_SETTING_NAMES = ("max_new_tokens", "parser", "post_prompt", "limit", "unparsed_value", "category_field")


def _refused_image(example, opened, refusal) -> str | None:
    """'image <file> (W x H px): the model's image processor refuses it (...)' for the first image of
    the example that the backend's processor refuses, else None."""
    if refusal is None:
        return None
    for source, image in zip(example.images, opened, strict=True):
        reason = refusal(image)
        if reason is not None:
            return refused_message(f"image {describe_image(source)}", image, reason)
    return None


def evaluate(
    backend: GenerationBackend,
    dataset: EvalDataset,
    settings: EvalSettings | None = None,
    data_format: str | EvalFormat | None = None,
    stream_to: str | Path | None = None,
    options: SweepOptions | None = None,
    **legacy: Any,
) -> EvalResult:
    """Generate an answer for every example and score it.

    Args:
        backend: a HookedVLMBackend, HFBackend or anything with the same ``generate``.
        dataset: examples from one of the readers.
        settings: generation length, parser, instruction, limit and scoring (`EvalSettings`).
        data_format: how to prompt and score; defaults to ``dataset.format``.
        stream_to: append each batch's predictions to this JSONL file as soon as they are made
            (single-process runs), so a failure late in a long run keeps the earlier answers.
        options: `batch_size` (examples per ``generate`` call, padded together; default 8),
            `progress`, `sharding` (the batches split across processes; every process returns
            the full result, in example order; rank 0 writes it) (`vlens.SweepOptions`).
    Returns:
        an `EvalResult`: settings, per-example predictions, skipped rows, metrics.

    A row whose logits were NaN/inf while generating (`HookedVLMBackend`) is never parsed: its
    ``parsed`` is None, ``extra["non_finite"]`` True, and ``settings["n_non_finite"]`` counts them.
    """
    if isinstance(settings, str | EvalFormat):  # the old third argument
        warnings.warn("evaluate: the third argument is settings=EvalSettings(...) now; pass the format as "
                      "data_format=...", DeprecationWarning, stacklevel=2)
        if data_format is not None:
            raise UserInputError("evaluate: give the format once, as data_format=...")
        settings, data_format = None, settings
    if settings is not None and not isinstance(settings, EvalSettings):
        raise UserInputError(f"evaluate: settings must be an EvalSettings, got {type(settings).__name__}")
    mine = {k: v for k, v in legacy.items() if k in EVAL_SETTING_NAMES}
    if mine:
        warnings.warn(f"evaluate: the keywords {', '.join(f'{k}=' for k in sorted(mine))} moved into "
                      "settings=EvalSettings(...)", DeprecationWarning, stacklevel=2)
        if settings is not None:
            raise UserInputError(f"evaluate: give {', '.join(sorted(mine))} in settings=EvalSettings(...) only")
        settings = EvalSettings(**mine)
    settings = EvalSettings() if settings is None else settings
    options = fold_legacy(options, {k: v for k, v in legacy.items() if k not in mine}, "evaluate",
                          ("batch_size", "progress", "sharding"))
    options.require_final("evaluate")
    batch_size, max_new_tokens, limit = options.batch(8), settings.max_new_tokens, settings.limit
    parser, post_prompt, progress = settings.parser, settings.post_prompt, options.progress
    unparsed_value, category_field = settings.unparsed_value, settings.category_field
    fmt = (
        get_format(data_format or dataset.format) if not isinstance(data_format, EvalFormat) else data_format
    )
    check_settings_apply(settings, fmt)
    parser_name = parser or fmt.parser
    parse = get_parser(parser_name)
    if post_prompt is None:
        instruction, instruction_source = default_post_prompt(fmt, backend)
    else:
        instruction, instruction_source = post_prompt, "given"
    examples = dataset.examples[:limit] if limit is not None else dataset.examples
    if not examples:
        raise UserInputError(f"{dataset.source} has no examples to evaluate ({len(dataset.skipped)} skipped)")

    sharding = options.shards
    stream = Path(stream_to) if stream_to is not None and sharding.world_size == 1 else None
    if stream is not None:
        stream.parent.mkdir(parents=True, exist_ok=True)
        stream.write_text("", encoding="utf-8")

    refusal = getattr(backend, "image_refusal", None)  # why the model's processor refuses an image

    def run(start: int) -> dict:
        batch, images, skipped_here = [], [], []
        for example in examples[start : start + batch_size]:
            try:  # one undecodable or refused image skips its example (named in the report), not the run
                opened = open_images(example.images)
                refused = _refused_image(example, opened, refusal)
            except (MissingImageError, UnreadableImageError) as error:
                skipped_here.append(asdict(SkippedExample(id=example.id, reason=str(error))))
                continue
            if refused is not None:
                skipped_here.append(asdict(SkippedExample(id=example.id, reason=refused)))
                continue
            images.append(opened)
            batch.append(example)
        if not batch:
            return {"predictions": [], "skipped": skipped_here}
        prompts = [format_prompt(example, instruction) for example in batch]
        outputs = backend.generate(images, prompts, max_new_tokens)
        if len(outputs) != len(batch):
            raise RuntimeError(
                f"the backend returned {len(outputs)} answers for a batch of {len(batch)} prompts"
            )
        broken = list(getattr(backend, "last_non_finite", None) or [False] * len(batch))
        scores = [(None, None)] * len(batch)
        if hasattr(backend, "score_answers") and fmt.task == "count":
            scores = backend.score_answers([open_images(e.images) for e in batch], prompts,
                                           [str(e.target) for e in batch], [e.id for e in batch])
        done = []
        for example, prompt, output, (tokens, logprob), bad in zip(batch, prompts, outputs, scores, broken,
                                                                   strict=True):
            parsed = None if bad else parse(output, example.options)  # NaN logits answer nothing
            done.append(
                Prediction(
                    id=example.id,
                    prompt=prompt,
                    output=output,
                    parsed=parsed,
                    target=example.target,
                    correct=parsed is not None and parsed == example.target,
                    extra={**_plain(example.extra), "non_finite": True} if bad else _plain(example.extra),
                    target_tokens=tokens,
                    target_logprob=logprob,
                ).to_dict()
            )
        if stream is not None:
            with stream.open("a", encoding="utf-8") as handle:
                for fields in done:
                    handle.write(json.dumps(json_safe(fields), default=str, allow_nan=False) + "\n")
        return {"predictions": done, "skipped": skipped_here}

    batches = sharding.map(range(0, len(examples), batch_size), run, desc=f"eval {fmt.name}", progress=progress)
    predictions = [Prediction(**fields) for batch in batches for fields in batch["predictions"]]
    skipped = list(dataset.skipped) + [SkippedExample(**fields) for batch in batches for fields in batch["skipped"]]

    if not predictions:
        reasons = "; ".join(s.reason for s in skipped[:3])
        raise UserInputError(f"{dataset.source}: every example was skipped ({len(skipped)}): {reasons}")
    recorded = {
        "backend": getattr(backend, "name", type(backend).__name__),
        "parser": parser_name,
        "post_prompt": instruction,
        "post_prompt_source": instruction_source,
        "batch_size": batch_size,
        "max_new_tokens": max_new_tokens,
        "limit": limit,
        "unparsed_value": unparsed_value,
        "n_examples_in_data": len(dataset.examples),
        "world_size": sharding.world_size,
        "n_non_finite": sum(bool(p.extra.get("non_finite")) for p in predictions),
    }
    return EvalResult(
        format=fmt.name,
        task=fmt.task,
        source=dataset.source,
        settings=recorded,
        predictions=predictions,
        skipped=skipped,
        metrics=score_predictions(fmt.task, predictions, unparsed_value, category_field),
    )
