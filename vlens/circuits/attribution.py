"""Edge attribution patching (EAP) and its integrated-gradients form (EAP-IG), for every edge at once.

The score of edge u->v estimates the change of the metric when only that edge is corrupted
(`path_patch` computes it exactly), to first order around the clean run:

    EAP(u->v)    = mean_pairs  sum_pos (a_u^corrupt - a_u^clean) . dM/dx_v |clean
    EAP-IG(u->v) = mean_pairs  sum_pos (a_u^corrupt - a_u^clean) . (1/m) sum_{k=1..m} dM/dx_v |x(k/m)

x_v is receiver v's input before its norm (`vlens.circuits.gradients`); x(alpha) is the run
whose *inputs* (the merged input embeddings, and Qwen3-VL's DeepStack features) are
corrupt + alpha (clean - corrupt), the path of Hanna et al. 2024 ("Have Faith in
Faithfulness", EAP-IG-inputs; the right Riemann sum, alpha = 1/m .. 1). EAP costs one corrupt
forward, one clean forward and one backward; EAP-IG m forwards and backwards after the corrupt
one. Positive scores (with the default metric, logit[corrupt answer] - logit[clean answer])
mean the edge carries what makes the clean run answer as it does.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from vlens.circuits.gradients import gradient_run
from vlens.circuits.graph import CircuitGraph, ImageNodes, require_sequential_blocks
from vlens.circuits.results import EdgeScores
from vlens.circuits.runs import (
    CircuitMetric,
    RunRecord,
    attention_post,
    attention_sum,
    check_additive,
    circuit_options,
    head_outputs,
    input_stages,
    pair_batch,
    record_run,
)
from vlens.core.runtime import RunState
from vlens.parallel.options import SweepOptions
from vlens.patching.metrics import MetricFn
from vlens.patching.pairs import PairBatch
from vlens.patching.sharded import pair_chunks
from vlens.utils.errors import UserInputError
from vlens.utils.validation import check_choice, check_count

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM

METHODS: tuple[str, ...] = ("eap", "eap-ig")
DEFAULT_IG_STEPS = 5


def interpolate_state(clean: RunState, corrupt: RunState, alpha: float) -> RunState:
    """The clean run's state with inputs corrupt + alpha (clean - corrupt) (alpha = 1: clean exactly)."""
    if alpha == 1.0:
        return clean
    resid = torch.lerp(corrupt.resid, clean.resid, alpha)
    deepstack = {layer: (mask, torch.lerp(corrupt.deepstack[layer][1], feats, alpha))
                 for layer, (mask, feats) in clean.deepstack.items()}
    return replace(clean, resid=resid, deepstack=deepstack, _moved={})


class SenderDeltas:
    """Corrupt-minus-clean outputs of every sender of one pair chunk, laid out for scoring.

    heads_mlps: [batch, n_non_input_senders, pos, d_model] in sender order (L0H0..L0H{H-1}, MLP0,
    L1H0, ...); inputs[m]: [batch, pos, d_model] the input nodes' delta entering layer m; masks:
    [n_inputs, batch, pos] where each input node is. A head's delta is the change of what its layer
    writes when only that head's output is the corrupt one: (z_h^corrupt - z_h^clean) W_O[h], or,
    through a post-attention norm P (Gemma), P(A + that) - P(A) with A the clean attention output.
    """

    def __init__(self, model: HookedVLM, graph: CircuitGraph, batch: PairBatch, clean_state: RunState,
                 corrupt_state: RunState, clean: RunRecord, corrupt: RunRecord):
        n_layers = model.cfg.n_layers
        dtype = torch.float32 if clean.final.dtype in (torch.float32, torch.float64) else clean.final.dtype
        parts = []
        for layer in range(n_layers):
            dz = (corrupt.z[layer] - clean.z[layer]).to(dtype)
            delta = head_outputs(model, layer, dz)  # [b, p, H, d]
            post = attention_post(model, layer)
            if post is not None:  # one head corrupted at a time, through the norm: heads stacked along the batch
                base = attention_sum(model, layer, clean.z[layer]).to(dtype)  # [b, p, d]
                b, p, heads, d = delta.shape
                moved = (base[:, :, None] + delta).permute(2, 0, 1, 3).reshape(heads * b, p, d)
                written = post(moved.to(clean.final.dtype)).to(dtype).view(heads, b, p, d)
                delta = (written - post(base.to(clean.final.dtype)).to(dtype)[None]).permute(1, 2, 0, 3)
            parts.append(delta.transpose(1, 2))  # [b, H, p, d]
            parts.append((corrupt.mlp_out[layer] - clean.mlp_out[layer]).to(dtype).unsqueeze(1))
        self.heads_mlps = torch.cat(parts, dim=1)
        clean_in, corrupt_in = input_stages(clean_state, n_layers), input_stages(corrupt_state, n_layers)
        self.inputs = [(k - c).to(dtype) for c, k in zip(clean_in, corrupt_in, strict=True)]
        self.masks = graph.input_masks(batch.clean.token_regions, batch.seq_len).to(clean.final.device, dtype)
        self.dtype = dtype


def score_layer(graph: CircuitGraph, layer: int, grads: Tensor, deltas: SenderDeltas, out: Tensor,
                weight: float) -> None:
    """Add `weight` x the scores of the receivers of `layer` (gradients [R, batch, pos, d_model] in the
    graph's order) to `out` ([batch, n_edges])."""
    receivers = graph.layer_receivers(layer)
    if len(receivers) != grads.shape[0]:
        raise RuntimeError(f"{grads.shape[0]} gradients for the {len(receivers)} receivers of layer {layer}")
    grads = grads.to(deltas.dtype)
    n_in = graph.n_inputs
    # every receiver of the layer but the MLP shares its senders; the MLP also reads this layer's heads
    groups: dict[int, list[int]] = {}
    for i, r in enumerate(receivers):
        groups.setdefault(graph.receivers[r].n_senders, []).append(i)
    for n_senders, members in groups.items():
        g = grads[members]  # [R, b, p, d]
        on_inputs = torch.einsum("rbpd,bpd->rbp", g, deltas.inputs[layer])
        scores = [torch.einsum("rbp,nbp->rbn", on_inputs, deltas.masks)]
        if n_senders > n_in:
            scores.append(torch.einsum("rbpd,bspd->rbs", g, deltas.heads_mlps[:, :n_senders - n_in]))
        block = torch.cat(scores, dim=-1).float()  # [R, b, n_senders]
        for i, member in enumerate(members):
            r = receivers[member]
            lo = int(graph.offsets[r])
            out[:, lo:lo + n_senders] += weight * block[i].cpu()


def _chunk_scores(model: HookedVLM, graph: CircuitGraph, batch: PairBatch, metric: CircuitMetric,
                  method: str, ig_steps: int) -> dict[str, Tensor]:
    with torch.no_grad():
        clean_state = model.start_run(batch.clean)
        corrupt_state = model.start_run(batch.corrupt)
        corrupt = record_run(model, corrupt_state)
        corrupt_values = metric(model, corrupt.final)[0].float().cpu()
    alphas = [1.0] if method == "eap" else [1.0] + [k / ig_steps for k in range(1, ig_steps)]
    out = torch.zeros(batch.n_pairs, graph.n_edges)
    deltas: SenderDeltas | None = None
    clean_values = torch.zeros(batch.n_pairs)
    for alpha in alphas:  # alpha = 1 (the clean run) first: its record gives the senders' deltas
        run = gradient_run(model, interpolate_state(clean_state, corrupt_state, alpha), metric, graph.layers)
        if deltas is None:
            with torch.no_grad():
                check_additive(model, clean_state, run.record)
                deltas = SenderDeltas(model, graph, batch, clean_state, corrupt_state, run.record, corrupt)
            clean_values = run.values.float().cpu()
        for layer, grads in run.layers():
            with torch.no_grad():
                score_layer(graph, layer, grads, deltas, out, 1.0 / len(alphas))
        del run
    return {"scores": out, "clean": clean_values, "corrupt": corrupt_values}


def edge_attribution(model: HookedVLM, pairs: Any, metric: MetricFn | None = None, method: str = "eap-ig",
                     ig_steps: int | None = None, image_nodes: ImageNodes = "token",
                     options: SweepOptions | None = None) -> EdgeScores:
    """Scores of every edge of the decoder's graph (`CircuitGraph`) by EAP or EAP-IG.

    Args:
        pairs: a `PairBatch` or pairs (`vlens.patching.make_count_pairs(n)`, `PairExample`s).
        metric: ``metric(logits [n_pairs, n_readout, d_vocab]) -> [n_pairs]``, differentiable
            (default: logit[corrupt answer] - logit[clean answer] at the final position).
        method: "eap" (gradients at the clean run) or "eap-ig" (averaged over `ig_steps` runs
            whose inputs go from corrupt to clean; default 5 steps).
        image_nodes: "token" (one node per image token), "image" (one per image) or (rows, cols)
            blocks of the token grid.
        options: `vlens.SweepOptions`: batch_size (pairs per forward / backward; default all at
            once), readout (where `metric` reads the logits), progress, sharding (the pair chunks
            split across processes).

    Returns:
        `EdgeScores`: per edge the mean over pairs (and per pair) of the estimated change of the
        metric when that edge alone is corrupted.
    """
    check_choice(method, "method", METHODS)
    if method == "eap" and ig_steps not in (None, 1):
        raise UserInputError(f"ig_steps={ig_steps} applies to method='eap-ig' only (EAP takes the clean gradient)")
    ig_steps = check_count(DEFAULT_IG_STEPS if ig_steps is None else ig_steps, "ig_steps")
    options = circuit_options(options, "edge_attribution")
    batch, picture = pair_batch(model, pairs)
    require_sequential_blocks(model)
    graph = CircuitGraph.for_batch(model, batch.clean.token_regions, image_nodes)
    circuit_metric = CircuitMetric(batch, metric, options.readout)
    chunks = pair_chunks(batch.n_pairs, options.batch_size)

    def unit(rows: list[int]) -> dict[str, Tensor]:
        sub = batch if len(chunks) == 1 else batch.select(rows)
        sub_metric = circuit_metric if len(chunks) == 1 else circuit_metric.subset(rows)
        return _chunk_scores(model, graph, sub, sub_metric, method, ig_steps)

    results = options.shards.map(chunks, unit, desc=f"edge attribution ({method})", progress=options.progress)
    per_pair = torch.cat([r["scores"] for r in results])
    return EdgeScores(
        graph=graph, scores=per_pair.mean(0), per_pair=per_pair, method=method,
        ig_steps=ig_steps if method == "eap-ig" else 1, metric=circuit_metric.name,
        clean_metric=torch.cat([r["clean"] for r in results]), corrupt_metric=torch.cat([r["corrupt"] for r in results]),
        pair_ids=list(batch.pair_ids), thumbnail=picture, answers=batch.answers_json(),
    )
