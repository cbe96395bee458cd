"""Stage 9 (interventions): baseline / +SFT / +SFT+L_focus / +SFT+L_focus+beta.

The table comes from a stored study shipped with the model (`interventions.json` or
`study.json` in the model folder, as `vlens study` writes it: its "rows"), or from a file
given with `--interventions`. To measure one for another model, run `vlens study --model M
--out DIR` and pass `--interventions DIR/study.json`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

from vlens.demo.report_sections import Section
from vlens.viz.optional import require_plotly

STORED_FILES = ("interventions.json", "study.json")
TITLE = "Interventions: baseline / +SFT / +SFT+L_focus / +SFT+L_focus+beta"
EXPLANATION = ("Accuracy of the model as is, after LoRA SFT on counting, after SFT with the object-focus attention "
               "loss L_focus, and with the adaptive head temperature (beta) on top, per evaluation set.")
NAME_FIELDS = ("setting", "name", "arm", "method", "variant", "condition")


def _scalar(value) -> bool:
    return value is None or isinstance(value, bool | int | str) or (isinstance(value, float) and math.isfinite(value))


def interventions_rows(data) -> list[dict]:
    """Table rows (`{"setting": name, metric: value, ...}`) from a stored interventions file.

    Accepted shapes: a study.json (`vlens study`: its "rows"); a list of row dicts; `{"rows": [...]}`;
    or a mapping `{setting: {metric: value}}`, possibly under "arms" / "results". Non-scalar
    fields are left out of the table.
    """
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
    """The stored interventions table, or a skipped section naming where it looked and how to measure one."""
    path = stored or find_stored(model_dir)
    if path is None:
        where = (" or ".join(str(model_dir / name) for name in STORED_FILES) if model_dir is not None
                 else "the model folder (this model has none)")
        return Section.skipped("interventions", TITLE, EXPLANATION,
                               f"no stored interventions study at {where}; measure one with `vlens study --out DIR` "
                               "and pass --interventions DIR/study.json")
    raw = json.loads(path.read_text(encoding="utf-8"))
    return _section_from_rows(interventions_rows(raw), str(path), raw)
