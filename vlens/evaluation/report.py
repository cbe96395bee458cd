"""Write an evaluation as files: predictions.jsonl, results.json, report.md (+ a figure).

``results.json`` holds the settings, the metrics, the skipped rows and (for counting) the
confusion matrix; ``predictions.jsonl`` one line per example, enough to re-score with
:func:`load_predictions` + :func:`vlens.evaluation.runner.score_predictions`.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from vlens.evaluation.metrics import CountingMetrics
from vlens.evaluation.runner import EvalResult, Prediction
from vlens.utils.finite import json_safe
from vlens.utils.provenance import stamp
from vlens.viz.html import write_figure_html

PREDICTIONS_FILE = "predictions.jsonl"
REPORT_JSON = "results.json"
REPORT_MD = "report.md"
CONFUSION_HTML = "confusion_matrix.html"
_MAX_SKIPPED_LISTED = 20


def _fmt(value: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value * scale:.{digits}f}"


def report_markdown(summary: dict, figure_note: str | None = None) -> str:
    """A human-readable report from an evaluation's summary (`EvalResult.to_dict`)."""
    metrics = summary["metrics"]
    lines = [
        f"# Evaluation: {summary['format']} ({summary['source']})",
        "",
        f"- model: {summary['model'] or 'unnamed'}",
        f"- backend: {summary['settings']['backend']}, parser: {summary['settings']['parser']}, "
        f"max_new_tokens: {summary['settings']['max_new_tokens']}",
        f"- post-prompt: {summary['settings'].get('post_prompt', '')!r} "
        f"({summary['settings'].get('post_prompt_source', 'given')})",
        f"- evaluated: {summary['n_evaluated']}, skipped (image missing, changed or unreadable): "
        f"{summary['n_skipped']}",
        "",
    ]
    if summary["task"] == "count":
        lines += [
            "| n | accuracy (%) | MAE | MAE over n | unparsed |",
            "|---|---|---|---|---|",
            f"| {metrics['n']} | {_fmt(metrics['accuracy'], 100)} | {_fmt(metrics['mae'])} | "
            f"{metrics['mae_n']} | {metrics['n_unparsed']} |",
            "",
            "## Per true count",
            "",
            "| count | n | accuracy (%) | MAE | unparsed |",
            "|---|---|---|---|---|",
        ]
        for count, row in metrics["per_count"].items():
            lines.append(
                f"| {count} | {row['n']} | {_fmt(row['accuracy'], 100)} | {_fmt(row['mae'])} | {row['n_unparsed']} |"
            )
        matrix = summary["confusion_matrix"]
        lines += ["", "## Confusion matrix (rows: true, columns: predicted)", ""]
        lines.append("| true \\ predicted | " + " | ".join(str(c) for c in matrix["predicted"]) + " |")
        lines.append("|---" * (len(matrix["predicted"]) + 1) + "|")
        for label, row in zip(matrix["true"], matrix["matrix"], strict=True):
            lines.append(f"| {label} | " + " | ".join(str(v) for v in row) + " |")
    else:
        lines += [
            "| n | accuracy (%) | unparsed |",
            "|---|---|---|",
            f"| {metrics['n']} | {_fmt(metrics['accuracy'], 100)} | {metrics['n_unparsed']} |",
        ]
        if metrics["per_category"]:
            lines += ["", "## Per category", "", "| category | n | accuracy (%) |", "|---|---|---|"]
            for category, row in metrics["per_category"].items():
                lines.append(f"| {category} | {row['n']} | {_fmt(row['accuracy'], 100)} |")
    if figure_note:
        lines += ["", figure_note]
    if summary["skipped"]:
        lines += ["", "## Skipped rows", ""]
        lines += [f"- {s['id']}: {s['reason']}" for s in summary["skipped"][:_MAX_SKIPPED_LISTED]]
        if len(summary["skipped"]) > _MAX_SKIPPED_LISTED:
            lines.append(
                f"- ... and {len(summary['skipped']) - _MAX_SKIPPED_LISTED} more (see {REPORT_JSON})"
            )
    return "\n".join(lines) + "\n"


def write_report(
    result: EvalResult, out_dir: str | Path, model_name: str | None = None, figures: bool = True
) -> dict[str, Path]:
    """Write the report files into ``out_dir`` (created if needed); returns name -> path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "predictions": out_dir / PREDICTIONS_FILE,
        "json": out_dir / REPORT_JSON,
        "markdown": out_dir / REPORT_MD,
    }
    with paths["predictions"].open("w", encoding="utf-8") as handle:
        for prediction in result.predictions:
            handle.write(json.dumps(json_safe(prediction.to_dict()), default=str, allow_nan=False) + "\n")
    summary = result.to_dict()
    if model_name is not None:
        summary["model"] = model_name
    paths["json"].write_text(json.dumps(json_safe(stamp(summary)), indent=2, default=str, allow_nan=False) + "\n",
                             encoding="utf-8")

    figure_note = None
    if figures and isinstance(result.metrics, CountingMetrics):
        try:
            figure = result.plot()
        except ImportError as error:
            figure_note = f"{CONFUSION_HTML} was not written: {error}"
            warnings.warn(figure_note, stacklevel=2)
        else:
            paths["figure"] = out_dir / CONFUSION_HTML
            write_figure_html(figure, paths["figure"])
            figure_note = f"Interactive confusion matrix: {CONFUSION_HTML}"
    paths["markdown"].write_text(report_markdown(summary, figure_note), encoding="utf-8")
    return paths


def load_predictions(path: str | Path) -> list[Prediction]:
    """Read back a predictions.jsonl written by :func:`write_report`."""
    path = Path(path)
    with path.open(encoding="utf-8") as handle:
        return [Prediction(**json.loads(line)) for line in handle if line.strip()]
