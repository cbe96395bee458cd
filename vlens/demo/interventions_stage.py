"""Stage 9 (interventions): baseline / +SFT / +SFT+L_focus / +SFT+L_focus+beta.

The table comes from a stored study shipped with the model (`interventions.json` or
`study.json` in the model folder, as `vlens study` writes it: its "rows"), or from a file
given with `--interventions`. To measure one for another model, run `vlens study --model M
--out DIR` and pass `--interventions DIR/study.json`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from vlens.demo.report_sections import Section
from vlens.utils.errors import UserInputError
from vlens.utils.fileio import read_json_file
from vlens.utils.provenance import same_weights
from vlens.utils.stats import spread
from vlens.viz.optional import require_plotly

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM


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
            raise UserInputError("the interventions file has no rows: expected a study.json, a list of rows or "
                             "{setting: {metric: value}}")
        return [{"setting": str(name), **{k: v for k, v in values.items() if _scalar(v)}}
                for name, values in candidates.items()]
    if isinstance(data, list) and data and all(isinstance(row, Mapping) for row in data):
        rows = []
        for index, row in enumerate(data):
            name = next((str(row[f]) for f in NAME_FIELDS if f in row), f"row {index}")
            rows.append({"setting": name, **{k: v for k, v in row.items() if k not in NAME_FIELDS and _scalar(v)}})
        return rows
    if isinstance(data, list) and data:  # before: "has no rows" of a list that had some
        bad = next(i for i, row in enumerate(data) if not isinstance(row, Mapping))
        raise UserInputError(f"the interventions file's row {bad} is a {type(data[bad]).__name__}, not an object "
                             "{\"setting\": ..., metric: value}: give one object per row (or a study.json)")
    raise UserInputError("the interventions file has no rows: expected a study.json, a list of rows or "
                     "{setting: {metric: value}}")


def _accuracy_columns(rows: list[dict]) -> list[str]:
    columns = list(dict.fromkeys(k for row in rows for k in row if k == "accuracy" or k.endswith(" accuracy")))
    return [c for c in columns if all(isinstance(row.get(c), int | float) for row in rows)]


def _study(raw) -> bool:
    """A `vlens study` file: settings (conditions, eval_sets) and per-seed results."""
    return (isinstance(raw, Mapping) and isinstance(raw.get("settings"), Mapping)
            and "conditions" in raw["settings"] and "eval_sets" in raw["settings"]
            and isinstance(raw.get("results"), Mapping))


def seed_spread(raw) -> dict[tuple[str, str], dict]:
    """For a study file: (setting, evaluation set) -> `vlens.utils.stats.spread` of the accuracy over seeds."""
    if not _study(raw):
        return {}
    labels = raw.get("labels") or {}
    out = {}
    for condition in raw["settings"]["conditions"]:
        for name in raw["settings"]["eval_sets"]:
            values = [rows.get(condition, {}).get(name, {}).get("accuracy") for rows in raw["results"].values()]
            out[(labels.get(condition, condition), name)] = spread([v for v in values if v is not None])
    return out


def temperature_note(raw) -> str:
    """What the head temperature did, from the stored fits: how many selected heads beta changed."""
    temperatures = raw.get("temperatures") if isinstance(raw, Mapping) else None
    if not temperatures:
        return ""
    parts = []
    for seed, fit in temperatures.items():
        floor, alpha = fit.get("floor"), fit.get("alpha")
        heads = fit.get("heads", [])
        floored = [h for h in heads if floor is not None and alpha * h["gamma"] < floor]
        parts.append(f"seed {seed}: {len(heads) - len(floored)} of {len(heads)}")
    fit = next(iter(temperatures.values()))
    return (f" beta = max({fit.get('floor')}, alpha * gamma) with alpha {fit.get('alpha')}: heads whose alpha * gamma "
            f"falls below the floor are selected but left unchanged; heads actually sharpened: "
            f"{'; '.join(parts)}.")


def provenance_note(raw, model: HookedVLM | None = None) -> str:
    """Says that a stored table is stored (not re-measured here), when and on which weights it was measured."""
    stored = raw.get("provenance") if isinstance(raw, Mapping) else None
    if not stored:
        return (" Stored table, not re-measured by this run; the file does not record when or on which weights it "
                "was measured (measure one with `vlens study`).")
    when = f"measured {stored.get('written_at') or stored.get('measured_at') or 'at an unrecorded time'}"
    commit_id = stored.get("git_commit") or stored.get("commit")
    commit = f" at commit {commit_id}" if commit_id else ""
    match = None if model is None else same_weights(stored, model)
    weights = {True: "on the weights loaded now", False: "on OTHER weights than the ones loaded now (stale)",
               None: "on weights it does not identify"}[match]
    return f" Stored table, not re-measured by this run: {when}{commit}, {weights}."


def _section_from_rows(rows: list[dict], source: str, raw, model: HookedVLM | None = None) -> Section:
    go = require_plotly()
    columns = _accuracy_columns(rows)
    spreads = seed_spread(raw)
    numbers: dict = {"source": source, "settings compared": len(rows)}
    figure = None
    if columns:
        traces = []
        for row in rows:
            names = [c.removesuffix(" accuracy") or c for c in columns]
            values = [row[c] for c in columns]
            ranges = [spreads.get((row["setting"], name)) for name in names]
            errors = None
            known = [r for r in ranges if r and r["n"] > 1]
            if len(known) == len(ranges):  # min..max over seeds, for every bar
                errors = {"type": "data", "symmetric": False,
                          "array": [r["max"] - v for r, v in zip(known, values, strict=True)],
                          "arrayminus": [v - r["min"] for r, v in zip(known, values, strict=True)],
                          "thickness": 1.2, "width": 2}
            # No text on the bars: grouped labels of equal values ran into each other ("0.990.990.99");
            # the table under the figure has the numbers.
            traces.append(go.Bar(name=row["setting"], x=names, y=values, error_y=errors,
                                 hovertemplate=f"{row['setting']}<br>%{{x}}: %{{y:.3f}}<extra></extra>"))
        figure = go.Figure(traces)
        seeds = next(iter(spreads.values()))["n"] if spreads else 1
        title = "Accuracy per intervention and evaluation set" + (f" (bars: min-max over {seeds} seeds)"
                                                                  if seeds > 1 else "")
        figure.update_layout(barmode="group", title=title, bargap=0.25,
                             yaxis={"title": "accuracy", "range": [0, 1.05]}, xaxis={"title": "evaluation set"},
                             legend={"orientation": "h", "y": -0.3})
        headline = columns[0]
        numbers.update({f"{row['setting']}: {headline}": row[headline] for row in rows})
        for row in rows:
            spread_ = spreads.get((row["setting"], headline.removesuffix(" accuracy")))
            if spread_ and spread_["n"] > 1:
                numbers[f"{row['setting']}: {headline} seed range"] = f"{spread_['min']:.3f}-{spread_['max']:.3f}"
    explanation = EXPLANATION + temperature_note(raw) + provenance_note(raw, model)
    definitions = {"MAE": "mean absolute error of the parsed count"} if any(
        k.endswith("MAE") for row in rows for k in row) else {}
    stored = raw.get("provenance") if isinstance(raw, Mapping) else None
    match = None if model is None or not stored else same_weights(stored, model)
    return Section(key="interventions", title=TITLE, explanation=explanation, figure=figure, table=_shown(rows),
                   definitions={"acc": "accuracy (share of exact answers)", **definitions}, numbers=numbers,
                   data={"source": source, "rows": rows, "stored": raw, "weights_match": match,
                         "seed_spread": {f"{k[0]} | {k[1]}": v for k, v in spreads.items()}})


def _shown(rows: list[dict]) -> list[dict]:
    """Table rows as displayed: "acc" for "accuracy", 3 decimals, and setting names that may wrap
    before each "+" (a zero-width space), so twelve columns fit the page without breaking a word."""
    def shown(key, value):
        if isinstance(value, float):
            return round(value, 3)
        if key == "setting" and isinstance(value, str):
            return value[:1] + value[1:].replace("+", "\u200b+")
        return value

    return [{key.replace(" accuracy", " acc"): shown(key, value) for key, value in row.items()} for row in rows]


def find_stored(model_dir: Path | None) -> Path | None:
    """The first stored study file in the model folder, if any."""
    if model_dir is None:
        return None
    return next((model_dir / name for name in STORED_FILES if (model_dir / name).is_file()), None)


def interventions_section(model_dir: Path | None, stored: Path | None = None, model: HookedVLM | None = None) -> Section:
    """The stored interventions table, or a skipped section naming where it looked and how to measure one.

    model: the model under study; the section says whether the stored table was measured on its weights.
    """
    path = stored or find_stored(model_dir)
    if path is None:
        where = (" or ".join(str(model_dir / name) for name in STORED_FILES) if model_dir is not None
                 else "the model folder (this model has none)")
        return Section.skipped("interventions", TITLE, EXPLANATION,
                               f"no stored interventions study at {where}; measure one with `vlens study --out DIR` "
                               "and pass --interventions DIR/study.json")
    raw = read_json_file(path, "the interventions study")
    # the model folder's own file is named relative to the folder (no machine-specific absolute path)
    source = (f"{path.name} in the model folder ({model_dir.name})"
              if model_dir is not None and path.parent.resolve() == Path(model_dir).resolve() else str(path))
    return _section_from_rows(interventions_rows(raw), source, raw, model)
