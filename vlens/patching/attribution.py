"""Attribution patching (AtP) and AtP*'s fix for saturated attention.

AtP estimates the effect of patching an activation a from the corrupt run into the clean run
by a first-order Taylor expansion around the clean run:

    delta LD ~= (a_corrupt - a_clean) . dLD/da |clean

with LD = logit[corrupt answer] - logit[clean answer] at the final position. One clean forward,
one corrupt forward and one backward give the estimate for every head's `hook_z` and every
residual position at once.

AtP* (Kramar et al. 2024, "AtP*: An efficient and scalable method for localizing LLM behaviour
to components") notes that the linearisation fails through a saturated softmax: patching a
head's queries or keys can move its attention a lot while the gradient through the softmax is
~0. For query and key patches it therefore recomputes the attention pattern exactly with the
corrupt queries (keys) and linearises only after the softmax:

    delta LD ~= sum_{q,k} dLD/dA[q,k] . (softmax(Q_corrupt K^T)[q,k] - A_clean[q,k])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from jaxtyping import Float
from torch import Tensor

from vlens.core.components.attention import Attention
from vlens.core.hooks import act_name
from vlens.parallel.options import Readout, SweepOptions, fold_legacy
from vlens.patching.conditions import final_logits, readout_logits
from vlens.patching.metrics import MetricFn, MetricFunction, logit_diff
from vlens.patching.pairs import PairAnswers, PairBatch
from vlens.utils.errors import UserInputError
from vlens.utils.finite import json_safe, warn_non_finite
from vlens.utils.ragged import pad_heads
from vlens.utils.results import Result, nan_tensor
from vlens.viz.figures import layer_head_heatmap
from vlens.viz.optional import require_plotly

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM


@dataclass
class AttributionResult(Result):
    """AtP estimates of the change in the mean metric (patched - clean) per node; the metric is
    the logit difference (corrupt minus clean answer at the final position) unless one was given.

    z: [n_layers, n_heads] patching one head's hook_z at all positions.
    q: [n_layers, n_heads] patching one head's queries (AtP* softmax recomputation if `qk_fix`).
    k: [n_layers, n_key_value_heads] patching one key/value head's keys (same).
    resid_pre: [n_layers, seq_len] patching the residual stream entering a layer at one position.
    per_pair_z: [n_pairs, n_layers, n_heads]; pair_ids; clean_logit_diff [n_pairs] (the clean
    run's metric per pair); metric: "logit_diff" or the metric's name.
    """

    z: Float[Tensor, "n_layers n_heads"]
    q: Float[Tensor, "n_layers n_heads"]
    k: Float[Tensor, "n_layers n_kv_heads"]
    resid_pre: Float[Tensor, "n_layers seq_len"]
    per_pair_z: Float[Tensor, "n_pairs n_layers n_heads"]
    pair_ids: list[str]
    clean_logit_diff: Float[Tensor, "n_pairs"]
    qk_fix: bool = True
    exact_z: Tensor | None = None  # optional: an exact head sweep's delta logit diff, to compare
    answers: PairAnswers | None = None  # the pairs' answers and tokens (PairBatch.answers_json)
    metric: str = "logit_diff"

    kind: ClassVar[str] = "attribution_patching"
    saved_dims: ClassVar[dict[str, str]] = {"pair_ids": "n_pairs"}  # checked when a file is read

    @property
    def spearman_z(self) -> float | None:
        """Spearman correlation of the z estimates with `exact_z` (None if not set)."""
        return None if self.exact_z is None else spearman(self.z, self.exact_z)

    def to_dict(self) -> dict:
        """JSON-ready dict; non-finite estimates are None."""
        extra = {} if self.exact_z is None else {"exact_z": self.exact_z.tolist(), "spearman_z_vs_exact": self.spearman_z}
        return json_safe({
            "mode": "atp",
            "n_pairs": len(self.pair_ids),
            "pair_ids": list(self.pair_ids),
            "layers": list(range(self.z.shape[0])),
            "heads": list(range(self.z.shape[1])),
            "qk_fix": self.qk_fix,
            "metric": self.metric,
            "estimates": f"change of the mean {self.metric} (patched minus clean run), first order",
            "z": self.z.tolist(),
            "q": self.q.tolist(),
            "k": self.k.tolist(),
            "resid_pre": self.resid_pre.tolist(),
            "per_pair_z": self.per_pair_z.tolist(),
            "clean_logit_diff": self.clean_logit_diff.tolist(),
            **({"answers": self.answers} if self.answers is not None else {}),
            **extra,
        })

    @classmethod
    def from_dict(cls, data: dict) -> AttributionResult:
        """The result `to_dict` wrote."""
        z = nan_tensor(data["z"])
        exact = data.get("exact_z")
        return cls(z=z, q=nan_tensor(data["q"]), k=nan_tensor(data["k"]), resid_pre=nan_tensor(data["resid_pre"]),
                   per_pair_z=nan_tensor(data["per_pair_z"]), pair_ids=list(data["pair_ids"]),
                   clean_logit_diff=nan_tensor(data["clean_logit_diff"]), qk_fix=bool(data["qk_fix"]),
                   exact_z=None if exact is None else nan_tensor(exact), answers=data.get("answers"),
                   metric=data.get("metric", "logit_diff"))

    def plot(self, node: str = "z"):
        """Layer x head heatmap of the z (or q) estimates; layer x position for "resid_pre"."""
        title = f"attribution patching ({'AtP*' if self.qk_fix and node in ('q', 'k') else 'AtP'}): {node}"
        if node in ("z", "q", "k"):
            return layer_head_heatmap(getattr(self, node), title=title, value_label="est. delta logit diff")

        go = require_plotly()
        figure = go.Figure(go.Heatmap(z=self.resid_pre.numpy(), colorscale="RdBu_r", zmid=0.0))
        return figure.update_layout(title=title, xaxis_title="position", yaxis_title="layer")


def attribution_patching(model: HookedVLM, batch: PairBatch, qk_fix: bool = True, metric: MetricFn | None = None,
                         options: SweepOptions | None = None, **legacy: Any) -> AttributionResult:
    """AtP for every head's hook_z, queries and keys and every residual position (one backward).

    Estimates are of mean_pairs(M_patched - M_clean) for the metric M: by default the logit
    difference at the final position (compare with an exact sweep's
    `metrics["logit_diff"] - baseline.clean_logit_diff.mean()`), or a differentiable
    ``metric(logits [n_pairs, n_readout, d_vocab]) -> [n_pairs]`` read at `options.readout`.

    Args:
        model: the model.
        batch: the pairs (`build_pair_batch`).
        qk_fix: AtP*'s exact softmax for query / key patches (module docstring).
        metric: default the logit difference at the final position.
        options: `batch_size` (pairs per forward / backward, default all at once; the estimates
            are the same pair means, so memory is bounded by batch_size pairs on long prompts),
            `readout`, `progress`, `sharding` (the pair chunks split across processes),
            `cache_device` (where the corrupt run's activations are kept).
    Returns:
        an `AttributionResult` (z, q: [n_layers, n_heads]; k: [n_layers, n_kv_heads];
        resid_pre: [n_layers, seq_len]).
    """
    options = fold_legacy(options, legacy, "attribution_patching", ("batch_size", "readout"))
    readout = options.readout
    if metric is None and readout != "final":
        raise UserInputError("the default metric (logit difference) reads the final position: pass metric=... "
                             f"to read readout={readout!r}")
    scorer = None if metric is None else MetricFunction(metric)
    size = batch.n_pairs if options.batch_size is None else min(options.batch_size, batch.n_pairs)
    chunks = [list(range(s, min(s + size, batch.n_pairs))) for s in range(0, batch.n_pairs, size)]

    def run(rows: list[int]) -> dict:
        """One chunk's estimates (as plain fields: a unit's result is gathered across processes)."""
        whole = len(chunks) == 1
        part = _attribution_chunk(model, batch if whole else batch.select(rows), qk_fix,
                                  None if scorer is None else scorer if whole else scorer.subset(rows), readout,
                                  options.cache_device)
        return vars(part)

    parts = [AttributionResult(**fields) for fields in
             options.shards.map(chunks, run, desc="attribution patching", progress=options.progress)]
    if len(parts) == 1:
        return parts[0]
    weights = torch.tensor([len(p.pair_ids) for p in parts], dtype=torch.float32) / batch.n_pairs

    def mean(name: str) -> Tensor:
        return sum(w * getattr(p, name) for w, p in zip(weights, parts, strict=True))

    per_pair_z = torch.cat([p.per_pair_z for p in parts])
    return AttributionResult(
        z=per_pair_z.mean(0), q=mean("q"), k=mean("k"), resid_pre=mean("resid_pre"), per_pair_z=per_pair_z,
        pair_ids=list(batch.pair_ids), clean_logit_diff=torch.cat([p.clean_logit_diff for p in parts]),
        qk_fix=qk_fix, answers=batch.answers_json(), metric=parts[0].metric,
    )


def _attribution_chunk(model: HookedVLM, batch: PairBatch, qk_fix: bool, metric: MetricFunction | None = None,
                       readout: Readout = "final", cache_device: torch.device | str | None = None) -> AttributionResult:
    cfg = model.cfg
    n_layers = cfg.n_layers
    softmax = [layer for layer in range(n_layers) if not cfg.is_linear_attention(layer)]  # layers with q, k, pattern
    names = {kind: [act_name(kind, layer) for layer in range(n_layers)] for kind in ("z", "resid_pre")}
    names.update({kind: [act_name(kind, layer) for layer in softmax] for kind in ("rot_q", "rot_k")})
    wanted = {n for group in names.values() for n in group}
    with torch.no_grad():
        where: dict[str, Any] = {} if cache_device is None else {"device": cache_device}
        _, corrupt = model.run_with_cache(batch.corrupt, names_filter=lambda n: n in wanted, return_type=None,
                                          **where)
        state = model.start_run(batch.clean)

    clean: dict[str, Tensor] = {}

    def keep(act: Tensor, hook) -> None:
        clean[hook.name] = act

    pattern_names = [act_name("pattern", layer) for layer in softmax]
    capture = [(n, keep) for n in sorted(wanted) + pattern_names]
    with torch.enable_grad():
        resid_in = state.resid.detach().requires_grad_(True)
        with model.hooks(fwd_hooks=capture):
            resid = model.run_blocks(resid_in, state, 0, None)
        if metric is None:
            logits = final_logits(model, resid, batch.final)
            per_pair_ld = logit_diff(logits, batch.clean_tokens, batch.corrupt_tokens)
        else:
            values = metric.raw(readout_logits(model, resid, batch.readout_positions(readout)))
            if not isinstance(values, Tensor) or values.shape != (batch.n_pairs,):
                shape = tuple(values.shape) if isinstance(values, Tensor) else type(values).__name__
                raise UserInputError(f"attribution patching needs one metric value per pair [{batch.n_pairs}], got "
                                     f"{shape}")
            per_pair_ld = values
        grad_names = names["z"] + names["resid_pre"] + pattern_names + names["rot_q"] + names["rot_k"]
        grads = dict(zip(grad_names, torch.autograd.grad(per_pair_ld.sum(), [clean[n] for n in grad_names],
                                                         allow_unused=True), strict=True))

    with torch.no_grad():
        def atp(name: str, reduce_dims: tuple[int, ...]) -> Tensor:
            grad = grads[name]
            if grad is None:
                return torch.zeros_like(clean[name]).sum(reduce_dims)
            return ((corrupt[name].to(grad.device, grad.dtype) - clean[name].detach()) * grad).sum(reduce_dims)

        valid = batch.clean.attention_mask.to(resid.device).bool()
        # [n, L, H]; NaN where a layer has fewer heads than the widest (a hybrid decoder's linear attention)
        per_pair_z = pad_heads([atp(n, (1, 3)).float().cpu() for n in names["z"]], cfg.max_heads, dim=1)
        resid_est = torch.stack([atp(n, (2,)) * valid for n in names["resid_pre"]], dim=1).float().cpu()  # [n, L, pos]
        if qk_fix:
            q_est, k_est = _qk_atp_star(model, state, clean, corrupt, grads)
        else:
            q_est = torch.full((n_layers, cfg.max_heads), float("nan"))
            k_est = torch.full((n_layers, cfg.n_key_value_heads), float("nan"))
            for layer, q_name, k_name in zip(softmax, names["rot_q"], names["rot_k"], strict=True):
                q_est[layer, :cfg.n_heads] = atp(q_name, (1, 3)).float().cpu().mean(0)
                k_est[layer] = atp(k_name, (1, 3)).float().cpu().mean(0)
    _report_non_finite(model, batch, per_pair_ld.detach(), {"z": per_pair_z, "q": q_est, "k": k_est,
                                                            "resid_pre": resid_est})
    return AttributionResult(
        z=per_pair_z.mean(0), q=q_est, k=k_est, resid_pre=resid_est.mean(0), per_pair_z=per_pair_z,
        pair_ids=list(batch.pair_ids), clean_logit_diff=per_pair_ld.detach().float().cpu(), qk_fix=qk_fix,
        answers=batch.answers_json(), metric="logit_diff" if metric is None else metric.name,
    )


def _report_non_finite(model: HookedVLM, batch: PairBatch, clean_ld: Tensor, estimates: dict[str, Tensor]) -> None:
    """Warn when the clean or corrupt run, or an estimate, is not finite (the estimates are then NaN)."""
    if not bool(torch.isfinite(clean_ld).all()):
        warn_non_finite("attribution patching", "the clean run's logit difference", model, batch.clean)
        return
    bad = [name for name, values in estimates.items() if not bool(torch.isfinite(values).all())]
    if bad:
        warn_non_finite("attribution patching", f"estimates for {', '.join(bad)} (the corrupt run or the gradients)",
                        model, batch.corrupt)


def _softmax_pattern(q: Tensor, k: Tensor, masks, scaling: float) -> Tensor:
    """Attention probabilities as the explicit attention path computes them. q,k: [batch, heads, pos, d]."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scaling + masks.additive
    scores = scores.masked_fill(~masks.allowed, torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)


def _qk_atp_star(model: HookedVLM, state, clean: dict, corrupt, grads: dict) -> tuple[Tensor, Tensor]:
    """AtP* query / key estimates: exact new softmax, linear after it. Returns ([L, H], [L, n_kv]); NaN on
    linear-attention layers (no queries, keys or pattern there)."""
    cfg = model.cfg
    groups = cfg.n_heads // cfg.n_key_value_heads
    q_out = torch.full((cfg.n_layers, cfg.max_heads), float("nan"))
    k_out = torch.full((cfg.n_layers, cfg.n_key_value_heads), float("nan"))
    for layer in range(cfg.n_layers):
        attn = model.blocks[layer].attn
        if not isinstance(attn, Attention):
            continue
        q_out[layer, :cfg.n_heads], k_out[layer] = 0.0, 0.0
        grad_pattern = grads[act_name("pattern", layer)]
        if grad_pattern is None:
            continue
        scaling, masks = attn.scaling, attn.layer_masks(state.masks)  # a sliding layer's window included
        pattern = clean[act_name("pattern", layer)].detach()  # [b, H, q, k]
        q_clean = clean[act_name("rot_q", layer)].detach().transpose(1, 2)  # [b, H, pos, d]
        k_clean = clean[act_name("rot_k", layer)].detach().transpose(1, 2).repeat_interleave(groups, dim=1)
        q_corr = corrupt[act_name("rot_q", layer)].to(q_clean.device, q_clean.dtype).transpose(1, 2)
        k_corr = corrupt[act_name("rot_k", layer)].to(k_clean.device, k_clean.dtype).transpose(1, 2) \
            .repeat_interleave(groups, dim=1)
        # patch every head's queries at once: head h's new pattern only depends on head h's queries
        new_q = _softmax_pattern(q_corr, k_clean, masks, scaling)
        q_out[layer, :cfg.n_heads] = ((new_q - pattern) * grad_pattern).sum((2, 3)).float().mean(0).cpu()
        new_k = _softmax_pattern(q_clean, k_corr, masks, scaling)
        per_head = ((new_k - pattern) * grad_pattern).sum((2, 3)).float().mean(0).cpu()  # [H]
        k_out[layer] = per_head.view(cfg.n_key_value_heads, groups).sum(-1)
    return q_out, k_out


def spearman(a: Tensor, b: Tensor) -> float:
    """Spearman rank correlation of two same-shaped tensors (scipy; average ranks for ties).

    NaN when either side is constant (no ranking to correlate).
    """
    x, y = a.detach().flatten().double().cpu(), b.detach().flatten().double().cpu()
    if x.shape != y.shape or x.numel() < 2:
        raise UserInputError(f"spearman needs two tensors of the same size >= 2, got {tuple(a.shape)} and {tuple(b.shape)}")
    if bool((x == x[0]).all()) or bool((y == y[0]).all()):
        return float("nan")
    try:
        from scipy.stats import spearmanr
    except ImportError as error:
        raise ImportError("rank correlations need scipy: pip install 'vlens[analysis]'") from error
    return float(spearmanr(x.numpy(), y.numpy()).statistic)
