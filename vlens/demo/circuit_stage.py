"""Stage (circuits): the counting circuit as a graph, scored by EAP-IG, its faithfulness measured exactly."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from vlens.circuits import CircuitSettings, edge_attribution, extract_circuit
from vlens.circuits.runs import thumbnail
from vlens.demo.report_sections import Section
from vlens.demo.settings import DemoSettings
from vlens.parallel.options import SweepOptions
from vlens.patching import build_pair_batch, make_count_pairs
from vlens.utils.stats import format_interval

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM


CIRCUIT_TITLE = "The counting circuit: edges from image regions through heads and MLPs to the answer"
CIRCUIT_EXPLANATION = (
    "Every edge of the decoder's graph (image tokens and text, each head's queries / keys / values, each MLP, the "
    "logits) is scored by EAP-IG: the change of the logit difference (corrupt minus clean answer) if that edge "
    "alone read the corrupt image's run, integrated from the corrupt to the clean input. The circuit is the smallest "
    "set of top-scored edges whose faithfulness, measured exactly by patching every other edge from the corrupt run, "
    "reaches the target (1 = the circuit alone gives the full model's answer margin, 0 = as if the image were the "
    "corrupt one; 95% bootstrap interval over pairs). Lines: red where the score is positive, width by |score|; "
    "queries dotted, keys dashed; image-token nodes sit on the first pair's clean image.")
TOP_EDGES = 8  # edges listed in the section's numbers


def circuit_sections(model: HookedVLM, settings: DemoSettings, progress: bool = True) -> list[Section]:
    pairs = make_count_pairs(settings.circuit_pairs, seed=settings.seed + 17, size=settings.image_side,
                             style=settings.style, counts=settings.counts)
    try:
        batch = build_pair_batch(model, pairs)
        with torch.enable_grad():
            scores = edge_attribution(model, batch, method="eap-ig", ig_steps=settings.circuit_ig_steps,
                                      image_nodes="token", options=SweepOptions(progress=progress))
    except ValueError as err:  # e.g. no usable count pairs, or a family the graph does not cover
        return [Section.skipped("counting_circuit", CIRCUIT_TITLE, CIRCUIT_EXPLANATION, str(err))]
    scores.thumbnail = thumbnail(pairs[0].clean_image)
    circuit = extract_circuit(model, batch, scores=scores, target=settings.circuit_target,
                              settings=CircuitSettings(seed=settings.seed), options=SweepOptions(progress=progress))
    graph = scores.graph
    low, high = circuit.interval
    nodes = circuit.nodes()
    heads = set()  # heads that write along a circuit edge or read one (through their q, k or v)
    for edge in circuit.edges:
        sender, receiver = graph.senders[int(graph.edge_sender[edge])], graph.receivers[int(graph.edge_receiver[edge])]
        if graph.sender_kind(int(graph.edge_sender[edge])) == "head":
            heads.add(sender)
        heads.update(f"L{receiver.layer}H{h}" for h in receiver.heads)
    numbers: dict[str, int | float | str] = {
        "pairs": batch.n_pairs, "graph edges": graph.n_edges, "circuit edges": circuit.n_edges,
        "faithfulness": circuit.faithfulness,
        "faithfulness 95% CI": format_interval(circuit.faithfulness, low, high),
        "target": settings.circuit_target,
        "image-token nodes in the circuit": sum(n.startswith("img") for n in nodes),
        "heads in the circuit": f"{len(heads)} of {graph.n_layers * graph.n_heads}",
    }
    ranked = sorted(circuit.edges, key=lambda e: -abs(float(scores.scores[e])))
    for rank, edge in enumerate(ranked[:TOP_EDGES], start=1):
        numbers[f"#{rank} {graph.edge_names[edge]}"] = float(scores.scores[edge])
    data = {key: value for key, value in circuit.to_dict().items() if key != "scores"}
    data["top_scored_edges"] = scores.top(50)
    data["clean_metric_mean"], data["corrupt_metric_mean"] = float(scores.clean_metric.mean()), float(
        scores.corrupt_metric.mean())
    return [Section(key="counting_circuit", title=CIRCUIT_TITLE, explanation=CIRCUIT_EXPLANATION,
                    figure=circuit.plot(), numbers=numbers, data=data)]
