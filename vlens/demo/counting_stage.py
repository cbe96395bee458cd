"""Stage 2 (behaviour): counting accuracy per true count (the subitizing curve) and the confusion matrix."""

from __future__ import annotations

from vlens.demo.data_stage import CountingSample
from vlens.demo.report_sections import Section
from vlens.demo.settings import DemoSettings
from vlens.evaluation import EvalDataset, EvalExample, HookedVLMBackend, evaluate
from vlens.evaluation.metrics import SUBITIZING_ACCURACY, confusion_matrix, subitizing_limit
from vlens.viz.figures import confusion_matrix_figure, count_accuracy_figure


def evaluate_counting(model, samples: list[CountingSample], settings: DemoSettings, backend=None,
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
    return evaluate(backend or HookedVLMBackend(model), dataset, batch_size=settings.batch_size,
                    max_new_tokens=settings.max_new_tokens, progress=progress)


def counting_sections(model, samples: list[CountingSample], settings: DemoSettings,
                      progress: bool = True) -> list[Section]:
    """Generate an answer for every counting image, parse it, score it per true count."""
    result = evaluate_counting(model, samples, settings, progress=progress)
    metrics = result.metrics
    counts = sorted(metrics.per_count)
    accuracy = {c: metrics.per_count[c].accuracy for c in counts}
    targets = [p.target for p in result.predictions]
    parsed = [p.parsed for p in result.predictions]
    limit = subitizing_limit(accuracy)

    curve = Section(
        key="counting_accuracy",
        title="Counting accuracy per count (subitizing curve)",
        explanation=(f"Share of the {metrics.n} images answered with the exact count, per true count; a "
                     f"subitizing model is near-perfect up to a small count and then falls off (here every count "
                     f"up to {limit} is answered with accuracy >= {SUBITIZING_ACCURACY})."),
        figure=count_accuracy_figure(counts, {"accuracy": [accuracy[c] for c in counts]},
                                     title="Exact-match accuracy per true count").update_yaxes(range=[0, 1.05]),
        table=[{"count": c, "n": metrics.per_count[c].n, "accuracy": accuracy[c], "MAE": metrics.per_count[c].mae,
                "unparsed": metrics.per_count[c].n_unparsed} for c in counts],
        numbers={"accuracy": metrics.accuracy, "MAE": metrics.mae, "unparsed answers": metrics.n_unparsed,
                 "examples": metrics.n, f"subitizing limit (acc >= {SUBITIZING_ACCURACY})": limit},
        data={"counts": counts, "accuracy_per_count": [accuracy[c] for c in counts],
              "metrics": metrics.to_dict(), "settings": result.settings,
              "predictions": [{"target": p.target, "output": p.output, "parsed": p.parsed, "correct": p.correct}
                              for p in result.predictions]},
    )
    labels = sorted(set(counts) | {p for p in parsed if p is not None})
    confusion = Section(
        key="confusion_matrix",
        title="Confusion matrix of counting answers",
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
