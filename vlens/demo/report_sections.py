"""The demo report's sections: one `Section` per figure, mirrored in `results.json` under its key.

Every section has a title, a one-line explanation, (usually) a figure, headline numbers shown
under it, and `data` (the full arrays behind the figure) that go to `results.json` only.
A stage that cannot run on the given model still produces its section, marked skipped with
the reason, so the report never silently loses a part.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from vlens.demo.results import DemoResults
from vlens.utils.errors import UserInputError
from vlens.utils.provenance import stamp
from vlens.viz.report import Report

SCHEMA_VERSION = 1


@dataclass
class Section:
    """One report section (see `vlens.viz.Report.add_section` for figure/image/html/table).

    key: its key in `results.json["sections"]`; numbers: scalars shown under the figure;
    data: the arrays behind the figure (results.json only); status: "ok" or "skipped".
    """

    key: str
    title: str
    explanation: str
    figure: Any = None  # a plotly Figure (viz extra)
    image: Image.Image | None = None
    html: object = None
    table: list[dict] | None = None
    definitions: dict = field(default_factory=dict)
    numbers: dict = field(default_factory=dict)
    data: dict = field(default_factory=dict)
    status: str = "ok"
    reason: str | None = None

    @classmethod
    def skipped(cls, key: str, title: str, explanation: str, reason: str) -> Section:
        """A section whose stage could not run: the report says why instead of showing a figure."""
        return cls(key, title, explanation, numbers={"skipped": reason}, status="skipped", reason=reason)

    def to_dict(self) -> dict:
        out = {"title": self.title, "explanation": self.explanation, "status": self.status,
               "numbers": jsonable(self.numbers), "data": jsonable(self.data)}
        if self.reason is not None:
            out["reason"] = self.reason
        if self.definitions:
            out["definitions"] = dict(self.definitions)
        return out


def jsonable(value):
    """Tensors, numpy arrays and scalars -> plain JSON (NaN / inf -> None); dict keys -> str."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().tolist()
    elif isinstance(value, np.ndarray | np.generic):
        value = value.tolist()
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, bool | int | str):
        return value
    return str(value)


def build_report(sections: list[Section], title: str, intro: str):
    """A `vlens.viz.Report` with one section per `Section` (skipped ones say so in their text)."""
    report = Report(title, intro)
    for section in sections:
        explanation = section.explanation
        if section.status != "ok":
            explanation = f"{explanation} — Not shown: {section.reason}"
        report.add_section(section.title, explanation, figure=section.figure, html=section.html,
                           image=section.image, table=section.table, numbers=_shown_numbers(section.numbers),
                           definitions=section.definitions)
    return report


def _shown_numbers(numbers: Mapping) -> dict:
    """Scalars rounded for display; the exact values stay in results.json."""
    shown = {}
    for key, value in numbers.items():
        value = jsonable(value)
        if isinstance(value, float):
            value = round(value, 4)
        shown[key] = value if value is None or isinstance(value, bool | int | float | str) else json.dumps(value)
    return shown


def results_document(sections: list[Section], model: dict, settings: dict, timings: dict) -> dict:
    """What `results.json` holds: the model, the settings, stage timings, and every section by key."""
    keys = [s.key for s in sections]
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    if duplicates:
        raise UserInputError(f"duplicate section keys {duplicates}: give each section its own key")
    return DemoResults(schema_version=SCHEMA_VERSION, model=jsonable(model), settings=jsonable(settings),
                       timings_s=jsonable(timings), section_order=keys,
                       sections={s.key: s.to_dict() for s in sections}).to_dict()


def write_outputs(sections: list[Section], out_dir: str | Path, title: str, intro: str, model: dict,
                  settings: dict, timings: dict) -> tuple[Path, Path]:
    """Write `report.html` and `results.json` into `out_dir`; returns both paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    report_path = build_report(sections, title, intro).write(out_dir / "report.html")
    results_path = out_dir / "results.json"
    document = stamp(results_document(sections, model, settings, timings))
    results_path.write_text(json.dumps(document, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    return report_path, results_path


# (section key, headline number) picked for the summary at the top of the report
KEY_NUMBERS: tuple[tuple[str, str], ...] = (
    ("counting_accuracy", "accuracy"),
    ("counting_accuracy", "subitizing limit (acc >= 0.8)"),
    ("attention_share", "top head"),
    ("vap_layer_region", "image: max rate"),
    ("vap_layer_region", "handover layer (final > image)"),
    ("counting_circuit", "circuit edges"),
    ("attribution_graph", "replacement score"),
    ("logit_lens", "first layer with median rank 1"),
    ("ablation_jaccard", "mean off-diagonal Jaccard"),
    ("geometry_pca", "most count-ordered layer"),
)
# the numbers shown next to a headline: its interval, or what it must be compared with
KEY_CONTEXT: dict[tuple[str, str], tuple[str, ...]] = {
    ("counting_accuracy", "accuracy"): ("accuracy 95% CI",),
    ("attention_share", "top head"): ("heads within 0.01 of the top", "top head stays top (bootstrap share)"),
    ("vap_layer_region", "image: max rate"): ("image: max rate 95% CI",),
    ("counting_circuit", "circuit edges"): ("graph edges", "faithfulness 95% CI"),
    ("attribution_graph", "replacement score"): ("completeness score",),
    ("vap_layer_region", "handover layer (final > image)"): ("handover layer 95% interval",
                                                             "handover present (bootstrap share)"),
    ("ablation_jaccard", "mean off-diagonal Jaccard"): ("chance Jaccard (random top-k sets)",
                                                        "counting test-retest Jaccard"),
    ("geometry_pca", "most count-ordered layer"): ("counts 1-4 centroid accuracy", "counts >= 5 centroid accuracy"),
}


def _short(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def key_numbers_section(sections: list[Section]) -> Section:
    """A table of one headline number per stage (copied from the sections it names)."""
    by_key = {s.key: s for s in sections}
    rows, numbers, sources = [], {}, {}
    for key, name in KEY_NUMBERS:
        section = by_key.get(key)
        if section is None or section.status != "ok" or name not in section.numbers:
            continue
        label = f"{section.title}: {name}"
        context = "; ".join(f"{other}: {_short(jsonable(section.numbers[other]))}"
                            for other in KEY_CONTEXT.get((key, name), ()) if other in section.numbers)
        rows.append({"section": section.title, "number": name, "value": jsonable(section.numbers[name]),
                     "interval / compare with": context or "-"})
        numbers[label] = section.numbers[name]
        sources[label] = key
    return Section(
        key="key_numbers",
        title="Key numbers at a glance",
        explanation="One headline number from each stage below (each is explained in its own section).",
        table=rows or [{"section": "-", "number": "no stage produced numbers", "value": None}],
        numbers=numbers,
        data={"source_sections": sources},
    )
