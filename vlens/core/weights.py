"""TransformerLens-named weight views of a `HookedVLM`, stacked over layers.

Every view is built from the HF parameters on access (views or small products, never a stored
second copy), so edits of the HF weights show up at once.

Folding, compared with TransformerLens (see README, "Coming from TransformerLens"):
- the final norm's weight IS folded into ``W_U`` (``diag(ln_final_w) @ lm_head.weight.T``, as
  after TransformerLens's ``fold_ln``), so direct logit attribution adds up;
- the blocks' norm weights are NOT folded: ``W_Q``/``W_K``/``W_V`` read ``blocks[l].ln1(x)``
  and ``W_in``/``W_gate`` read ``blocks[l].ln2(x)``, whose weights are applied, exactly as in HF.
  ``cache.apply_ln_to_stack(stack, layer=l)`` only divides by the scale, so multiply by
  ``model.blocks[l].ln1.w`` before ``W_Q`` etc.;
- no weight centering (``center_writing_weights`` / ``center_unembed``): RMSNorm does not centre.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from jaxtyping import Float, Int
from torch import Tensor

from vlens.utils.errors import UserInputError
from vlens.utils.tl_modules import FactoredMatrix

if TYPE_CHECKING:
    from vlens.core.components.block import BlockList
    from vlens.core.components.embed import Embed
    from vlens.core.components.unembed import Unembed
    from vlens.core.config import VLMConfig


class WeightsMixin:
    """W_E, W_U, W_Q/K/V/O, b_*, W_in/W_gate/W_out, QK/OV, accumulated_bias, residual directions.

    Shapes follow TransformerLens: W_Q/W_K/W_V [n_layers, n_heads, d_model, d_head] (grouped
    key/value heads repeated to one per query head), W_O [n_layers, n_heads, d_head, d_model].
    """

    if TYPE_CHECKING:  # what the mixin reads of the model it is mixed into
        cfg: VLMConfig
        blocks: BlockList
        embed: Embed
        unembed: Unembed

        def to_single_token(self, text: str) -> int: ...

    def _stack(self, name: str, sub: str = "attn") -> Tensor:
        views = []
        for block in self.blocks:
            module = getattr(block, sub)
            if not hasattr(type(module), name):  # e.g. a Gated DeltaNet layer has no W_Q, a MoE MLP no W_in
                raise UserInputError(f"model.{name}: layer {block.layer}'s {sub} is a {type(module).__name__}, which has "
                                 f"no {name}; read the layers that have one: model.blocks[l].{sub}.{name}")
            views.append(getattr(module, name))
        if len({tuple(v.shape) for v in views}) > 1:
            raise UserInputError(f"model.{name}: the layers' shapes differ ({sorted({tuple(v.shape) for v in views})}: a "
                             f"hybrid decoder's linear-attention layers have their own heads), so they do not stack; "
                             f"read them per layer: model.blocks[l].{sub}.{name}")
        return torch.stack(views)

    @property
    def W_E(self) -> Float[Tensor, "d_vocab d_model"]:
        return self.embed.W_E

    @property
    def W_U(self) -> Float[Tensor, "d_model d_vocab"]:
        """Effective unembedding ``diag(ln_final_w) @ lm_head.weight.T`` (final norm folded in).

        Computed on each access ([d_model, d_vocab]: ~1 GB in bf16 for Qwen2.5-VL-7B), so keep
        it in a variable inside loops; `tokens_to_residual_directions` reads single columns.
        ``model.ln_final(x) @ W_U + b_U`` equals the logits for a residual ``x``.
        """
        return self.unembed.W_U

    @property
    def b_U(self) -> Float[Tensor, "d_vocab"]:
        return self.unembed.b_U

    @property
    def W_Q(self) -> Float[Tensor, "n_layers n_heads d_model d_head"]:
        return self._stack("W_Q")

    @property
    def W_K(self) -> Float[Tensor, "n_layers n_heads d_model d_head"]:
        return self._stack("W_K")

    @property
    def W_V(self) -> Float[Tensor, "n_layers n_heads d_model d_head"]:
        return self._stack("W_V")

    @property
    def W_O(self) -> Float[Tensor, "n_layers n_heads d_head d_model"]:
        return self._stack("W_O")

    @property
    def b_Q(self) -> Float[Tensor, "n_layers n_heads d_head"]:
        return self._stack("b_Q")

    @property
    def b_K(self) -> Float[Tensor, "n_layers n_heads d_head"]:
        return self._stack("b_K")

    @property
    def b_V(self) -> Float[Tensor, "n_layers n_heads d_head"]:
        return self._stack("b_V")

    @property
    def b_O(self) -> Float[Tensor, "n_layers d_model"]:
        return self._stack("b_O")

    @property
    def W_in(self) -> Float[Tensor, "n_layers d_model d_mlp"]:
        """The up projection (TransformerLens's W_in of a gated MLP)."""
        return self._stack("W_in", "mlp")

    @property
    def W_gate(self) -> Float[Tensor, "n_layers d_model d_mlp"]:
        return self._stack("W_gate", "mlp")

    @property
    def W_out(self) -> Float[Tensor, "n_layers d_mlp d_model"]:
        return self._stack("W_out", "mlp")

    @property
    def b_in(self) -> Float[Tensor, "n_layers d_mlp"]:
        return self._stack("b_in", "mlp")

    @property
    def b_out(self) -> Float[Tensor, "n_layers d_model"]:
        return self._stack("b_out", "mlp")

    @property
    def QK(self) -> FactoredMatrix:
        """``W_Q @ W_K^T`` per head, [n_layers, n_heads, d_model, d_model] as a FactoredMatrix.

        The bilinear form on ``ln1(x)`` before rotary (and, for Qwen3-VL, before the per-head
        q/k norms, which make the real scores non-bilinear); biases excluded, as in TransformerLens.
        """
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    @property
    def OV(self) -> FactoredMatrix:
        """``W_V @ W_O`` per head, [n_layers, n_heads, d_model, d_model] as a FactoredMatrix (reads ``ln1(x)``)."""
        return FactoredMatrix(self.W_V, self.W_O)

    def accumulated_bias(self, layer: int, mlp_input: bool = False,
                         include_mlp_biases: bool = True) -> Float[Tensor, "d_model"]:
        """Sum of the biases written into the residual stream before `layer` (TransformerLens API).

        What a block adds besides its heads and neurons: the attention output bias ``b_O``
        (o_proj's bias) and, with `include_mlp_biases`, the MLP output bias ``b_out``
        (down_proj's bias). q/k/v biases act inside attention and never reach the residual
        directly. `mlp_input`: also the attention bias of `layer` itself (the MLP's input).
        Used by `cache.get_full_resid_decomposition` for its "bias" component.
        """
        n_layers = self.cfg.n_layers
        if not 0 <= layer <= n_layers:
            raise UserInputError(f"layer must be in 0..{n_layers} (n_layers means the unembed), got {layer}")
        if mlp_input and layer == n_layers:
            raise UserInputError("mlp_input=True needs a layer below n_layers: the unembed has no MLP")
        reference = self.blocks[0].attn.b_O
        total = torch.zeros(self.cfg.d_model, dtype=reference.dtype, device=reference.device)
        for block in self.blocks[:layer]:
            total = total + block.attn.b_O.to(total.device)
            if include_mlp_biases:
                total = total + block.mlp.b_out.to(total.device)
        if mlp_input:
            total = total + self.blocks[layer].attn.b_O.to(total.device)
        return total

    def tokens_to_residual_directions(
        self, tokens: str | int | Int[Tensor, "..."]
    ) -> Float[Tensor, "... d_model"]:
        """Columns of the effective ``W_U`` for tokens: shape ``tokens.shape + (d_model,)``.

        A string must be a single token; an int or a one-element tensor gives [d_model]. These
        include the final norm's weight, so ``cache.logit_attrs`` sums to the logits.
        """
        if isinstance(tokens, str):
            tokens = self.to_single_token(tokens)
        if isinstance(tokens, Tensor):
            if tokens.is_floating_point():
                raise TypeError(f"tokens must hold integer token ids, got dtype {tokens.dtype}")
            return self.unembed.directions(tokens.reshape(()) if tokens.numel() == 1 else tokens)
        if isinstance(tokens, int) and not isinstance(tokens, bool):
            return self.unembed.directions(torch.tensor(tokens))
        raise TypeError(f"tokens must be a string, an int or an integer tensor, not {type(tokens).__name__}")
