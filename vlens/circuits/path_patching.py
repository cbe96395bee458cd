"""Exact edge patching: only the named receivers see the corrupt sender's contribution.

Corrupting a set S of edges means: the run is the clean run, except that every receiver v reads

    x_v = r_v + sum_{(u->v) in S} (a_u^corrupt - a_u^run)

where r_v is this run's own residual at v's input (before the norm), a_u^run sender u's output
*in this run* (it moves when edges upstream of u are corrupted) and a_u^corrupt its output in the
corrupt run. Nothing else changes: the residual stream itself and every other receiver keep
the run's own values. S empty is the clean run; S = every edge is exactly the corrupt run (every
receiver then reads the corrupt residual); "a circuit C" is the run with S = every edge not
in C. Because the pre-norm residual is the sum of the senders' outputs (and constants), the same
input is also r_v^corrupt - sum_{(u->v) not in S} (a_u^corrupt - a_u^run): each receiver uses
whichever form names fewer edges.

A receiver is recomputed from its corrected input with the model's own modules (the block's
norm, then q_proj / k_proj / v_proj for one head, or the MLP) inside the hook that carries its
output (`hook_q` / `hook_k` / `hook_v` / `hook_mlp_out`); the logits read the corrected final
residual. A receiver whose every incoming edge is corrupted reads the corrupt residual exactly,
so it takes the corrupt run's output instead of being recomputed (so a small circuit, every
other edge corrupted, costs about one forward). Several edge sets run in one forward as copies of the batch stacked along the batch
dimension; a run starts at the first layer any of its receivers is in (the layers before are
the clean run's, reused).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from vlens.circuits.gradients import port_hook
from vlens.circuits.graph import CircuitGraph, ImageNodes, MixerPort, Receiver, require_sequential_blocks
from vlens.circuits.results import PathPatchResult
from vlens.circuits.runs import (
    CircuitMetric,
    attention_post,
    attention_sum,
    check_additive,
    circuit_options,
    input_stages,
    mlp_write,
    pair_batch,
    record_run,
)
from vlens.core.hooks import act_name
from vlens.parallel.options import SweepOptions
from vlens.patching.fast import repeat_run_state
from vlens.patching.metrics import MetricFn
from vlens.patching.pairs import PairBatch
from vlens.patching.sharded import pair_chunks
from vlens.utils.errors import UserInputError

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM


@dataclass(frozen=True)
class Condition:
    """One patched run: the corrupted edges are `edges` (indices), or with `invert` every edge but
    those (a circuit: `edges` stay clean)."""

    edges: Tensor
    invert: bool = False

    def corrupted(self, n_edges: int) -> Bool[Tensor, " n_edges"]:
        mask = torch.zeros(n_edges, dtype=torch.bool)
        mask[self.edges] = True
        return ~mask if self.invert else mask


@dataclass
class _Active:
    """A receiver's part of a patched run of K copies."""

    receiver: Receiver
    coef: Tensor  # [K, n_senders]: +1 corrupt (clean-based), -1 keep clean (corrupt-based), 0 nothing
    corrupt_base: Tensor  # [K] bool: start from the corrupt run's residual
    needs: Tensor  # [K] bool: this copy's input differs from the run's own
    plain: Tensor  # [K] bool: this copy's input is the corrupt run's (every incoming edge corrupted)

    @property
    def compute(self) -> Tensor:
        """[K] bool: copies whose receiver output must be recomputed."""
        return self.needs & ~self.plain


class PathPatcher:
    """The clean and corrupt runs of one pair batch, then any number of patched runs (`run`)."""

    def __init__(self, model: HookedVLM, graph: CircuitGraph, batch: PairBatch, metric: CircuitMetric):
        self.model, self.graph, self.batch, self.metric = model, graph, batch, metric
        with torch.no_grad():
            self.state = model.start_run(batch.clean)
            corrupt_state = model.start_run(batch.corrupt)
            ports = [port_hook(layer, port.hook) for layer, spec in enumerate(graph.layers) for port in spec.ports]
            self.clean = record_run(model, self.state, ports)
            self.corrupt = record_run(model, corrupt_state, ports)
            self.clean_ports = self.clean.ports or {}
            check_additive(model, self.state, self.clean)
            n_layers = model.cfg.n_layers
            clean_in, corrupt_in = input_stages(self.state, n_layers), input_stages(corrupt_state, n_layers)
            self.delta_in = [c - k for c, k in zip(corrupt_in, clean_in, strict=True)]  # [b, p, d] per stage
            dtype, device = self.clean.final.dtype, self.clean.final.device
            self.masks = graph.input_masks(batch.clean.token_regions, batch.seq_len).to(device, dtype)
            self.clean_values = metric(model, self.clean.final)[0].float().cpu()
            self.corrupt_values = metric(model, self.corrupt.final)[0].float().cpu()
        self._states: dict[int, object] = {}
        self._inner: str | None = None  # while a mixer is rerun to recompute one port: that port's hook
        self._caught: Tensor | None = None
        self._fast: dict[str, bool] = {}  # port hook -> whether its projection shortcut gives the hook's value

    # ------------------------------------------------------------------ one patched forward
    def run(self, corrupted: Bool[Tensor, "copies n_edges"]) -> Float[Tensor, "copies n_pairs"]:
        """Metric per pair of each copy, copy k corrupting the edges where `corrupted[k]`."""
        graph, model = self.graph, self.model
        corrupted = corrupted.bool().cpu()
        copies = corrupted.shape[0]
        active: dict[int, _Active] = {}
        dtype = self.clean.final.dtype
        for r, receiver in enumerate(graph.receivers):
            lo, hi = int(graph.offsets[r]), int(graph.offsets[r + 1])
            mask = corrupted[:, lo:hi].to(dtype)
            corrupt_base = mask.sum(1) * 2 > receiver.n_senders
            needs = corrupt_base | mask.bool().any(1)
            if bool(needs.any()):
                coef = torch.where(corrupt_base[:, None], mask - 1, mask)
                plain = corrupt_base & ~coef.bool().any(1)
                active[r] = _Active(receiver, coef.to(self.clean.final.device), corrupt_base, needs, plain)
        if not active:
            return self.clean_values.expand(copies, -1).clone()
        start = min(a.receiver.layer for a in active.values())
        with torch.no_grad():
            final = self._forward(active, start, copies)
            return self.metric(model, final).float().cpu()

    def _forward(self, active: dict[int, _Active], start: int, copies: int) -> Tensor:
        model = self.model
        n_layers = model.cfg.n_layers
        run: dict[str, dict[int, Tensor]] = {"z": {}, "mlp": {}, "pre": {}, "mid": {}}
        for layer in range(start):  # the clean run's, shared by every copy
            run["z"][layer], run["mlp"][layer] = self.clean.z[layer], self.clean.mlp_out[layer]
        by_layer: dict[int, list[_Active]] = {}
        for item in active.values():
            by_layer.setdefault(item.receiver.layer, []).append(item)

        hooks: list[tuple[str, Callable]] = []
        for layer in range(start, n_layers):
            here = by_layer.get(layer, [])
            hooks.append((act_name("resid_pre", layer), _keeper(run["pre"], layer)))
            for port in self.graph.layers[layer].ports:
                items = [a for a in here if a.receiver.kind == port.kind]
                if items:
                    hooks.append((port_hook(layer, port.hook), self._port_hook(items, layer, port, run, copies)))
            hooks.append((act_name("z", layer), _keeper(run["z"], layer)))
            hooks.append((act_name("resid_mid", layer), _keeper(run["mid"], layer)))
            mlp_items = [a for a in here if a.receiver.kind == "mlp"]
            hooks.append((act_name("mlp_out", layer), self._mlp_hook(mlp_items[0] if mlp_items else None, layer,
                                                                     run, copies)))
        if start < n_layers:
            state = self._repeated(copies)
            resid = self.clean.resid_pre[start].repeat(copies, 1, 1)
            with model.hooks(fwd_hooks=[(name, self._guarded(name, fn)) for name, fn in hooks]):
                final = model.run_blocks(resid, state, start, None)
        else:
            final = self.clean.final.repeat(copies, 1, 1)
        logits_items = by_layer.get(n_layers, [])
        if logits_items:
            run_final = final
            final = self._replace(logits_items[0], final, self.corrupt.final, lambda: self._inputs(
                logits_items, n_layers, run_final, self.corrupt.final, run, copies)[0], copies)
        return final

    def _replace(self, item: _Active, act: Tensor, corrupt_act: Tensor, compute: Callable[[], Tensor],
                 copies: int) -> Tensor:
        """`act` [K * n, ...] where the copies that take the corrupt output take `corrupt_act` [n, ...] and
        those that recompute take `compute()` (K * n rows, any leading shape)."""
        n = self.batch.n_pairs
        plain = item.plain.repeat_interleave(n).to(act.device)
        rows = item.compute.repeat_interleave(n).to(act.device)
        ones = [1] * (act.ndim - 1)
        if bool(plain.any()):
            act = torch.where(plain.view(-1, *ones), corrupt_act.to(act.dtype).repeat(copies, *ones), act)
        if bool(rows.any()):
            act = torch.where(rows.view(-1, *ones), compute().reshape(act.shape).to(act.dtype), act)
        return act

    def _repeated(self, copies: int):
        if copies not in self._states:
            self._states[copies] = repeat_run_state(self.state, copies)
        return self._states[copies]

    # ------------------------------------------------------------------ receivers' inputs
    def _inputs(self, items: Sequence[_Active], layer: int, run_resid: Tensor, corrupt_resid: Tensor,
                run: dict[str, dict[int, Tensor]], copies: int) -> Float[Tensor, "receivers copies n pos d_model"]:
        """Each receiver's corrected input: base (this run's residual or the corrupt one) + the
        corrupt-minus-run outputs of its coefficient-weighted senders."""
        graph, model = self.graph, self.model
        n = self.batch.n_pairs
        shape = (copies, n, *run_resid.shape[1:])
        run_resid = run_resid.reshape(shape)
        coef = torch.stack([a.coef for a in items])  # [R, K, n_senders] (the same n_senders in one group)
        out = torch.where(torch.stack([a.corrupt_base for a in items]).to(run_resid.device)[:, :, None, None, None],
                          corrupt_resid.unsqueeze(0), run_resid.unsqueeze(0))  # a new tensor: added to in place
        n_senders = coef.shape[-1]
        inputs = coef[:, :, :graph.n_inputs]
        if bool(inputs.any()):
            weight = torch.einsum("rkn,nbp->rkbp", inputs, self.masks)
            out += weight[..., None] * self.delta_in[layer]
        bases = torch.stack([a.corrupt_base for a in items]).to(out.device)  # [R, K]
        for source in range(model.cfg.n_layers):
            base_index = graph.layer_base(source)
            if base_index >= n_senders:
                break
            heads = coef[:, :, base_index:base_index + graph.layers[source].n_heads]
            if bool(heads.any()):
                run_z = _copies(run["z"][source], copies, n)  # [K|1, n, p, H, dh]
                dz = self.corrupt.z[source] - run_z
                weighted = dz.unsqueeze(0) * heads[:, :, None, None, :, None]
                w_o = model.blocks[source].attn.W_O.to(weighted.device, weighted.dtype)
                shift = torch.einsum("rkbphe,hed->rkbpd", weighted, w_o)
                post = attention_post(model, source)
                if post is None:  # the heads add to the residual stream
                    out += shift
                else:  # through the post-attention norm: what the layer writes with those heads moved
                    anchor = torch.where(bases[:, :, None, None, None],
                                         attention_sum(model, source, self.corrupt.z[source]).unsqueeze(0),
                                         attention_sum(model, source, run_z).unsqueeze(0))  # [R, K, n, p, d]
                    flat = anchor.reshape(-1, *anchor.shape[3:])
                    out += (post(flat + shift.reshape(flat.shape)) - post(flat)).view(out.shape)
            mlp_index = graph.mlp_sender(source)
            if mlp_index < n_senders:
                mlp = coef[:, :, mlp_index]
                if bool(mlp.any()):
                    dm = self.corrupt.mlp_out[source] - _copies(run["mlp"][source], copies, n)
                    out += mlp[:, :, None, None, None] * dm.unsqueeze(0)
        return out

    def _guarded(self, name: str, fn: Callable) -> Callable:
        """`fn` as a hook, except while a mixer is rerun to recompute one port (`_capture`): then the port's
        hook hands its value over and stops the rerun, and every other hook lets the run pass."""

        def hook(act: Tensor, hook=None):
            if self._inner is not None:
                if name == self._inner:
                    self._caught = act
                    raise _Captured
                return None
            return fn(act, hook)

        return hook

    def _capture(self, layer: int, name: str, x: Tensor) -> Tensor:
        """The value of hook `name` when layer `layer`'s token mixer reads residual inputs `x` (copies of the
        pairs, [copies * n, pos, d_model]): the mixer rerun up to that hook."""
        block = self.model.blocks[layer]
        state = self._repeated(x.shape[0] // self.batch.n_pairs)
        self._inner, self._caught = name, None
        try:
            block.attn(block.ln1(x), state.cos, state.sin, state.masks, None)
        except _Captured:
            pass
        finally:
            self._inner = None
        if self._caught is None:
            raise RuntimeError(f"rerunning layer {layer}'s token mixer never reached {name}")
        return self._caught

    def _shortcut(self, layer: int, port: MixerPort) -> Callable[[Tensor], Tensor] | None:
        """A softmax attention's queries / keys / values straight from its norm and projection (no rerun of
        the attention), where that gives exactly the clean run's hook value (checked once), else None."""
        block = self.model.blocks[layer]
        attn: Any = block.attn  # softmax attention here (the spec says so)
        if self.graph.layers[layer].mixer != "attention" or port.kind not in ("q", "k", "v"):
            return None

        def compute(x: Tensor) -> Tensor:
            normed = block.ln1(x)
            if port.kind == "q":
                return attn.project_queries(normed)[0]
            return getattr(attn, f"{port.kind}_proj")(normed).view(*x.shape[:2], -1, self.model.cfg.d_head)

        name = port_hook(layer, port.hook)
        if name not in self._fast:
            expected = self.clean_ports[name]
            try:
                got = compute(self.clean.resid_pre[layer])
                self._fast[name] = got.shape == expected.shape and bool(torch.allclose(got, expected, rtol=1e-5,
                                                                                           atol=1e-6))
            except (AttributeError, RuntimeError, TypeError):
                self._fast[name] = False
        return compute if self._fast[name] else None

    def _port_hook(self, items: list[_Active], layer: int, port: MixerPort, run: dict, copies: int):
        """The hook of one mixer port (hook_q / hook_k / hook_v / ...): each receiver's head of it from its
        corrected input (softmax attention: the norm and that projection; any other mixer: rerun to it)."""
        n = self.batch.n_pairs
        name = port_hook(layer, port.hook)
        assert self.corrupt.ports is not None
        corrupt_act = self.corrupt.ports[name]  # [n, pos, heads(, d)]
        shortcut = self._shortcut(layer, port)

        def hook(act: Tensor, hook=None) -> Tensor:
            out = act.clone()
            recompute = [item for item in items if bool(item.compute.any())]
            new: Tensor | None = None
            if recompute:
                x = self._inputs(recompute, layer, run["pre"][layer], self.corrupt.resid_pre[layer], run, copies)
                flat = x.reshape(len(recompute) * copies * n, *x.shape[3:]).to(act.dtype)
                value = shortcut(flat) if shortcut is not None else self._capture(layer, name, flat)
                new = value.reshape(len(recompute), copies * n, *act.shape[1:])
            for item in items:
                j = item.receiver.index
                i = next((i for i, other in enumerate(recompute) if other is item), 0)

                def computed(i: int = i, j: int = j) -> Tensor:
                    assert new is not None
                    return new[i, :, :, j]

                out[:, :, j] = self._replace(item, act[:, :, j], corrupt_act[:, :, j], computed, copies)
            return out

        return hook

    def _mlp_hook(self, item: _Active | None, layer: int, run: dict, copies: int):
        n = self.batch.n_pairs

        def compute() -> Tensor:
            assert item is not None
            x = self._inputs([item], layer, run["mid"][layer], self.corrupt.resid_mid[layer], run, copies)[0]
            return mlp_write(self.model, layer, x.reshape(copies * n, *x.shape[2:]).to(self.clean.final.dtype))

        def hook(act: Tensor, hook=None) -> Tensor:
            if item is not None:
                act = self._replace(item, act, self.corrupt.mlp_out[layer], compute, copies)
            run["mlp"][layer] = act
            return act

        return hook


class _Captured(Exception):
    """Stops a mixer's rerun once the port being recomputed has its value (`PathPatcher._capture`)."""


def _keeper(store: dict[int, Tensor], layer: int):
    def hook(act: Tensor, hook=None) -> None:
        store[layer] = act

    return hook


def _copies(value: Tensor, copies: int, n: int) -> Tensor:
    """[K, n, ...] of a run activation ([K * n, ...]) or [1, n, ...] of a shared clean one ([n, ...])."""
    if value.shape[0] == n:
        return value.unsqueeze(0)
    return value.reshape(copies, n, *value.shape[1:])


# ---------------------------------------------------------------------- many conditions, sharded
@dataclass
class ConditionValues:
    """Metric per pair of each condition [n_conditions, n_pairs], and the unpatched runs' [n_pairs]."""

    patched: Tensor
    clean: Tensor
    corrupt: Tensor


def condition_start(graph: CircuitGraph, condition: Condition) -> int:
    """The first layer the condition's run has to recompute (for grouping chunk mates)."""
    if condition.invert or not len(condition.edges):
        return 0
    return min(graph.receivers[int(r)].layer for r in graph.edge_receiver[condition.edges].unique())


def run_conditions(model: HookedVLM, graph: CircuitGraph, batch: PairBatch, metric: CircuitMetric,
                   conditions: Sequence[Condition], options: SweepOptions | None = None,
                   desc: str = "path patching", cache: dict[int, PathPatcher] | None = None) -> ConditionValues:
    """Every condition's metric per pair, exactly; units = (pair chunk, chunk of conditions).

    options: `vlens.SweepOptions`: max_batch (most rows, copies x pairs, per forward),
        batch_size (pairs per chunk), progress, sharding (the units split across processes).
    cache: keep each pair chunk's clean and corrupt runs here for later calls on the same pairs
        (default: one chunk's at a time, dropped at the end).
    """
    options = circuit_options(options, "run_conditions")
    max_batch, sharding = options.max_batch, options.shards
    chunks = pair_chunks(batch.n_pairs, options.batch_size)
    order = sorted(range(len(conditions)), key=lambda i: condition_start(graph, conditions[i]))
    units = []
    for p, rows in enumerate(chunks):
        per = max(1, max_batch // len(rows))
        units += [(p, order[i:i + per]) for i in range(0, len(order), per)] or [(p, [])]
    plans: dict[int, PathPatcher] = {} if cache is None else cache

    def plan_for(p: int) -> PathPatcher:
        if p not in plans:
            if cache is None:
                plans.clear()
            rows = chunks[p]
            sub = batch if len(chunks) == 1 else batch.select(rows)
            plans[p] = PathPatcher(model, graph, sub, metric if len(chunks) == 1 else metric.subset(rows))
        return plans[p]

    def run(unit: tuple[int, list[int]]) -> dict:
        p, indices = unit
        plan = plan_for(p)
        out: dict = {"clean": plan.clean_values, "corrupt": plan.corrupt_values}
        if indices:
            masks = torch.stack([conditions[i].corrupted(graph.n_edges) for i in indices])
            out["values"] = plan.run(masks)
        return out

    results = sharding.map(units, run, desc=desc, progress=options.progress)
    if cache is None:
        plans.clear()
    patched = torch.full((len(conditions), batch.n_pairs), float("nan"))
    clean, corrupt = torch.zeros(batch.n_pairs), torch.zeros(batch.n_pairs)
    for (p, indices), result in zip(units, results, strict=True):
        pair_rows = torch.tensor(chunks[p])
        clean[pair_rows], corrupt[pair_rows] = result["clean"], result["corrupt"]
        if indices:
            patched[torch.tensor(indices)[:, None], pair_rows[None, :]] = result["values"]
    return ConditionValues(patched=patched, clean=clean, corrupt=corrupt)


def edge_conditions(graph: CircuitGraph, edges: Any) -> list[Condition]:
    """`edges` as conditions: "all" (every edge alone), or a list whose items are one edge each
    ("u->v", (u, v) or an index) or a collection of edges (a list / set) corrupted together."""
    if isinstance(edges, str) and edges == "all":
        return [Condition(torch.tensor([e])) for e in range(graph.n_edges)]
    if isinstance(edges, (str, int, tuple)) or not isinstance(edges, Iterable):
        raise UserInputError("edges must be 'all' or a list of conditions, each an edge ('L0H1->MLP2') or a list "
                             "of edges corrupted together, e.g. ['L0H1->MLP2'] or [['L0H1->MLP2', 'MLP2->logits']]")
    conditions = []
    for item in edges:
        if isinstance(item, (str, int, tuple)):
            conditions.append(Condition(torch.tensor([graph.edge_index(item)])))
        elif isinstance(item, Iterable):
            conditions.append(Condition(graph.edge_set(item)))
        else:
            raise UserInputError(f"condition {item!r}: give an edge ('L0H1->MLP2') or a list of edges")
    if not conditions:
        raise UserInputError("edges names no condition: give at least one edge (or 'all')")
    return conditions


def path_patch(model: HookedVLM, pairs: Any, edges: Any = "all", metric: MetricFn | None = None,
               image_nodes: ImageNodes = "token", options: SweepOptions | None = None) -> PathPatchResult:
    """Exact edge patching: each condition corrupts its edges only (see the module docstring).

    Args:
        pairs: a `PairBatch` or pairs (`vlens.patching.make_count_pairs(n)`).
        edges: "all" (every edge of the graph, one at a time: the exact counterpart of
            `edge_attribution`), or a list of conditions: an edge ("img0[r2,c3]->L0H1.v",
            (sender, receiver) or an index) is corrupted alone, a list of edges together.
        metric / image_nodes: as `edge_attribution`.
        options: `vlens.SweepOptions`: max_batch (most rows, copies x pairs, per forward),
            batch_size (pairs per chunk), readout, progress, sharding.

    Returns:
        `PathPatchResult` (`effects`: mean over pairs of the metric minus the clean run's).
    """
    options = circuit_options(options, "path_patch")
    batch, picture = pair_batch(model, pairs)
    require_sequential_blocks(model)
    graph = CircuitGraph.for_batch(model, batch.clean.token_regions, image_nodes)
    conditions = edge_conditions(graph, edges)
    circuit_metric = CircuitMetric(batch, metric, options.readout)
    values = run_conditions(model, graph, batch, circuit_metric, conditions, options)
    return PathPatchResult(graph=graph, conditions=[c.edges.tolist() for c in conditions], patched=values.patched,
                           clean_metric=values.clean, corrupt_metric=values.corrupt, metric=circuit_metric.name,
                           pair_ids=list(batch.pair_ids), thumbnail=picture)
