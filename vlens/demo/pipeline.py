"""`run_demo`: the counting-circuit study end to end, one stage after another, into one report.

    from vlens.demo import run_demo
    outcome = run_demo("tiny", "demo_out", quick=True)   # report.html + results.json
    outcome.results["sections"]["counting_accuracy"]["numbers"]

The report opens with the paper's six findings, each shown or not shown on this model by an explicit
test on the results below (`vlens.demo.findings`). Stages: model summary -> data -> counting
evaluation (subitizing curve, confusion) -> attention over the image -> VAP layer x region and
layer x head -> the counting circuit (EAP-IG, exact faithfulness) -> the counting circuit as an attribution
graph (transcoders trained here, features from image cells to the count) -> logit lens -> HeadLens taxonomy ->
ablation Jaccard across tasks -> representation geometry -> interventions table.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from vlens.core.model import HookedVLM
from vlens.demo.ablation_stage import ablation_section
from vlens.demo.attention_stage import attention_sections
from vlens.demo.circuit_stage import circuit_sections
from vlens.demo.counting_stage import counting_sections
from vlens.demo.data_stage import counting_samples, data_section
from vlens.demo.findings import findings_section
from vlens.demo.geometry_stage import geometry_sections
from vlens.demo.graph_stage import graph_sections
from vlens.demo.interventions_stage import interventions_section
from vlens.demo.lens_stages import SHIPPED_LENS_DIR, headlens_section, logit_lens_section
from vlens.demo.model_stage import model_section, model_summary
from vlens.demo.patching_stage import patching_sections
from vlens.demo.report_sections import Section, key_numbers_section, write_outputs
from vlens.demo.settings import DemoSettings
from vlens.utils.provenance import note_run, seeds_of
from vlens.zoo import WEIGHTS_FOLDER
from vlens.zoo.specs import load_model

logger = logging.getLogger(__name__)

REPORT_TITLE = "vlens demo: the counting circuit"


@dataclass
class DemoOutcome:
    """Where the report and results went, the sections, and seconds per stage."""

    report_path: Path
    results_path: Path
    sections: list[Section]
    timings: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)  # process CPU seconds per stage

    @property
    def results(self) -> dict:
        return json.loads(self.results_path.read_text(encoding="utf-8"))


def model_folder(model_arg: str) -> Path | None:
    """The folder a `--model` value loads from (None for random-tiny or a hub id)."""
    if model_arg == "tiny":
        return WEIGHTS_FOLDER
    path = Path(model_arg)
    return path if path.is_dir() else None


def counting_evaluation(model: HookedVLM, settings: DemoSettings, progress: bool) -> list[Section]:
    """The counting evaluation on `settings.subitizing_per_count` images per count of each counting style."""
    n = settings.subitizing_per_count * len(settings.counts)
    return [section for style in settings.counting_styles()
            for section in counting_sections(model, counting_samples(settings, style, n), settings, progress, style)]


class _Stages:
    """Runs named stages in order, logging `[i/n] name ... done in s` and recording timings."""

    def __init__(self, n_stages: int, show: bool):
        self.n, self.index, self.show = n_stages, 0, show
        self.timings: dict[str, float] = {}
        self.cpu: dict[str, float] = {}  # process CPU seconds per stage (all threads): the work, whatever the load
        self.started = time.perf_counter()

    def run(self, name: str, fn: Callable, *args, **kwargs):
        self.index += 1
        if self.show:
            logger.info("[%d/%d] %s ...", self.index, self.n, name)
        start, cpu = time.perf_counter(), time.process_time()
        out = fn(*args, **kwargs)
        self.timings[name] = round(time.perf_counter() - start, 3)
        self.cpu[name] = round(time.process_time() - cpu, 3)
        if self.show:
            total = time.perf_counter() - self.started
            logger.info("[%d/%d] %s done in %.1f s (CPU %.1f s; stages so far %.1f s)", self.index, self.n, name,
                        self.timings[name], self.cpu[name], total)
        return out


def run_demo(model: str | HookedVLM = "tiny", out_dir: str | Path = "vlens_demo", quick: bool = False,
             interventions_file: str | Path | None = None, settings: DemoSettings | None = None,
             progress: bool = True, threads: int | None = None, load_options: dict | None = None) -> DemoOutcome:
    """Run every stage and write `report.html` + `results.json` into `out_dir`.

    Args:
        model: "tiny" (the embedded model), "random-tiny", a model folder / hub id, or a HookedVLM.
        quick: use `DemoSettings.quick()` (well under 5 minutes on 2 CPU cores; stages of 40-48 s of CPU with the
            embedded model) unless `settings` is given.
        interventions_file: a stored interventions JSON to show (default: `interventions.json` or
            `study.json` in the model folder; `vlens study --out DIR` measures one, DIR/study.json).
        progress: stage lines (logged at INFO by the `vlens.demo.pipeline` logger) and progress bars.
        threads: torch CPU threads (None: leave as is).
        load_options: keyword arguments of `vlens.load_model` (device, dtype, image_size, ...) when
            `model` is a spec.
    """
    settings = settings or (DemoSettings.quick() if quick else DemoSettings())
    settings.check()
    note_run(seeds_of(asdict(settings)))  # the stages' seeds, in results.json's provenance
    stored = Path(interventions_file) if interventions_file is not None else None
    if stored is not None and not stored.is_file():
        raise FileNotFoundError(f"--interventions {stored}: no such file")
    if threads is not None:
        torch.set_num_threads(threads)
    model_arg = model if isinstance(model, str) else None
    folder = model_folder(model_arg) if model_arg else None
    name = model_arg or type(model).__name__
    stages = _Stages(13 if model_arg else 12, progress)

    options = {"progress": progress, **(load_options or {})}
    hooked = stages.run("load model", load_model, model, **options) if isinstance(model, str) else model
    hooked.eval()
    settings = settings.for_model(hooked)  # images drawn at the size the model's processor pins
    samples = stages.run("generate data", counting_samples, settings)
    grid_inputs = hooked.prepare(images=[samples[0].image], prompts=[samples[0].question], chat=True)
    regions = grid_inputs.token_regions
    grid = tuple(regions.image_grid[0][0]) if regions.image_grid[0] else None
    summary = model_summary(hooked, name, folder)
    sections = [model_section(summary, grid, len(regions.images[0][0]) if regions.images[0] else None),
                data_section(samples, settings)]
    with torch.no_grad():
        sections += stages.run("counting evaluation", counting_evaluation, hooked, settings, progress)
        sections += stages.run("attention over the image", attention_sections, hooked, samples, settings)
        sections += stages.run("visual activation patching", patching_sections, hooked, settings, progress)
        sections += stages.run("counting circuit", circuit_sections, hooked, settings, progress)
    with torch.enable_grad():  # the graph's backward passes (transcoder training sets its own)
        sections += stages.run("attribution graph", graph_sections, hooked, samples, settings, out_dir, progress)
    with torch.no_grad():
        sections.append(stages.run("logit lens", logit_lens_section, hooked, samples, settings))
    lens_dir = folder / SHIPPED_LENS_DIR if folder is not None else None
    sections.append(stages.run("HeadLens taxonomy", headlens_section, hooked, settings, lens_dir, progress))
    with torch.no_grad():
        ablation = stages.run("ablation across tasks", ablation_section, hooked, settings, progress)
        sections.append(ablation)
        sections += stages.run("representation geometry", geometry_sections, hooked, samples, settings)
    sections.append(stages.run("interventions table", interventions_section, folder, stored, hooked))
    sections.insert(1, key_numbers_section(sections))
    sections.insert(1, findings_section(sections))  # the paper's six findings, each shown or not by its test

    intro = (f"Model: {summary['summary']}. Settings: {'quick' if quick else 'full'} "
             f"({settings.n_count_images} counting images, {settings.n_pairs} pairs, "
             f"{len(settings.ablation_tasks)} ablation tasks). Every number shown is in results.json under the "
             "section's key.")
    report_path, results_path = stages.run(
        "write report", write_outputs, sections, out_dir, REPORT_TITLE, intro, summary, settings.to_dict(),
        stages.timings)
    timings = dict(stages.timings)
    timings["total"] = round(time.perf_counter() - stages.started, 3)  # the stages
    document = json.loads(results_path.read_text(encoding="utf-8"))
    document["timings_s"] = timings  # include the report-writing stage and the total
    document["cpu_s"] = dict(stages.cpu)
    results_path.write_text(json.dumps(document, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    return DemoOutcome(report_path, results_path, sections, timings, dict(stages.cpu))
