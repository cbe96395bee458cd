"""A mixture-of-experts MLP (sparse top-k routing, optional shared expert) with hooks on the routing.

Built around HF's own parameters: the router's weight [n_experts, d_model] and the experts'
tensors as HF stores them (transformers 5 fuses them into 3-D parameters, gate_up_proj
[n_experts, 2 * d_expert, d_model] and down_proj [n_experts, d_model, d_expert], or transposed),
read in place. The routing follows HF: softmax over the router logits in fp32, top-k, the top-k
weights renormalised to sum to 1 (where the family does), cast back. Hooks:

    mlp.hook_router_logits   [batch, pos, n_experts]     the router's logits (an edit re-routes)
    mlp.hook_expert_weights  [batch, pos, top_k]         the weight of each chosen expert
    mlp.hook_expert_indices  [batch, pos, top_k]         which experts were chosen (long)
    mlp.hook_expert_out      [batch, pos, top_k, d_model] each chosen expert's output, before weighting
    mlp.hook_routed_out      [batch, pos, d_model]       sum_k weight_k * expert_out_k
    mlp.shared_expert.hook_pre / hook_pre_linear / hook_post   the shared expert (a `GatedMLP`)
    mlp.hook_shared_gate     [batch, pos, 1]             sigmoid(shared_expert_gate(x)), its weight
    mlp.hook_shared_out      [batch, pos, d_model]       the gated shared expert's output

The block output is ``hook_routed_out + hook_shared_out`` (no shared expert: the routed sum).
`GroupedSigmoidMoEMLP` routes as DeepSeek-V3 / GLM-4.5V do (sigmoid scores, a per-expert bias for the
choice only, the best groups first, weights scaled); its `hook_router_logits` are the logits before the sigmoid.
Slot k of `hook_expert_out` belongs to expert `hook_expert_indices[..., k]`; an index outside
[0, n_experts) (e.g. set by a hook) runs no expert and contributes zero. Experts' weighted outputs
are added in increasing expert order, HF's eager order.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn

from vlens.core.components.mlp import GatedMLP
from vlens.core.hooks import HookPoint
from vlens.utils.errors import UserInputError


class MoEMLP(nn.Module):
    """Top-k routed experts (+ a gated shared expert), see the module docstring.

    Args:
        router: the HF router (a module with `weight` [n_experts, d_model]).
        experts: the HF experts module (fused `gate_up_proj` / `down_proj`, or `up_proj` without a
            gate; `is_transposed`, `has_gate`, `has_bias` as HF's experts decorator sets them; its
            `_apply_gate` and `act_fn` are used as they are).
        top_k: experts per token; normalize_top_k: renormalise the top-k weights to sum to 1.
        shared_expert, shared_gate: the shared expert as a `GatedMLP` and its [d_model -> 1] gate.
        ungated_shared: the shared expert's output is added without a gate (GLM-4.5V's `shared_experts`).
    """

    # HF modules (their attributes are dynamic: `experts.gate_up_proj`, `router.weight`, `experts._apply_gate`)
    router: Any
    experts: Any

    def __init__(self, router: nn.Module, experts: nn.Module, top_k: int, normalize_top_k: bool = True,
                 shared_expert: GatedMLP | None = None, shared_gate: nn.Linear | None = None,
                 ungated_shared: bool = False):
        super().__init__()
        self.ungated_shared = ungated_shared
        if getattr(experts, "has_post_expert_norm", False):
            raise UserInputError("experts with a norm after each expert are not supported by MoEMLP")
        self.router = router
        self.experts = experts
        self.top_k = int(top_k)
        self.normalize_top_k = normalize_top_k
        self.shared_expert = shared_expert
        self.shared_gate = shared_gate
        self.n_experts = int(self.router.weight.shape[0])
        self.hook_router_logits = HookPoint()  # [batch, pos, n_experts]
        self.hook_expert_weights = HookPoint()  # [batch, pos, top_k]
        self.hook_expert_indices = HookPoint()  # [batch, pos, top_k]
        self.hook_expert_out = HookPoint()  # [batch, pos, top_k, d_model]
        self.hook_routed_out = HookPoint()  # [batch, pos, d_model]
        self.hook_shared_gate = HookPoint()  # [batch, pos, 1]
        self.hook_shared_out = HookPoint()  # [batch, pos, d_model]

    # ---- weight views (of the HF parameters) ----
    @property
    def W_router(self) -> Float[Tensor, "d_model n_experts"]:
        return self.router.weight.T

    def expert_weights(self, expert: int) -> tuple[Tensor | None, Tensor, Tensor]:
        """Expert `expert`'s (W_gate [d_model, d_expert] or None, W_in [d_model, d_expert], W_out [d_expert, d_model])."""
        ex = self.experts
        transposed = bool(getattr(ex, "is_transposed", False))
        if getattr(ex, "has_gate", True):
            fused = ex.gate_up_proj[expert]
            fused = fused if transposed else fused.T  # [d_model, 2 * d_expert]
            gate, up = fused.chunk(2, dim=-1) if getattr(ex, "is_concatenated", True) else (fused[:, 0::2],
                                                                                          fused[:, 1::2])
        else:
            gate, up = None, ex.up_proj[expert] if transposed else ex.up_proj[expert].T
        down = ex.down_proj[expert]
        return gate, up, down if transposed else down.T

    @property
    def b_out(self) -> Float[Tensor, "d_model"]:
        """What the MLP adds besides its neurons: zeros (routed experts carry no output bias here)."""
        weight = self.router.weight
        return torch.zeros(weight.shape[1], dtype=weight.dtype, device=weight.device)

    # ---- forward ----
    def route(self, x: Float[Tensor, "batch pos d_model"]) -> tuple[Tensor, Tensor, Tensor]:
        """(router logits [batch, pos, n_experts], top-k weights [batch, pos, k], indices [batch, pos, k]), hooked."""
        logits = self.hook_router_logits(F.linear(x, self.router.weight))
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        weights, indices = torch.topk(probs, self.top_k, dim=-1)
        if self.normalize_top_k:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = self.hook_expert_weights(weights.to(logits.dtype))
        indices = self.hook_expert_indices(indices)
        return logits, weights, indices

    def run_experts(self, flat: Float[Tensor, "n d_model"], indices: Int[Tensor, "n k"]) -> Float[Tensor, "n k d_model"]:
        """Every chosen expert's output for every token and slot (zeros for an index out of range)."""
        ex = self.experts
        out = flat.new_zeros(*indices.shape, flat.shape[-1])
        transposed = bool(getattr(ex, "is_transposed", False))
        has_gate, has_bias = bool(getattr(ex, "has_gate", True)), bool(getattr(ex, "has_bias", False))
        # HF's eager order: experts ascending, each expert's tokens slot-major
        mask = F.one_hot(indices.clamp(-1, self.n_experts).masked_fill(indices < 0, self.n_experts),
                         num_classes=self.n_experts + 1).permute(2, 1, 0)  # [E + 1, k, n]
        for expert in torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero().flatten().tolist():
            if expert == self.n_experts:
                continue
            slot, token = torch.where(mask[expert])
            hidden = flat[token]
            first = ex.gate_up_proj if has_gate else ex.up_proj
            hidden = hidden @ first[expert] if transposed else F.linear(hidden, first[expert])
            if has_bias:
                hidden = hidden + (ex.gate_up_proj_bias if has_gate else ex.up_proj_bias)[expert]
            hidden = ex._apply_gate(hidden) if has_gate else ex.act_fn(hidden)
            hidden = hidden @ ex.down_proj[expert] if transposed else F.linear(hidden, ex.down_proj[expert])
            if has_bias:
                hidden = hidden + ex.down_proj_bias[expert]
            out[token, slot] = hidden.to(out.dtype)
        return out

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        batch, pos, d_model = x.shape
        _, weights, indices = self.route(x)
        k = indices.shape[-1]
        expert_out = self.run_experts(x.reshape(-1, d_model), indices.reshape(-1, k))
        expert_out = self.hook_expert_out(expert_out.view(batch, pos, k, d_model))
        weighted = (expert_out * weights[..., None]).to(x.dtype)
        # add the slots in increasing expert order (HF's index_add_ order)
        order = indices.argsort(dim=-1, stable=True)
        weighted = weighted.gather(2, order[..., None].expand_as(weighted))
        routed = torch.zeros_like(x)
        for slot in range(k):
            routed = routed + weighted[:, :, slot]
        routed = self.hook_routed_out(routed)
        if self.shared_expert is None:
            return routed
        shared = self.shared_expert(x)
        if self.ungated_shared:  # GLM-4.5V's shared experts add their output as it is
            return routed + self.hook_shared_out(shared)
        if self.shared_gate is None:
            raise RuntimeError("a shared expert needs its gate (shared_expert_gate)")
        gate = self.hook_shared_gate(torch.sigmoid(self.shared_gate(x)))
        return routed + self.hook_shared_out(gate * shared)


class GroupedSigmoidMoEMLP(MoEMLP):
    """`MoEMLP` with DeepSeek-V3-style routing, as GLM-4.5V's `Glm4vMoeTextTopkRouter` (all in fp32):
    scores = sigmoid(logits); the choice reads scores + `e_score_correction_bias`, keeps the `topk_group`
    of `n_group` groups whose two best choices sum highest, takes the top k there; the weights are the
    chosen experts' scores (renormalised to sum to 1 where `norm_topk_prob`), times `routed_scaling_factor`.
    The router module holds those settings."""

    def route(self, x: Float[Tensor, "batch pos d_model"]) -> tuple[Tensor, Tensor, Tensor]:
        router = self.router
        logits = self.hook_router_logits(F.linear(x.float(), router.weight.float()))
        n, groups = self.n_experts, int(router.num_group)
        scores = logits.sigmoid().reshape(-1, n)
        choice = scores + router.e_score_correction_bias
        group_scores = choice.view(-1, groups, n // groups).topk(2, dim=-1)[0].sum(dim=-1)
        best = torch.topk(group_scores, k=int(router.topk_group), dim=-1, sorted=False)[1]
        keep = torch.zeros_like(group_scores).scatter_(1, best, 1)
        keep = keep.unsqueeze(-1).expand(-1, groups, n // groups).reshape(-1, n)
        indices = torch.topk(choice.masked_fill(~keep.bool(), float("-inf")), k=self.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, indices)
        if self.normalize_top_k:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        weights = weights * router.routed_scaling_factor
        shape = (*logits.shape[:-1], self.top_k)
        return logits, self.hook_expert_weights(weights.view(shape)), self.hook_expert_indices(indices.view(shape))
