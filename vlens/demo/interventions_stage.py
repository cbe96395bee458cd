"""Stage 9 (interventions): baseline / +SFT / +SFT+L_focus / +SFT+L_focus+beta on counting.

Read from a stored results file shipped with the model (`interventions.json` in the model
folder), or, with `--train`, measured here by a small study: LoRA SFT without and with
L_focus (vlens.training), then the adaptive head temperature (vlens.interventions.temperature)
fitted on the counting heads' ablation importance.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from vlens.demo.report_sections import Section

INTERVENTIONS_FILE = "interventions.json"
ARMS = ("baseline", "+SFT", "+SFT+L_focus", "+SFT+L_focus+beta")
TITLE = "Interventions on counting"
EXPLANATION = ("Counting accuracy of the model as is, after LoRA SFT, after SFT with the object-focus attention loss "
               "L_focus, and with the adaptive head temperature (beta) on top.")
NAME_FIELDS = ("setting", "name", "arm", "method", "variant")


def _scalar(value) -> bool:
    return value is None or isinstance(value, bool | int | str) or (isinstance(value, float) and math.isfinite(value))


def interventions_rows(data) -> list[dict]:
    """Table rows (`{"setting": name, metric: value, ...}`) from a stored interventions file.

    Accepted shapes: a list of row dicts; `{"rows": [...]}`; or a mapping `{setting: {metric: value}}`,
    possibly under "arms" / "results" / "settings". Non-scalar fields are left out of the table.
    """
    if isinstance(data, Mapping):
        for key in ("rows", "table", "arms", "results"):
            if key in data:
                return interventions_rows(data[key])
        candidates = {k: v for k, v in data.items() if isinstance(v, Mapping)}
        if not candidates:
            raise ValueError("the interventions file has no rows: expected a list of rows or {setting: {metric: value}}")
        return [{"setting": str(name), **{k: v for k, v in values.items() if _scalar(v)}}
                for name, values in candidates.items()]
    if isinstance(data, list) and data and all(isinstance(row, Mapping) for row in data):
        rows = []
        for index, row in enumerate(data):
            name = next((str(row[f]) for f in NAME_FIELDS if f in row), f"row {index}")
            rows.append({"setting": name, **{k: v for k, v in row.items() if k not in NAME_FIELDS and _scalar(v)}})
        return rows
    raise ValueError("the interventions file has no rows: expected a list of rows or {setting: {metric: value}}")


def stored_interventions_path(model_dir: Path | None) -> Path | None:
    return None if model_dir is None else model_dir / INTERVENTIONS_FILE


def _section_from_rows(rows: list[dict], source: str, raw) -> Section:
    from vlens.viz._optional import require_plotly

    go = require_plotly()
    numbers = {"source": source}
    figure = None
    if all(isinstance(row.get("accuracy"), int | float) for row in rows):
        figure = go.Figure(go.Bar(x=[row["setting"] for row in rows], y=[row["accuracy"] for row in rows],
                                  text=[f"{row['accuracy']:.3f}" for row in rows], textposition="outside"))
        figure.update_layout(title="Counting accuracy per intervention", yaxis={"title": "accuracy", "range": [0, 1.05]})
        numbers.update({f"{row['setting']} accuracy": row["accuracy"] for row in rows})
    else:
        numbers["settings"] = len(rows)
    return Section(key="interventions", title=TITLE, explanation=EXPLANATION, figure=figure, table=rows,
                   numbers=numbers, data={"source": source, "rows": rows, "stored": raw})


def interventions_section(model_dir: Path | None, stored: Path | None = None) -> Section:
    """The stored interventions table, or a skipped section naming the missing file and `--train`."""
    path = stored or stored_interventions_path(model_dir)
    if path is None or not path.is_file():
        where = str(path) if path is not None else "the model folder (this model has none)"
        return Section.skipped("interventions", TITLE, EXPLANATION,
                               f"no stored interventions results at {where}; run `vlens demo --train` to measure "
                               "a small study here, or pass --interventions FILE")
    raw = json.loads(path.read_text(encoding="utf-8"))
    return _section_from_rows(interventions_rows(raw), str(path), raw)


def train_interventions_section(load_model: Callable[[], object], samples, settings, importance_source,
                                sft_steps: int = 30, progress: bool = True) -> Section:
    """Measure the four arms here (small): each SFT arm starts from a freshly loaded model.

    load_model: returns a new copy of the model under study (training changes it in place).
    samples: the demo's counting samples (the evaluation set).
    importance_source: an ablation report (or anything `importance_from_result` reads) for beta.
    """
    from vlens.demo.counting_stage import evaluate_counting
    from vlens.evaluation import HookedVLMBackend
    from vlens.interventions.temperature import fit_temperature, importance_from_result
    from vlens.lens.corpus import task_samples
    from vlens.training.data import example_from_sample
    from vlens.training.sft import SFTConfig, train_sft

    train = [example_from_sample(image, record)
             for image, _, record in task_samples(max(32, settings.n_count_images), seed=settings.seed + 7_000_001,
                                                  size=settings.image_size, tasks=("counting",))]
    rows = []

    def add(name: str, model, hooks=(), extra=None):
        result = evaluate_counting(model, samples, settings, backend=HookedVLMBackend(model, fwd_hooks=hooks),
                                   progress=progress)
        rows.append({"setting": name, "accuracy": result.metrics.accuracy, "MAE": result.metrics.mae,
                     "n": result.metrics.n, **(extra or {})})

    add("baseline", load_model())
    with tempfile.TemporaryDirectory() as tmp:
        for name, focus in (("+SFT", 0.0), ("+SFT+L_focus", 1.0)):
            model = load_model()
            config = SFTConfig(focus_weight=focus, learning_rate=1e-3, max_steps=sft_steps, batch_size=4,
                               lora_rank=8, checkpoint_every=sft_steps, seed=settings.seed)
            report = train_sft(model, train, config, out_dir=Path(tmp) / name.strip("+"), resume=False,
                               progress=progress)
            extra = {"steps": report.steps, "final SFT loss": report.final_sft_loss}
            if focus:
                add(name, model, extra=extra)
                importance = importance_from_result(importance_source, task="counting")
                temperature = fit_temperature(importance, top_k=8)
                add("+SFT+L_focus+beta", model, hooks=temperature.hooks(model),
                    extra={"steps": report.steps, "heads sharpened": len(temperature.betas)})
            else:
                add(name, model, extra=extra)
    rows.sort(key=lambda row: ARMS.index(row["setting"]))
    return _section_from_rows(rows, f"measured here (--train): {sft_steps} LoRA steps per SFT arm, "
                                    f"lr 1e-3, rank 8, {len(train)} training images", {"rows": rows})
