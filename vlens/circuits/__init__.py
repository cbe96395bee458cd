"""Circuits as graphs: edge attribution (EAP, EAP-IG), exact edge patching, circuits with measured
faithfulness, and attribution maps over the image.

    from vlens.circuits import edge_attribution, extract_circuit, path_patch
    from vlens.patching import make_count_pairs
    pairs = make_count_pairs(16)
    scores = edge_attribution(model, pairs, method="eap-ig")        # every edge, one backward per step
    exact = path_patch(model, pairs, [name for name, _ in scores.top(10)])   # those edges, exactly
    circuit = extract_circuit(model, pairs, scores=scores, target=0.9)
    circuit.plot().show(); circuit.save("out/")

Submodules: `graph` (nodes, receivers, edges, names), `runs` (what a run records, the metric),
`gradients` (dM/d receiver input), `attribution` (EAP / EAP-IG), `path_patching` (exact edge
patching), `extraction` (circuits and faithfulness), `image_attribution` (per image-token scores),
`results`.
"""

from vlens.circuits.attribution import METHODS, edge_attribution
from vlens.circuits.extraction import (
    Circuit,
    CircuitSettings,
    extract_circuit,
    faithfulness,
    faithfulness_interval,
)
from vlens.circuits.graph import CircuitGraph, InputNode, Receiver
from vlens.circuits.image_attribution import ImageAttribution, image_attribution
from vlens.circuits.path_patching import Condition, path_patch, run_conditions
from vlens.circuits.results import EdgeScores, PathPatchResult

__all__ = [
    "METHODS",
    "Circuit",
    "CircuitSettings",
    "CircuitGraph",
    "Condition",
    "EdgeScores",
    "ImageAttribution",
    "InputNode",
    "PathPatchResult",
    "Receiver",
    "edge_attribution",
    "extract_circuit",
    "faithfulness",
    "faithfulness_interval",
    "image_attribution",
    "path_patch",
    "run_conditions",
]
