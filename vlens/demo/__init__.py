"""`vlens demo`: the counting-circuit study end to end on one model, written as one HTML report.

    from vlens.demo import run_demo
    outcome = run_demo("tiny", "demo_out", quick=True)
    outcome.report_path, outcome.results["sections"].keys()

Each stage is one module (data, counting, attention, patching, lenses, ablation, geometry,
interventions) built on the public APIs of the feature packages; `report_sections` turns
their `Section`s into the report and `results.json`.
"""

from vlens.demo.pipeline import DemoOutcome, run_demo
from vlens.demo.report_sections import Section
from vlens.demo.settings import DemoSettings

__all__ = ["DemoOutcome", "DemoSettings", "Section", "run_demo"]
