"""Stage 9 (interventions): baseline / +SFT / +SFT+L_focus / +SFT+L_focus+beta.

The table comes from a stored study shipped with the model (`interventions.json` or
`study.json` in the model folder, as written by `vlens.training.study`), from a file given
with `--interventions`, or, with `--train`, from a small `vlens.training.study.run_study`
measured here.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from vlens.demo.report_sections import Section
from vlens.demo.settings import DemoSettings

STORED_FILES = ("interventions.json", "study.json")
TITLE = "Interventions: baseline / +SFT / +SFT+L_focus / +SFT+L_focus+beta"
EXPLANATION = ("Accuracy of the model as is, after LoRA SFT on counting, after SFT with the object-focus attention "
               "loss L_focus, and with the adaptive head temperature (beta) on top, per evaluation set.")
NAME_FIELDS = ("setting", "name", "arm", "method", "variant", "condition")
TRAIN_EVAL_SETS = ("synreal", "syndot", "colour")


def _scalar(value) -> bool:
    return value is None or isinstance(value, bool | int | str) or (isinstance(value, float) and math.isfinite(value))


def _is_study(data) -> bool:
    """A `vlens.training.study.StudyResult` as JSON: settings (conditions, eval_sets) + results[seed]."""
    return (isinstance(data, Mapping) and isinstance(data.get("settings"), Mapping)
            and "conditions" in data["settings"] and "eval_sets" in data["settings"]
            and isinstance(data.get("results"), Mapping))


def study_rows(study) -> list[dict]:
    """One row per condition of a `StudyResult`: accuracy (and MAE for counting sets), mean over seeds."""
    from vlens.training.study import CONDITIONS, SET_ROLES

    rows = []
    for condition in study.settings["conditions"]:
        row = {"setting": CONDITIONS.get(condition, condition)}
        for name in study.settings["eval_sets"]:
            row[f"{name} accuracy"] = study.mean(condition, name, "accuracy")
            if name in SET_ROLES:
                row[f"{name} MAE"] = study.mean(condition, name, "mae")
        rows.append(row)
    return rows


def interventions_rows(data) -> list[dict]:
    """Table rows (`{"setting": name, metric: value, ...}`) from a stored interventions file.

    Accepted shapes: a `StudyResult` JSON (study.json); a list of row dicts; `{"rows": [...]}`;
    or a mapping `{setting: {metric: value}}`, possibly under "arms" / "results". Non-scalar
    fields are left out of the table.
    """
    if _is_study(data):
        from vlens.training.study import StudyResult

        fields = {k: data[k] for k in ("settings", "results", "training", "temperatures", "wall_time_s", "model")
                  if k in data}
        fields["results"] = {int(k): v for k, v in data["results"].items()}
        return study_rows(StudyResult(**fields))
    if isinstance(data, Mapping):
        for key in ("rows", "table", "arms", "results"):
            if key in data:
                return interventions_rows(data[key])
        candidates = {k: v for k, v in data.items() if isinstance(v, Mapping)}
        if not candidates:
            raise ValueError("the interventions file has no rows: expected a study.json, a list of rows or "
                             "{setting: {metric: value}}")
        return [{"setting": str(name), **{k: v for k, v in values.items() if _scalar(v)}}
                for name, values in candidates.items()]
    if isinstance(data, list) and data and all(isinstance(row, Mapping) for row in data):
        rows = []
        for index, row in enumerate(data):
            name = next((str(row[f]) for f in NAME_FIELDS if f in row), f"row {index}")
            rows.append({"setting": name, **{k: v for k, v in row.items() if k not in NAME_FIELDS and _scalar(v)}})
        return rows
    raise ValueError("the interventions file has no rows: expected a study.json, a list of rows or "
                     "{setting: {metric: value}}")


def _accuracy_columns(rows: list[dict]) -> list[str]:
    columns = list(dict.fromkeys(k for row in rows for k in row if k == "accuracy" or k.endswith(" accuracy")))
    return [c for c in columns if all(isinstance(row.get(c), int | float) for row in rows)]


def _section_from_rows(rows: list[dict], source: str, raw) -> Section:
    from vlens.viz.optional import require_plotly

    go = require_plotly()
    columns = _accuracy_columns(rows)
    numbers: dict = {"source": source, "settings compared": len(rows)}
    figure = None
    if columns:
        figure = go.Figure([go.Bar(name=row["setting"], x=[c.removesuffix(" accuracy") or c for c in columns],
                                   y=[row[c] for c in columns], text=[f"{row[c]:.2f}" for c in columns],
                                   textposition="outside") for row in rows])
        figure.update_layout(barmode="group", title="Accuracy per intervention and evaluation set",
                             yaxis={"title": "accuracy", "range": [0, 1.1]}, xaxis={"title": "evaluation set"})
        headline = columns[0]
        numbers.update({f"{row['setting']}: {headline}": row[headline] for row in rows})
    return Section(key="interventions", title=TITLE, explanation=EXPLANATION, figure=figure, table=rows,
                   numbers=numbers, data={"source": source, "rows": rows, "stored": raw})


def find_stored(model_dir: Path | None) -> Path | None:
    """The first stored study file in the model folder, if any."""
    if model_dir is None:
        return None
    return next((model_dir / name for name in STORED_FILES if (model_dir / name).is_file()), None)


def interventions_section(model_dir: Path | None, stored: Path | None = None) -> Section:
    """The stored interventions table, or a skipped section naming where it looked and `--train`."""
    path = stored or find_stored(model_dir)
    if path is None:
        where = (" or ".join(str(model_dir / name) for name in STORED_FILES) if model_dir is not None
                 else "the model folder (this model has none)")
        return Section.skipped("interventions", TITLE, EXPLANATION,
                               f"no stored interventions study at {where}; run `vlens demo --train` to measure a "
                               "small one here, or pass --interventions FILE")
    raw = json.loads(path.read_text(encoding="utf-8"))
    return _section_from_rows(interventions_rows(raw), str(path), raw)


def train_interventions_section(load_model: Callable[[], object], settings: DemoSettings, n_train_per_style: int = 16,
                                progress: bool = True, model_name: str = "") -> Section:
    """Measure the four conditions here with a small `run_study` (each SFT arm on a fresh copy).

    load_model: returns a new copy of the model under study (training changes it in place).
    n_train_per_style: SynDot + SynPoly counting images to fine-tune on (each style).
    """
    from vlens.training.study import StudySettings, run_study

    study_settings = StudySettings(n_train_per_style=n_train_per_style, n_eval=max(10, settings.n_count_images // 4),
                                   image_size=settings.image_size, importance_examples=8,
                                   eval_batch_size=settings.batch_size, eval_sets=list(TRAIN_EVAL_SETS),
                                   seeds=[settings.seed])
    with tempfile.TemporaryDirectory() as tmp:
        result = run_study(load_model, study_settings, out_dir=tmp, progress=progress, model_name=model_name)
    source = (f"measured here (--train): {2 * n_train_per_style} counting images for SFT, {study_settings.n_eval} "
              f"per evaluation set, {study_settings.lora_rank}-rank LoRA, lr {study_settings.learning_rate}")
    return _section_from_rows(study_rows(result), source, result.to_json())
