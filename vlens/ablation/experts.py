"""Expert ablation in mixture-of-experts layers: single experts ablated, their importance per task, and
the Jaccard overlap of the tasks' top-k expert sets, on the head ablation's machinery (docs/moe.md).

Expert e of MoE layer l is ablated by replacing its output (`blocks.{l}.mlp.hook_expert_out`, the slot
whose `hook_expert_indices` entry is e) at every real position where the router chose it:

- "mean": by its mean output over the reference set's positions that chose it; the routing (which
  experts, their weights) is left as it is, so the ablated expert still gets its weight;
- "zero": by zero: its weighted contribution is removed (the other experts' weights are not renormalised).

This is mean ablation of a head carried over to a sparse unit: the unit keeps being "read" where the
model reads it, but writes only its average. An expert the reference set never chose has no mean: it
is mean-ablated to zero, and `ExpertReference.counts` says which experts that was.

    reference = collect_expert_reference(model, reference_task)
    result = expert_ablation_sweep(model, task, "mean", reference)      # HeadAblation, unit "expert"
    report = cross_task_expert_ablation(model, {"counting": (ev, ref), "colour": (ev2, ref2)},
                                        AblationSettings(top_k=10, unit="expert"))

The results are `HeadAblation` / `AblationReport` with unit "expert": grids [n_layers, n_experts] (NaN
rows for dense layers), so rankings, top-k sets, Jaccard, p-values and reliability are the heads' own.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from vlens.ablation.results import AblationReport, HeadAblation
from vlens.ablation.settings import AblationSettings, split_legacy
from vlens.ablation.sweep import CleanChunk, gather_units
from vlens.ablation.tasks import TaskBatch
from vlens.core.inputs import VLMInputs
from vlens.parallel.options import SweepOptions, fold_legacy
from vlens.utils.errors import UserInputError
from vlens.utils.finite import warn_non_finite
from vlens.utils.validation import check_top_k

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM

EXPERT_METHODS: tuple[str, ...] = ("mean", "zero")
Hook = Callable[[Tensor, object], Tensor | None]


def moe_layers(model: HookedVLM) -> list[int]:
    """The model's mixture-of-experts layers; a clear error for a model without any."""
    layers = list(model.cfg.moe_layers)
    if not layers:
        raise UserInputError(f"{model.cfg.architecture} has no mixture-of-experts layer: expert methods need a MoE "
                             "model (Qwen3-VL-MoE, Qwen3.5-MoE)")
    return layers


def _names(layer: int) -> tuple[str, str]:
    return f"blocks.{layer}.mlp.hook_expert_indices", f"blocks.{layer}.mlp.hook_expert_out"


@dataclass
class ExpertReference:
    """Each expert's mean output over the reference positions that chose it.

    means: layer -> [n_experts, d_model] (zeros for an expert never chosen); counts: layer -> [n_experts]
    how many reference positions chose it; n_examples, n_positions: size of the reference set.
    """

    means: dict[int, Float[Tensor, "n_experts d_model"]]
    counts: dict[int, Int[Tensor, "n_experts"]]
    n_examples: int
    n_positions: int

    def never_chosen(self) -> list[tuple[int, int]]:
        """(layer, expert) pairs the reference set never routed to (mean-ablated to zero)."""
        return [(layer, int(e)) for layer, c in self.counts.items() for e in (c == 0).nonzero().flatten()]


def _batches(model: HookedVLM, reference: Iterable[VLMInputs] | TaskBatch, batch_size: int) -> tuple[Iterator[VLMInputs], int | None]:
    if isinstance(reference, TaskBatch):
        task = reference
        return (task.inputs(model, range(s, min(s + batch_size, len(task))))
                for s in range(0, len(task), batch_size)), -(-len(task) // batch_size)
    return iter(reference), None


def collect_expert_reference(model: HookedVLM, reference: Iterable[VLMInputs] | TaskBatch,
                             options: SweepOptions | None = None, **legacy: Any) -> ExpertReference:
    """Run the reference set once and average every expert's output where the router chose it.

    Args:
        model: a mixture-of-experts model.
        reference: a `TaskBatch` (run in chunks of `options.batch_size`, default 16) or an iterable
            of `VLMInputs`.
        options: `batch_size`, `progress` (`vlens.SweepOptions`).
    Returns:
        `ExpertReference`: per MoE layer the mean output of every expert [n_experts, d_model] and how
        often the reference set chose it.
    """
    options = fold_legacy(options, legacy, "collect_expert_reference", ("batch_size", "progress"))
    batch_size, progress = options.batch(16), options.shown
    layers = moe_layers(model)
    cfg, device = model.cfg, model.unembed.device
    sums = {layer: torch.zeros(cfg.n_experts, cfg.d_model, dtype=torch.float32, device=device) for layer in layers}
    counts = {layer: torch.zeros(cfg.n_experts, dtype=torch.long) for layer in layers}
    n_examples = n_positions = 0
    batches, total = _batches(model, reference, batch_size)
    for inputs in tqdm(batches, total=total, desc="expert means", disable=not progress):
        real = inputs.attention_mask.bool()
        with torch.no_grad():
            model.run_with_hooks(inputs, return_type=None, fwd_hooks=_mean_hooks(layers, real, sums, counts))
        n_examples += inputs.batch_size
        n_positions += int(real.sum())
    if n_positions == 0:
        raise UserInputError("the reference set is empty: give at least one example with real tokens")
    means = {layer: (sums[layer] / counts[layer].clamp(min=1).to(device)[:, None]).to(cfg.dtype) for layer in layers}
    return ExpertReference(means=means, counts=counts, n_examples=n_examples, n_positions=n_positions)


def _mean_hooks(layers: list[int], real: Tensor, sums: dict[int, Tensor], counts: dict[int, Tensor]) -> list:
    """Hooks adding one batch's expert outputs at real positions into `sums` / `counts` (per chosen expert)."""
    store: dict[int, Tensor] = {}

    def keep(indices: Tensor, hook, layer: int) -> None:
        store[layer] = indices

    def add(out: Tensor, hook, layer: int) -> None:
        n_experts = counts[layer].shape[0]
        mask = real.to(out.device)
        chosen = store[layer][mask].flatten()  # [n_real * k]
        values = out[mask].flatten(0, 1).float()  # [n_real * k, d_model]
        ok = (chosen >= 0) & (chosen < n_experts)
        sums[layer].index_add_(0, chosen[ok].to(sums[layer].device), values[ok].to(sums[layer].device))
        counts[layer] += torch.bincount(chosen[ok].cpu(), minlength=n_experts)

    hooks: list = []
    for layer in layers:
        indices_name, out_name = _names(layer)
        hooks += [(indices_name, partial(keep, layer=layer)), (out_name, partial(add, layer=layer))]
    return hooks


def stacked_expert_hooks(layer: int, experts: Sequence[int], values: Float[Tensor, "n_experts d_model"] | None,
                         real: Bool[Tensor, "batch pos"], together: bool = False) -> list[tuple[str, Hook]]:
    """Hooks on `layer`'s expert indices and outputs for a batch stacked len(experts) times: copy g has
    expert experts[g] replaced by values[experts[g]] (zero when `values` is None) wherever it was chosen
    at a real position. together=True: one copy (the batch as is) with every listed expert replaced."""
    indices_name, out_name = _names(layer)
    batch = real.shape[0]
    store: dict[str, Tensor] = {}

    def keep(indices: Tensor, hook) -> None:
        store["indices"] = indices

    def replace(out: Tensor, hook) -> Tensor:
        copies = 1 if together else len(experts)
        if out.shape[0] != batch * copies:
            raise RuntimeError(f"hook_expert_out batch {out.shape[0]} != {copies} copies x {batch} rows")
        out = out.clone()
        mask = real.to(out.device)[..., None]  # [batch, pos, 1]
        groups = [list(experts)] if together else [[e] for e in experts]
        for g, group in enumerate(groups):
            rows = slice(g * batch, (g + 1) * batch)
            for expert in group:
                chosen = (store["indices"][rows] == expert) & mask  # [batch, pos, k]
                value = out.new_zeros(out.shape[-1]) if values is None else values[expert].to(out.device, out.dtype)
                out[rows] = torch.where(chosen[..., None], value, out[rows])
        return out

    return [(indices_name, keep), (out_name, replace)]


def _values(method: str, reference: ExpertReference | None, layer: int) -> Tensor | None:
    if method not in EXPERT_METHODS:
        raise UserInputError(f"unknown expert ablation method {method!r}: use one of {EXPERT_METHODS}")
    if method == "zero":
        return None
    if reference is None:
        raise UserInputError("mean ablation needs reference means: reference = collect_expert_reference(model, reference_set)")
    return reference.means[layer]


def expert_ablation_hooks(model: HookedVLM, inputs: VLMInputs, experts: Sequence[tuple[int, int]], method: str = "mean",
                          reference: ExpertReference | None = None) -> list[tuple[str, Hook]]:
    """Hooks that ablate all `experts` ((layer, expert) pairs) together on `inputs`:

        logits = model.run_with_hooks(inputs, fwd_hooks=expert_ablation_hooks(model, inputs, [(1, 3)], "mean", ref))
    """
    layers = set(moe_layers(model))
    by_layer: dict[int, list[int]] = defaultdict(list)
    for layer, expert in experts:
        if layer not in layers or not 0 <= expert < model.cfg.n_experts:
            raise UserInputError(f"expert ({layer}, {expert}) does not exist: MoE layers {sorted(layers)}, "
                             f"experts 0..{model.cfg.n_experts - 1}")
        by_layer[layer].append(expert)
    real = inputs.attention_mask.bool()
    return [hook for layer, chosen in sorted(by_layer.items())
            for hook in stacked_expert_hooks(layer, chosen, _values(method, reference, layer), real, together=True)]


def expert_ablation_sweep(
    model: HookedVLM,
    task: TaskBatch,
    method: str = "mean",
    reference: ExpertReference | None = None,
    layers: Sequence[int] | None = None,
    resume: bool = True,
    options: SweepOptions | None = None,
    **legacy: Any,
) -> HeadAblation:
    """Ablate each expert of the MoE `layers` (default all) alone on `task`; mean damage per expert.

    Args:
        model: a mixture-of-experts model.
        task: the evaluation examples.
        method: "mean" (reference means, see the module docstring) or "zero".
        reference: from `collect_expert_reference` on a reference set (method "mean").
        layers: the MoE layers swept (default all).
        resume: resume from the clean residual entering the ablated layer (exact: earlier layers are
            untouched); False runs the whole model once per expert (the plain reference path).
        options: `batch_size` (examples per forward, default 16), `heads_per_pass` (experts of one
            layer run together, the chunk stacked once per expert), `progress`, `sharding` (one unit
            per (chunk of examples, layer) across processes), `cache_device` (`vlens.SweepOptions`).
    Returns:
        a `HeadAblation` with unit "expert": [n_layers, n_experts] grids, NaN for dense layers and
        layers not swept.
    """
    if "experts_per_pass" in legacy:  # its old name: the same field as heads_per_pass
        legacy = {**{k: v for k, v in legacy.items() if k != "experts_per_pass"},
                  "heads_per_pass": legacy["experts_per_pass"]}
    options = fold_legacy(options, legacy, "expert_ablation_sweep", ("batch_size", "heads_per_pass", "progress",
                                                                     "sharding"))
    batch_size, experts_per_pass, progress = options.batch(16), options.heads_per_pass, options.progress
    all_moe = moe_layers(model)
    layers = all_moe if layers is None else [int(x) for x in layers]
    bad = [x for x in layers if x not in all_moe]
    if bad:
        raise UserInputError(f"layers {bad} have no mixture of experts (MoE layers: {all_moe})")
    for layer in layers:
        _values(method, reference, layer)  # a missing reference fails now
    sharding = options.shards
    cfg, n = model.cfg, len(task)
    chunks = [range(s, min(s + batch_size, n)) for s in range(0, n, batch_size)]
    clean_runs: dict[int, CleanChunk] = {}

    def run(unit: tuple[int, int]) -> dict:
        c, layer = unit
        if c not in clean_runs:
            clean_runs.clear()
            clean_runs[c] = CleanChunk(model, task, chunks[c], options.cache_device)
        chunk = clean_runs[c]
        values = _values(method, reference, layer)
        real = chunk.inputs.attention_mask.bool()
        logprob: list[Tensor] = []
        accuracy: list[Tensor] = []
        step = experts_per_pass if resume else 1
        for start in range(0, cfg.n_experts, step):
            group = list(range(start, min(start + step, cfg.n_experts)))
            lp, acc = chunk.copies_metrics(model, layer, stacked_expert_hooks(layer, group, values, real), len(group),
                                           resume)
            logprob += lp
            accuracy += acc
        out: dict = {"logprob": logprob, "accuracy": accuracy}
        if layer == layers[0]:
            out["clean"] = (chunk.clean_lp, chunk.clean_acc)
        return out

    units = [(c, layer) for c in range(len(chunks)) for layer in layers]
    with torch.no_grad():
        results = sharding.map(units, run, desc=f"ablate experts {task.name}", progress=progress)
    clean_runs.clear()
    clean_lp, clean_acc, abl_lp, abl_acc = gather_units(units, results, chunks, cfg.n_layers, cfg.n_experts, n)
    broken = [f"L{layer}E{e}" for layer in layers for e in range(cfg.n_experts) if bool(abl_lp[layer, e].isnan().any())]
    if bool(clean_lp.isnan().any()):
        warn_non_finite(f"expert ablation ({task.name})", "the unablated run", model)
    elif broken:
        warn_non_finite(f"expert ablation ({task.name})", "ablating experts " + ", ".join(broken[:6]))
    return HeadAblation(
        task=task.name, method=method, alignment="all", n_examples=n, clean_logprob=float(clean_lp.mean()),
        clean_accuracy=float(clean_acc.mean()), ablated_logprob=abl_lp.mean(dim=-1).double(),
        ablated_accuracy=abl_acc.mean(dim=-1).double(), answers=list(task.answers),
        answer_tokens=[list(a) for a in task.answer_tokens],
        heads_per_layer=[cfg.n_experts if layer in all_moe else 0 for layer in range(cfg.n_layers)], unit="expert",
    )


def cross_task_expert_ablation(
    model: HookedVLM,
    tasks: Mapping[str, tuple[TaskBatch, TaskBatch]],
    settings: AblationSettings | None = None,
    retest: Mapping[str, TaskBatch] | None = None,
    options: SweepOptions | None = None,
    **legacy: Any,
) -> AblationReport:
    """Ablate every expert on every task; rank experts per task; compare the top-k sets by Jaccard.

    Args:
        model: a mixture-of-experts model.
        tasks: {name: (evaluation TaskBatch, reference TaskBatch)} (each task's own reference means).
        settings: `AblationSettings`: method ("mean" or "zero"), top_k, rank_by (alignment and
            reference_mode do not apply to experts).
        retest: {name: a second evaluation set} for each task's test-retest Jaccard (same reference).
        options: `batch_size`, `heads_per_pass` (experts per pass), `progress`, `sharding`,
            `cache_device` (`vlens.SweepOptions`).
    Returns:
        an `AblationReport` with unit "expert" (Jaccard p-values, Holm, reliability as for heads).
    """
    if "experts_per_pass" in legacy:  # its old name: the same field as heads_per_pass
        legacy = {**{k: v for k, v in legacy.items() if k != "experts_per_pass"},
                  "heads_per_pass": legacy["experts_per_pass"]}
    settings, rest = split_legacy(settings, legacy, "cross_task_expert_ablation")
    options = fold_legacy(options, rest, "cross_task_expert_ablation", ("batch_size", "heads_per_pass", "progress",
                                                                        "sharding"))
    method, top_k, rank_by = settings.method, settings.top_k, settings.rank_by
    batch_size, experts_per_pass = options.batch(16), options.heads_per_pass
    layers = moe_layers(model)
    check_top_k(top_k, "top_k", len(layers) * model.cfg.n_experts)
    if not tasks:
        raise UserInputError("cross_task_expert_ablation got no tasks: pass at least one TaskBatch (e.g. build_task_batch(model, 'counting', n))")
    unknown = sorted(set(retest or {}) - set(tasks))
    if unknown:
        raise UserInputError(f"retest sets {unknown} name no task of {sorted(tasks)}")
    results, retested, never = {}, {}, {}
    for name, (evaluation, ref_set) in tasks.items():
        reference = None if method == "zero" else collect_expert_reference(model, ref_set, options)
        if reference is not None:
            never[name] = [f"L{layer}E{e}" for layer, e in reference.never_chosen()]
        results[name] = expert_ablation_sweep(model, evaluation, method, reference, options=options)
        if retest and name in retest:
            retested[name] = expert_ablation_sweep(model, retest[name], method, reference, options=options)
    recorded = {"unit": "expert", "method": method, "model": model.cfg.model_name or model.cfg.architecture,
                "moe_layers": layers, "n_experts": model.cfg.n_experts, "top_k_routing": model.cfg.n_experts_per_token,
                "batch_size": batch_size, "experts_per_pass": experts_per_pass,
                "reference_never_chose": never or None}
    return AblationReport(results, top_k=top_k, rank_by=rank_by, settings=recorded, retest=retested or None)
