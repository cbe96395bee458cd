"""Attribution graphs: which transcoder features carry an image-text prompt to its answer (docs/graphs.md).

- ``replacement``: `ReplacementModel` (MLPs -> transcoders + error, attention and norms frozen).
- ``linear``: the linearised model's forward and its batched backward passes.
- ``attribution``: `attribution_graph(replacement, inputs, target="5", contrast="4", GraphSettings(...))`.
- ``pruning``: influence, pruning, replacement and completeness scores (circuit-tracer's definitions).
- ``results``: `AttributionGraph` (results.json, graph.json in circuit-tracer's schema, graph.html).
- ``interventions``: features set / scaled / zeroed in the replacement and the real model.
- ``examples``: each feature's top image patches and text tokens over a dataset (the viewer's cards).
"""

from vlens.graphs.attribution import GraphSettings, attribution_graph
from vlens.graphs.examples import ExampleSettings, attach_examples, dataset_examples
from vlens.graphs.interventions import FeatureEdit, InterventionResult, edits_for, intervene
from vlens.graphs.replacement import PromptRun, ReplacementModel, linear_problem
from vlens.graphs.results import AttributionGraph

__all__ = ["AttributionGraph", "ExampleSettings", "FeatureEdit", "GraphSettings", "InterventionResult", "PromptRun", "ReplacementModel",
           "attach_examples", "attribution_graph", "dataset_examples", "edits_for", "intervene", "linear_problem"]
