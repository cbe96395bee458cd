"""Stage 2 (behaviour): counting accuracy per true count (the subitizing curve) and the confusion matrix."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vlens.demo.data_stage import CountingSample
from vlens.demo.report_sections import Section
from vlens.demo.settings import DemoSettings
from vlens.evaluation import EvalDataset, EvalExample, EvalSettings, HookedVLMBackend, evaluate
from vlens.evaluation.metrics import SUBITIZING_ACCURACY, confusion_matrix, subitizing_limit
from vlens.parallel.options import SweepOptions
from vlens.utils.stats import format_interval, wilson_interval
from vlens.viz.figures import confusion_matrix_figure, count_accuracy_figure

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM



def evaluate_counting(model: HookedVLM, samples: list[CountingSample], settings: DemoSettings, backend=None,
                      progress: bool = True):
    """`vlens.evaluation.evaluate` on the counting images (greedy answers, parsed as counts).

    backend: default `HookedVLMBackend(model)`; pass one with fwd_hooks to evaluate an intervention.
    """
    dataset = EvalDataset(
        format="imagefolder",
        source="vlens demo counting images",
        examples=[EvalExample(id=f"count-{i}", images=[s.image], question=s.question, target=s.count)
                  for i, s in enumerate(samples)],
    )
    return evaluate(backend or HookedVLMBackend(model), dataset,
                    settings=EvalSettings(max_new_tokens=settings.max_new_tokens),
                    options=SweepOptions(batch_size=settings.batch_size, progress=progress))


def counting_key(settings: DemoSettings, style: str, key: str = "counting_accuracy") -> str:
    """The section key of a style's counting evaluation: `key` for `settings.style`, `key_STYLE` for others."""
    return key if style == settings.style else f"{key}_{style}"


def counting_sections(model: HookedVLM, samples: list[CountingSample], settings: DemoSettings,
                      progress: bool = True, style: str | None = None) -> list[Section]:
    """Generate an answer for every counting image (of `style`, default `settings.style`), parse it,
    score it per true count."""
    style = style or settings.style
    result = evaluate_counting(model, samples, settings, progress=progress)
    metrics = result.metrics
    counts = sorted(metrics.per_count)
    accuracy = {c: metrics.per_count[c].accuracy for c in counts}
    n_per_count = [metrics.per_count[c].n for c in counts]
    low, high = wilson_interval([round(accuracy[c] * n) for c, n in zip(counts, n_per_count, strict=True)],
                                n_per_count)
    n_correct = sum(p.correct for p in result.predictions)
    overall = wilson_interval(n_correct, metrics.n)
    targets = [p.target for p in result.predictions]
    parsed = [p.parsed for p in result.predictions]
    limit = subitizing_limit(accuracy)

    curve = Section(
        key=counting_key(settings, style),
        title="Counting accuracy per count (subitizing curve)" + ("" if style == settings.style else f", {style}"),
        explanation=(f"Share of the {metrics.n} {style} images answered with the exact count, per true "
                     f"count, with 95% Wilson intervals ({n_per_count[0]} images per count); every count up to "
                     f"{limit} is answered with accuracy >= {SUBITIZING_ACCURACY}. These are the demo's own "
                     f"{style} images (one renderer, one question), not the mixed task suite of the "
                     "ablation section."),
        figure=count_accuracy_figure(counts, {"accuracy": [accuracy[c] for c in counts]},
                                     lower={"accuracy": low.tolist()}, upper={"accuracy": high.tolist()},
                                     title="Exact-match accuracy per true count (95% intervals)"
                                     ).update_yaxes(range=[0, 1.05]),
        table=[{"count": c, "n": metrics.per_count[c].n,
                "accuracy [95% CI]": format_interval(accuracy[c], float(lo), float(hi)),
                "MAE": metrics.per_count[c].mae, "unparsed": metrics.per_count[c].n_unparsed}
               for c, lo, hi in zip(counts, low, high, strict=True)],
        definitions={"CI": "confidence interval (95% Wilson score interval of a share)",
                     "MAE": "mean absolute error of the parsed count", "n": "images with this true count"},
        numbers={"accuracy": metrics.accuracy, "accuracy 95% CI": format_interval(metrics.accuracy, float(overall[0]),
                                                                      float(overall[1])),
                 "MAE": metrics.mae, "unparsed answers": metrics.n_unparsed,
                 "examples": metrics.n, f"subitizing limit (acc >= {SUBITIZING_ACCURACY})": limit},
        data={"style": style, "counts": counts, "accuracy_per_count": [accuracy[c] for c in counts],
              "accuracy_interval": {"level": 0.95, "method": "wilson", "low": low.tolist(), "high": high.tolist(),
                                    "overall": [float(overall[0]), float(overall[1])]},
              "metrics": metrics.to_dict(), "settings": result.settings,
              "predictions": [{"target": p.target, "output": p.output, "parsed": p.parsed, "correct": p.correct}
                              for p in result.predictions]},
    )
    labels = sorted(set(counts) | {p for p in parsed if p is not None})
    confusion = Section(
        key=counting_key(settings, style, "confusion_matrix"),
        title="Confusion matrix of counting answers" + ("" if style == settings.style else f", {style}"),
        explanation=("Rows: true count, columns: parsed answer (the last column collects answers outside the "
                     "counts or with no number); mass off the diagonal shows which counts are confused."),
        figure=confusion_matrix_figure(*confusion_matrix(parsed, targets, labels=labels, other_label="other"),
                                       title="True count vs answer"),
        numbers={"on diagonal": sum(t == p for t, p in zip(targets, parsed, strict=True)),
                 "off diagonal": sum(p is not None and t != p for t, p in zip(targets, parsed, strict=True)),
                 "unparsed": sum(p is None for p in parsed)},
        data={"labels": labels, "targets": targets, "predictions": parsed},
    )
    return [curve, confusion]
