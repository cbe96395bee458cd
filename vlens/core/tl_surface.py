"""The TransformerLens model methods a notebook reaches for, on a `HookedVLM`.

Tokenization helpers (`to_tokens` / `to_str_tokens` with ``prepend_bos`` / ``padding_side``,
`to_single_str_token`, `get_token_position`), `add_hook` with the same unknown-name error as
`run_with_hooks`, the ``set_use_*`` switches, and what TransformerLens's analysis tools read of a
model: `tl_parameters` (TransformerLens-named weights, for ``SVDInterpreter``) and
`all_composition_scores`. Text in place of tokens (``model("some text", return_type="loss")``, as
``evals.sanity_check`` calls it) is tokenised by `to_tokens` in `HookedVLM.coerce_inputs`. Where vlens differs from TransformerLens the method says so and raises
a clear error instead of silently doing something else.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal

import torch
from jaxtyping import Int
from torch import Tensor

from vlens.core.components.rms_norm import compute_weight
from vlens.utils.errors import UserInputError

if TYPE_CHECKING:
    from transformer_lens.hook_points import HookPoint  # HookedRootModule's type for hook_dict
    from transformer_lens.model_bridge.composition_scores import CompositionScores

    from vlens.core.components.block import BlockList
    from vlens.core.components.embed import Embed
    from vlens.core.components.unembed import Unembed
    from vlens.core.config import VLMConfig


def unknown_hook_message(name: str, known: list[str], n_layers: int) -> str:
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return (f"No hook point named {name!r} (this model has {n_layers} layers, blocks.0 .. blocks.{n_layers - 1})."
            f"{hint} List them with model.hook_dict or `vlens info --hooks`.")


class TransformerLensSurface:
    """Mixin for `HookedVLM`: TransformerLens-compatible tokenization, hooks and switches."""

    if TYPE_CHECKING:  # what the mixin reads of the model it is mixed into
        cfg: VLMConfig
        hook_dict: dict[str, HookPoint]
        embed: Embed
        unembed: Unembed
        blocks: BlockList
        tokenizer: Any

        @property
        def input_device(self) -> torch.device: ...

        def to_str_tokens(self, tokens: Any, prepend_bos: bool | None = None,
                          padding_side: Literal["left", "right"] | None = None) -> Any: ...

        def to_single_token(self, text: str) -> int: ...

    # ------------------------------------------------------------------ hooks
    def check_hook_name(self, name: Any) -> None:
        """Raise `UserInputError` naming the closest hooks when `name` (a string) is not a hook point."""
        if isinstance(name, str) and name not in self.hook_dict:
            raise UserInputError(unknown_hook_message(name, list(self.hook_dict), self.cfg.n_layers))

    def check_hook_filter(self, names: Any, what: str = "names_filter") -> None:
        """Raise `UserInputError` when `names` (a hook name, a list of them, or a filter function)
        selects no hook point, naming the closest hooks: a misspelt name would otherwise give an
        empty cache (or no hook) without a word. None (every hook point) passes."""
        if names is None:
            return
        if isinstance(names, str):
            self.check_hook_name(names)
            return
        if isinstance(names, (list, tuple, set, frozenset)):
            unknown = [name for name in names if not isinstance(name, str) or name not in self.hook_dict]
            if unknown:
                first = unknown[0] if isinstance(unknown[0], str) else repr(unknown[0])
                count = f" ({len(unknown)} of its {len(names)} names are not hook points)" if len(names) > 1 else ""
                raise UserInputError(f"{what}{count}: " + unknown_hook_message(str(first), list(self.hook_dict),
                                                                                self.cfg.n_layers))
            if not names:
                raise UserInputError(f"{what} is empty, so it selects no hook point: name some hooks, or pass None "
                                     "for all of them")
            return
        if callable(names):
            if not any(names(name) for name in self.hook_dict):
                label = getattr(names, "__qualname__", None) or repr(names)
                raise UserInputError(f"{what} {label} matches none of the model's {len(self.hook_dict)} hook points "
                                     f"(e.g. {next(iter(self.hook_dict))!r}); check the names it tests for. List them "
                                     "with model.hook_dict or `vlens info --hooks`.")
            return
        raise UserInputError(f"{what} must be a hook name, a list of names or a function of a name, got "
                             f"{type(names).__name__}")

    def get_caching_hooks(self, names_filter: Any = None, *args: Any, **kwargs: Any):
        """TransformerLens's `get_caching_hooks` (used by `run_with_cache`); a `names_filter` that selects
        no hook point is an error with the closest names (`check_hook_filter`)."""
        self.check_hook_filter(names_filter)
        return super().get_caching_hooks(names_filter, *args, **kwargs)  # type: ignore[misc]

    def add_caching_hooks(self, names_filter: Any = None, *args: Any, **kwargs: Any):
        """TransformerLens's `add_caching_hooks`, with `names_filter` checked as in `get_caching_hooks`."""
        self.check_hook_filter(names_filter)
        return super().add_caching_hooks(names_filter, *args, **kwargs)  # type: ignore[misc]

    def add_hook(self, name, hook, dir: Literal["fwd", "bwd"] = "fwd", is_permanent: bool = False,
                 level: int | None = None, prepend: bool = False) -> None:
        """TransformerLens's `add_hook`; an unknown name (or a filter matching no hook) is a clear error."""
        self.check_hook_filter(name, "hook name")
        super().add_hook(name, hook, dir=dir, is_permanent=is_permanent, level=level,  # type: ignore[misc]
                         prepend=prepend)  # the next class in HookedVLM's MRO is HookedRootModule

    @contextmanager
    def backward_ready(self, forward_args: tuple, forward_kwargs: dict):
        """Context for ``run_with_cache(incl_bwd=True)``: checks the call, makes the residual require grad.

        TransformerLens calls ``output.backward()``, so the output must be a scalar loss. With
        frozen weights nothing would require grad; the token embeddings then start the graph
        (the vision tower gets gradients only if its own weights require them).
        """
        return_type = forward_kwargs.get("return_type", forward_args[1] if len(forward_args) > 1 else "logits")
        if return_type != "loss" or forward_kwargs.get("loss_per_token"):
            raise UserInputError("run_with_cache(incl_bwd=True) backpropagates the model's output, which must be a "
                                 "scalar: pass return_type='loss' (and no loss_per_token).")
        if not torch.is_grad_enabled():
            raise UserInputError("run_with_cache(incl_bwd=True) was called with gradients disabled "
                                 "(torch.no_grad / inference_mode); call it outside that context.")

        def leaf(module, args, output: Tensor) -> Tensor | None:
            return None if output.requires_grad else output.detach().requires_grad_(True)

        handle = self.embed.register_forward_hook(leaf)
        try:
            yield
        finally:
            handle.remove()

    # ------------------------------------------------------------------ switches
    def set_use_attn_result(self, use_attn_result: bool) -> None:
        """Toggle per-head `hook_result` [batch, pos, n_heads, d_model] (costs memory)."""
        self.cfg.use_attn_result = bool(use_attn_result)

    def set_use_split_qkv_input(self, use_split_qkv_input: bool) -> None:
        """Not supported (False is accepted): vlens has no per-head ``hook_q_input``/``hook_k_input``/``hook_v_input``."""
        _unsupported_switch("set_use_split_qkv_input", use_split_qkv_input,
                            "vlens has no per-head hook_q_input / hook_k_input / hook_v_input, which TransformerLens's "
                            "direct-path patching (transformer_lens.patching.get_act_patch_direct_path) edits. For "
                            "direct-path patching, an edge from one head into a later head's Q, K or V alone, use "
                            "vlens.circuits.path_patch(model, pairs, ['L0H1->L2H3.q', ...]) (exact, on every family, "
                            "image regions as senders too: docs/interop.md); to edit a head's own Q/K/V, patch "
                            "blocks.{l}.attn.hook_q / hook_k / hook_v")

    def set_use_attn_in(self, use_attn_in: bool) -> None:
        """Not supported (False is accepted): vlens has no ``hook_attn_in``."""
        _unsupported_switch("set_use_attn_in", use_attn_in,
                            "hook blocks.{l}.ln1.hook_normalized (the attention's normalized input) instead")

    def set_use_hook_mlp_in(self, use_hook_mlp_in: bool) -> None:
        """Not supported (False is accepted): vlens has no ``hook_mlp_in``."""
        _unsupported_switch("set_use_hook_mlp_in", use_hook_mlp_in,
                            "hook blocks.{l}.hook_resid_mid (the MLP's input residual) or blocks.{l}.ln2.hook_normalized")

    # ------------------------------------------------------------------ weights for TL's analysis tools
    def tl_parameters(self) -> dict[str, Tensor]:
        """TransformerLens-named weights, as TransformerLens's ``SVDInterpreter`` and bridge read them.

        Keys: ``embed.W_E`` [d_vocab, d_model], ``unembed.W_U`` [d_model, d_vocab] (final norm
        folded in, see `vlens.core.weights`), ``unembed.b_U``; per attention layer
        ``blocks.{l}.attn.W_Q/W_K/W_V`` [n_heads, d_model, d_head] (grouped key/value heads
        repeated), ``W_O`` [n_heads, d_head, d_model], ``b_Q/b_K/b_V/b_O``; per dense MLP
        ``blocks.{l}.mlp.W_in/W_gate`` [d_model, d_mlp], ``W_out`` [d_mlp, d_model], ``b_in/b_out``;
        ``blocks.{l}.ln1.w`` / ``ln2.w`` [d_model]: the factor each norm multiplies by (``1 + w`` for
        a zero-centred norm), because the blocks' norm weights are not folded into W_Q / W_in
        (``SVDInterpreter`` multiplies ``W_in`` by ``ln2.w``, as for an unfolded TransformerLens
        model). Layers without these weights (Gated DeltaNet, mixture-of-experts MLPs) have no key;
        TransformerLens then raises its own "not a dense MLP" error. Built on each call (views and
        small products of the HF parameters).
        """
        params: dict[str, Tensor] = {"embed.W_E": self.embed.W_E, "unembed.W_U": self.unembed.W_U,
                                     "unembed.b_U": self.unembed.b_U}
        for block in self.blocks:
            prefix = f"blocks.{block.layer}"
            for norm in ("ln1", "ln2"):
                module = getattr(block, norm)
                if hasattr(module, "w"):
                    params[f"{prefix}.{norm}.w"] = _norm_factor(module)
            for sub, names in (("attn", ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")),
                               ("mlp", ("W_in", "W_gate", "W_out", "b_in", "b_out"))):
                module = getattr(block, sub)
                for name in names:
                    if hasattr(type(module), name):
                        params[f"{prefix}.{sub}.{name}"] = getattr(module, name)
        return params

    def all_composition_scores(self, mode: Literal["Q", "K", "V"]) -> CompositionScores:
        """Composition scores of every pair of heads (Elhage et al. 2021), TransformerLens 4.3's method.

        score[l1, h1, l2, h2] = ||OV_{l1,h1} @ M_{l2,h2}||_F / (||OV_{l1,h1}||_F ||M_{l2,h2}||_F) for
        l1 < l2 (0 elsewhere), computed by TransformerLens's ``utilities.composition_scores``, with
        OV = W_V W_O and M = W_Q W_K^T ("Q"), its transpose ("K") or the OV matrix ("V"), each
        [d_model, d_model]. Each head reads ``ln1(x)``, so its layer's ln1 factor (`tl_parameters`)
        is folded into W_Q / W_K / W_V first, as TransformerLens's default ``fold_ln`` does; rotary
        and Qwen3's per-head q/k norms are left out (the scores are of the weights). Only attention
        layers take part (a hybrid decoder's linear-attention layers have no W_Q): ``layer_indices``
        of the result maps tensor position i to the layer number.

        Returns TransformerLens's ``CompositionScores`` (behaves as the tensor
        [n_attn_layers, n_heads, n_attn_layers, n_heads]; ``.scores``, ``.head_labels``).
        """
        from transformer_lens.FactoredMatrix import FactoredMatrix
        from transformer_lens.model_bridge.composition_scores import CompositionScores
        from transformer_lens.utilities import composition_scores

        if mode not in ("Q", "K", "V"):
            raise UserInputError(f"all_composition_scores: mode must be 'Q', 'K' or 'V', got {mode!r}.")
        layers = [block for block in self.blocks if hasattr(type(block.attn), "W_Q")]
        if not layers:
            raise UserInputError("all_composition_scores: this model has no softmax-attention layer.")

        def folded(name: str) -> Tensor:  # [n_attn_layers, n_heads, d_model, d_*], ln1 factor folded in
            return torch.stack([_norm_factor(block.ln1)[None, :, None].to(getattr(block.attn, name))
                                * getattr(block.attn, name) for block in layers])

        W_O = torch.stack([block.attn.W_O for block in layers])
        left = FactoredMatrix(folded("W_V"), W_O)
        if mode == "V":
            right = left
        else:
            right = FactoredMatrix(folded("W_Q"), folded("W_K").transpose(-2, -1))
            right = right.T if mode == "K" else right
        scores = composition_scores(left, right, broadcast_dims=True)
        index = torch.arange(len(layers), device=scores.device)
        scores = torch.where(index[:, None, None, None] < index[None, None, :, None], scores, torch.zeros_like(scores))
        indices = [block.layer for block in layers]
        labels = [f"L{layer}H{head}" for layer in indices for head in range(self.cfg.n_heads)]
        return CompositionScores(scores=scores, layer_indices=indices, head_labels=labels)

    # ------------------------------------------------------------------ tokens
    def to_tokens(self, input: str | Sequence[str], prepend_bos: bool | None = None,
                  padding_side: Literal["left", "right"] | None = None, move_to_device: bool = True,
                  truncate: bool = True) -> Int[Tensor, "batch pos"]:
        """Text -> token ids [batch, pos] (no chat template, no image), TransformerLens semantics.

        prepend_bos: None uses ``cfg.default_prepend_bos`` (False: Qwen tokenizers have no BOS);
            True prepends the tokenizer's BOS (an error if it has none).
        padding_side: "left" / "right" for batches of different lengths (default: the tokenizer's).
        truncate: keep at most ``cfg.n_ctx`` tokens per row.
        """
        texts = [input] if isinstance(input, str) else list(input)
        if not texts or not all(isinstance(t, str) for t in texts):
            raise UserInputError("to_tokens: pass a string or a non-empty list of strings.")
        tokenizer = self.tokenizer
        if prepend_bos is None:
            prepend_bos = bool(getattr(self.cfg, "default_prepend_bos", False))
        side = padding_side or getattr(tokenizer, "padding_side", "right")
        if side not in ("left", "right"):
            raise UserInputError(f"to_tokens: padding_side must be 'left' or 'right', got {padding_side!r}.")
        prefix: list[int] = []
        if prepend_bos:
            if tokenizer.bos_token_id is None:
                raise UserInputError("to_tokens: prepend_bos=True but this tokenizer has no BOS token; "
                                     "pass prepend_bos=False.")
            prefix = [tokenizer.bos_token_id]
        rows = [prefix + tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        if truncate:
            rows = [row[: self.cfg.n_ctx] for row in rows]
        width = max(len(row) for row in rows)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        padded = [([pad] * (width - len(r)) + r) if side == "left" else (r + [pad] * (width - len(r))) for r in rows]
        tokens = torch.tensor(padded, dtype=torch.long)
        return tokens.to(self.input_device) if move_to_device else tokens

    def to_single_str_token(self, int_token: int) -> str:
        """The string of one token id (as `to_str_tokens` shows it)."""
        if isinstance(int_token, Tensor) and int_token.numel() == 1:
            int_token = int(int_token.item())
        if not isinstance(int_token, int) or isinstance(int_token, bool):
            raise UserInputError(f"to_single_str_token takes one integer token id, got {int_token!r}.")
        return str(self.to_str_tokens([int_token])[0])

    def get_token_position(self, single_token: str | int | Tensor, input: str | Tensor | Any,
                           mode: Literal["first", "last"] = "first", prepend_bos: bool | None = None,
                           padding_side: Literal["left", "right"] | None = None) -> int:
        """Position of a token in a prompt (TransformerLens semantics).

        input: a string (tokenized with `to_tokens`), token ids [pos] or [1, pos], or one-row
            `VLMInputs` (positions then count image tokens, as in the model's run).
        """
        if mode not in ("first", "last"):
            raise UserInputError(f"get_token_position: mode must be 'first' or 'last', not {mode!r}.")
        if isinstance(input, str):
            tokens = self.to_tokens(input, prepend_bos=prepend_bos, padding_side=padding_side)
        else:
            tokens = getattr(input, "input_ids", input)
        if not isinstance(tokens, Tensor):
            raise UserInputError(f"get_token_position: input must be a string, token ids or VLMInputs, "
                                 f"not {type(input).__name__}.")
        if tokens.ndim == 2:
            if tokens.shape[0] != 1:
                raise UserInputError(f"get_token_position: a 2-D input must have one row, got shape "
                                     f"{tuple(tokens.shape)}.")
            tokens = tokens[0]
        if isinstance(single_token, str):
            single_token = self.to_single_token(single_token)
        elif isinstance(single_token, Tensor):
            single_token = int(single_token.item())
        positions = (tokens == single_token).nonzero().flatten()
        if positions.numel() == 0:
            raise UserInputError(f"get_token_position: token {single_token} does not occur in the input.")
        return int(positions[0] if mode == "first" else positions[-1])


def _norm_factor(norm: Any) -> Tensor:
    """What a norm multiplies the normalized input by: ``w``, or ``1 + w`` for a zero-centred norm."""
    factor = getattr(norm, "effective_weight", None)
    return factor if isinstance(factor, Tensor) else compute_weight(norm.w, norm.source)


def _unsupported_switch(method: str, value: bool, instead: str) -> None:
    if value:
        raise NotImplementedError(f"{method}(True) is not supported by vlens: {instead}.")
