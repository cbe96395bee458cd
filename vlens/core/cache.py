"""`VLMActivationCache`: TransformerLens's ActivationCache, aware of what a VLM writes into the residual.

Besides attention and MLP outputs, a VLM's residual stream receives
- token embeddings at text positions (``hook_embed``),
- the vision features at image positions: block 0's input is ``hook_inputs_embeds``, the token
  embeddings with the image features written over the image placeholders,
- for Qwen3-VL, DeepStack features added at image positions after some early blocks
  (``blocks.{l}.hook_deepstack``, [n_image_tokens, d_model]).
TransformerLens's `decompose_resid` / `get_full_resid_decomposition` count only ``hook_embed``,
so at image positions their parts would not add up. Here the components are

    "embed"          hook_embed at text positions, 0 at image positions
    "image_embed"    the image features at image positions, 0 elsewhere
    "{l}_deepstack"  layer l's DeepStack features at image positions (Qwen3-VL), 0 elsewhere

and they add up to the residual stream at every position. Where a norm follows a block's attention
(Gemma 3's ``ln1_post``), a head's result is its share of that norm's output at the cached scale, and
single neurons are refused where one follows the MLP (``ln2_post``). Image positions are where
``hook_inputs_embeds`` differs from ``hook_embed`` (where something other than the token's own
embedding entered the stream), so both hooks must be in the cache.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Bool, Float
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor

from vlens.core.components.sandwich_block import post_norm_shares
from vlens.utils.errors import UserInputError
from vlens.utils.tl_modules import ActivationCache, Slice

CACHE_FORMAT = "vlens_activation_cache"  # the safetensors metadata's "format" of a saved cache
_MODEL_SHAPE = ("n_layers", "d_model", "n_heads", "d_vocab")  # recorded, so a cache is not read with another model

# hooks laid out [n_image_tokens, d_model] over all images of the batch, in row order
_IMAGE_TOKEN_HOOKS = ("hook_deepstack", "vision.hook_image_embeds")


def _as_slice(pos_slice) -> Slice:
    return pos_slice if isinstance(pos_slice, Slice) else Slice(pos_slice)


class VLMActivationCache(ActivationCache):
    """An `ActivationCache` whose residual decompositions include the vision inputs (see module doc)."""

    def __getitem__(self, key: Any) -> Tensor:
        try:
            return super().__getitem__(key)
        except KeyError as error:
            name = str(error.args[0]) if error.args else str(key)
            if "attn_scores" in name or (isinstance(key, tuple) and key and key[0] in ("attn_scores", "scores")):
                raise KeyError(f"{name}: run_with_cache leaves the attention scores out unless asked (the pattern "
                               "holds the same information): run_with_cache(..., attn_scores=True), or name "
                               "them in names_filter") from None
            raise

    # ------------------------------------------------------------------ persistence
    def __reduce_ex__(self, protocol: Any) -> Any:
        raise UserInputError(
            "An activation cache is not pickled (torch.save / pickle): it holds the model it came from, and "
            "torch.load (weights_only=True) refuses it. Save it with cache.save('cache.safetensors') and read it "
            "back with vlens.load_cache('cache.safetensors', model) (every hook, the image components included), "
            "or torch.save(dict(cache.cache_dict), path) for the tensors alone."
        )

    def __deepcopy__(self, memo: dict) -> VLMActivationCache:
        return VLMActivationCache(copy.deepcopy(self.cache_dict, memo), self.model, has_batch_dim=self.has_batch_dim)

    def save(self, path: str | Path) -> Path:
        """Write every cached activation to one safetensors file (`path`; ".safetensors" is added if missing).

        Tensors that share storage (views of one tensor) are written as separate copies; the batch-dimension
        flag and the model's name go in the file's metadata. `vlens.load_cache(path, model)` reads it back as a
        `VLMActivationCache` whose every entry and every decomposition (the image components included) equal
        this one's. Returns the file written.
        """
        path = Path(path)
        if path.suffix != ".safetensors":
            path = path.with_name(path.name + ".safetensors")
        if path.is_dir():
            raise UserInputError(f"{path} is a folder: cache.save takes a file path (e.g. {path / 'cache.safetensors'}).")
        path.parent.mkdir(parents=True, exist_ok=True)
        seen: set[int] = set()
        tensors = {}
        for name, tensor in self.cache_dict.items():
            if not isinstance(tensor, Tensor):
                raise UserInputError(f"cache entry {name!r} is a {type(tensor).__name__}, not a tensor: only tensors "
                                     "can be saved; remove it from cache.cache_dict first.")
            storage = tensor.untyped_storage().data_ptr()
            # safetensors refuses tensors that share memory: give every entry after the first its own copy
            tensors[name] = tensor.detach().contiguous() if storage not in seen else tensor.detach().clone()
            seen.add(storage)
        cfg = getattr(self.model, "cfg", None)
        metadata = {"format": CACHE_FORMAT, "has_batch_dim": json.dumps(bool(self.has_batch_dim)),
                    "names": json.dumps(list(self.cache_dict)),
                    "model_name": str(getattr(cfg, "model_name", "") or ""),
                    "shape": json.dumps({key: getattr(cfg, key, None) for key in _MODEL_SHAPE})}
        save_file(tensors, str(path), metadata=metadata)
        return path

    # ------------------------------------------------------------------ vision components
    def image_positions(self) -> Bool[Tensor, "*batch pos"]:
        """Where the vision features entered the residual stream: ``hook_inputs_embeds != hook_embed``."""
        missing = [name for name in ("hook_embed", "hook_inputs_embeds") if name not in self.cache_dict]
        if missing:
            raise UserInputError(
                f"This cache lacks {missing}: decomposing a VLM's residual stream needs hook_embed and "
                "hook_inputs_embeds (where image features enter). Cache them, e.g. names_filter=None."
            )
        return (self["hook_inputs_embeds"] != self["hook_embed"]).any(-1)

    def embed_components(self, pos_slice=None) -> tuple[list[Tensor], list[str]]:
        """("embed", "image_embed"): token embeddings at text positions and image features, [*batch, pos, d_model]."""
        is_image = self.image_positions()[..., None]
        embed = self["hook_embed"].masked_fill(is_image, 0.0)
        image = self["hook_inputs_embeds"] - embed  # exactly the features at image positions, 0 elsewhere
        slicer = _as_slice(pos_slice)
        return [slicer.apply(embed, dim=-2), slicer.apply(image, dim=-2)], ["embed", "image_embed"]

    def deepstack_layers(self, layer: int) -> list[int]:
        """Layers before `layer` whose DeepStack features entered the stream in this run."""
        n_deep = getattr(self.model.cfg, "n_deepstack_layers", 0)
        if not n_deep or not bool(self.image_positions().any()):
            return []
        layers = list(range(min(n_deep, layer)))
        missing = [f"blocks.{i}.hook_deepstack" for i in layers if f"blocks.{i}.hook_deepstack" not in self.cache_dict]
        if missing:
            raise UserInputError(f"This cache lacks {missing}: DeepStack features are part of the residual stream "
                                 "at image positions; cache those hooks too.")
        return layers

    def deepstack_component(self, layer: int, pos_slice=None) -> Float[Tensor, "*batch pos d_model"]:
        """Layer `layer`'s DeepStack features placed at the image positions, [*batch, pos, d_model]."""
        features = self[f"blocks.{layer}.hook_deepstack"]
        mask = self.image_positions()
        if int(mask.sum()) != features.shape[0]:
            raise UserInputError(
                f"Cannot place blocks.{layer}.hook_deepstack: {features.shape[0]} features for {int(mask.sum())} "
                "image positions (was the cache made with pos_slice?). Cache the full sequence."
            )
        resid = self["hook_inputs_embeds"]
        out = torch.zeros_like(resid)
        out[mask] = features.to(out.dtype)
        return _as_slice(pos_slice).apply(out, dim=-2)

    # ------------------------------------------------------------------ TransformerLens overrides
    def decompose_resid(self, layer=None, mlp_input=False, mode="all", apply_ln=False, pos_slice=None,
                        incl_embeds=True, return_labels=False):
        """TransformerLens's `decompose_resid`, with "embed", "image_embed" and "{l}_deepstack" components.

        Order: embed, image_embed, then per layer l_attn_out, l_mlp_out, l_deepstack (DeepStack
        features are added after block l's MLP). The DeepStack terms count as embeddings
        (`incl_embeds`). The components add up to the residual entering `layer`.
        """
        n_layers = self.model.cfg.n_layers
        layer_index = n_layers if layer is None or layer == -1 else layer
        parts: list[Tensor] = []
        labels: list[str] = []
        if layer_index > 0 or (mlp_input and mode != "mlp"):  # TransformerLens cannot stack nothing
            components, labels = super().decompose_resid(layer=layer, mlp_input=mlp_input, mode=mode, apply_ln=False,
                                                         pos_slice=pos_slice, incl_embeds=False, return_labels=True)
            parts = list(components.unbind(0))
        if incl_embeds:
            embeds, embed_labels = self.embed_components(pos_slice)
            parts, labels = embeds + parts, embed_labels + labels
            for deep in self.deepstack_layers(layer_index):
                # after that layer's MLP output (or its attention output when `mode` left the MLP out)
                after = [i for i, name in enumerate(labels) if name in (f"{deep}_mlp_out", f"{deep}_attn_out")]
                at = (after[-1] + 1) if after else len(labels)
                parts.insert(at, self.deepstack_component(deep, pos_slice))
                labels.insert(at, f"{deep}_deepstack")
        if not parts:
            empty = _as_slice(pos_slice).apply(self["hook_embed"], dim=-2)
            stacked = empty.new_zeros(0, *empty.shape)
        else:
            stacked = torch.stack(parts)
        if apply_ln:
            stacked = self.apply_ln_to_stack(stacked, layer_index, pos_slice=pos_slice, mlp_input=mlp_input)
        return (stacked, labels) if return_labels else stacked

    def get_full_resid_decomposition(self, layer=None, mlp_input=False, expand_neurons=True, apply_ln=False,
                                     pos_slice=None, return_labels=False, project_output_onto=None):
        """TransformerLens's `get_full_resid_decomposition`, plus the vision inputs.

        Rows: every head's result, every neuron (or MLP layer), "embed" (text positions),
        "image_embed", one "{l}_deepstack" per DeepStack layer before `layer`, and "bias"
        (`model.accumulated_bias`). They add up to the residual entering `layer` at every
        position; with ``apply_ln=True`` (final layer) and ``project_output_onto=model.W_U``
        columns they add up to the logits minus ``b_U``.
        """
        n_layers = self.model.cfg.n_layers
        layer_index = n_layers if layer is None or layer == -1 else layer
        if expand_neurons and self.model.cfg.moe_layers:
            raise UserInputError("get_full_resid_decomposition(expand_neurons=True): mixture-of-experts layers have no "
                                 "one set of neurons (each token runs its own experts); pass expand_neurons=False for "
                                 "one row per MLP layer, and read experts from blocks.{l}.mlp.hook_expert_out")
        normed_bias = [i for i in range(layer_index) if self._post_norm(i, "ln1_post") is not None
                       and bool(self.model.blocks[i].attn.b_O.abs().sum() > 0)]
        if normed_bias:
            raise UserInputError(f"Blocks {normed_bias} normalize their attention output, which carries o_proj's bias: "
                                 "its share depends on the position, which the 'bias' component cannot hold; use "
                                 "decompose_resid or stack_head_results (the bias is the remainder there).")
        stack, labels = super().get_full_resid_decomposition(
            layer=layer, mlp_input=mlp_input, expand_neurons=expand_neurons, apply_ln=apply_ln, pos_slice=pos_slice,
            return_labels=True, project_output_onto=project_output_onto)
        embeds, embed_labels = self.embed_components(pos_slice)
        deep_layers = self.deepstack_layers(layer_index)
        extra = embeds + [self.deepstack_component(deep, pos_slice) for deep in deep_layers]
        extra_labels = embed_labels + [f"{deep}_deepstack" for deep in deep_layers]
        rows = torch.stack(extra)
        if apply_ln:
            rows = self.apply_ln_to_stack(rows, layer_index, pos_slice=pos_slice, mlp_input=mlp_input)
        if project_output_onto is not None:
            rows = rows @ project_output_onto.to(rows.dtype)
        at = labels.index("embed")
        stack = torch.cat([stack[:at], rows.to(stack.dtype), stack[at + 1:]], dim=0)
        labels = labels[:at] + extra_labels + labels[at + 1:]
        return (stack, labels) if return_labels else stack

    # ------------------------------------------------------------------ post-sublayer norms (Gemma 3)
    def _post_norm(self, layer: int, name: str):
        return getattr(self.model.blocks[layer], name, None)

    def stack_head_results(self, layer=-1, return_labels=False, incl_remainder=False, pos_slice=None,
                           apply_ln=False):
        """TransformerLens's `stack_head_results`. In a block that normalizes its attention output
        (``ln1_post``), a head's result is its share of `hook_attn_out`, ``w * (z_h @ W_O[h]) / s`` at the
        norm's cached scale ``s`` (`post_norm_shares`), so the heads still add up to what attention wrote.
        Labels follow each layer's own heads (a hybrid decoder's linear-attention layers: their value heads)."""
        n_layers = self.model.cfg.n_layers
        last = n_layers if layer is None or layer == -1 else layer
        normed = [i for i in range(last) if self._post_norm(i, "ln1_post") is not None]
        saved = {}
        for i in normed:
            key, scale_key = f"blocks.{i}.attn.hook_result", f"blocks.{i}.ln1_post.hook_scale"
            if scale_key not in self.cache_dict or f"blocks.{i}.attn.hook_z" not in self.cache_dict:
                raise UserInputError(f"This cache lacks blocks.{i}.attn.hook_z or {scale_key}: block {i} normalizes "
                                     "its attention output, so its heads' results need both; cache them.")
            saved[key] = self.cache_dict.get(key)
            z, W_O = self.cache_dict[f"blocks.{i}.attn.hook_z"], self.model.blocks[i].attn.W_O
            heads = torch.einsum("...hd,hdm->...hm", z, W_O.to(z.dtype))
            self.cache_dict[key] = post_norm_shares(heads, self._post_norm(i, "ln1_post"), self.cache_dict[scale_key])
        try:
            stack, labels = super().stack_head_results(layer=layer, return_labels=True, incl_remainder=incl_remainder,
                                                       pos_slice=pos_slice, apply_ln=apply_ln)
            cfg: Any = self.model.cfg  # a VLMConfig
            if not cfg.uniform_heads:  # a hybrid decoder's linear-attention layers have their own head counts
                labels = [f"L{x}H{h}" for x in range(last) for h in range(cfg.heads_at(x))] + \
                    (["remainder"] if incl_remainder else [])
            return (stack, labels) if return_labels else stack
        finally:
            for key, value in saved.items():  # the cache holds what the run wrote, as before
                if value is None:
                    self.cache_dict.pop(key, None)
                else:
                    self.cache_dict[key] = value

    def stack_neuron_results(self, layer, *args, **kwargs):
        """TransformerLens's `stack_neuron_results`; refused where a norm follows the MLP (``ln2_post``), whose
        output is not the sum of its neurons' writes."""
        last = self.model.cfg.n_layers if layer is None or layer == -1 else layer
        if any(self._post_norm(i, "ln2_post") is not None for i in range(last)):
            raise UserInputError("This model normalizes each MLP's output (ln2_post), so single neurons do not add "
                                 "up to what the MLP writes; decompose by MLP layer (expand_neurons=False, "
                                 "blocks.{l}.hook_mlp_out) instead.")
        return super().stack_neuron_results(layer, *args, **kwargs)

    def apply_slice_to_batch_dim(self, batch_slice) -> VLMActivationCache:
        """TransformerLens's batch slicing; features flattened over the batch's image tokens
        ([n_image_tokens, d_model]: DeepStack, ``vision.hook_image_embeds``) keep the chosen rows' tokens."""
        flat = {k: v for k, v in self.cache_dict.items() if k.endswith(_IMAGE_TOKEN_HOOKS)}
        if not flat or not self.has_batch_dim:
            sliced = super().apply_slice_to_batch_dim(batch_slice)
            return VLMActivationCache(sliced.cache_dict, self.model, has_batch_dim=sliced.has_batch_dim)
        counts = self.image_positions().sum(-1).tolist()  # image tokens per row
        rows = _as_slice(batch_slice).apply(torch.arange(len(counts))).reshape(-1).tolist()
        rest = ActivationCache({k: v for k, v in self.cache_dict.items() if k not in flat}, self.model)
        sliced = rest.apply_slice_to_batch_dim(batch_slice)
        for key, features in flat.items():
            per_row = features.split(counts)
            sliced.cache_dict[key] = torch.cat([per_row[r] for r in rows]) if rows else features[:0]
        return VLMActivationCache(sliced.cache_dict, self.model, has_batch_dim=sliced.has_batch_dim)


def load_cache(path: str | Path, model: Any = None, device: str | torch.device | None = None) -> VLMActivationCache:
    """The `VLMActivationCache` that `cache.save(path)` wrote, in the same order, with its batch-dimension flag.

    model: the HookedVLM the cache came from; the decompositions (`decompose_resid`, `stack_head_results`,
        `logit_attrs`, ...) need it, plain reading (`cache[name]`, `keys()`) does not.
    device: where to put the tensors (default: CPU).
    """
    path = Path(path)
    if not path.is_file() and path.with_name(path.name + ".safetensors").is_file():
        path = path.with_name(path.name + ".safetensors")
    if not path.is_file():
        raise UserInputError(f"{path} does not exist: pass the file cache.save(...) wrote.")
    try:
        with safe_open(str(path), framework="pt", device=str(device or "cpu")) as handle:
            metadata = handle.metadata() or {}
            if metadata.get("format") != CACHE_FORMAT:
                raise UserInputError(f"{path} is a safetensors file but not a saved activation cache (its metadata "
                                     f"names format {metadata.get('format')!r}); write one with cache.save(path).")
            names = json.loads(metadata["names"])
            if sorted(names) != sorted(handle.keys()):
                raise UserInputError(f"{path}: the tensors {sorted(handle.keys())} do not match the names its "
                                     "metadata lists; the file was changed after cache.save wrote it.")
            cache_dict = {name: handle.get_tensor(name) for name in names}
            has_batch_dim = json.loads(metadata["has_batch_dim"])
    except (SafetensorError, OSError) as error:
        raise UserInputError(f"{path} is not a readable safetensors file ({error}); write one with cache.save(path)."
                             ) from None
    except (KeyError, json.JSONDecodeError) as error:
        raise UserInputError(f"{path}: the cache metadata is damaged ({error}); write it again with cache.save.") from None
    cfg = getattr(model, "cfg", None)
    if cfg is not None:
        saved = json.loads(metadata.get("shape", "{}"))
        given = {key: getattr(cfg, key, None) for key in _MODEL_SHAPE}
        differ = {key: (saved[key], given[key]) for key in saved if saved[key] is not None and saved[key] != given[key]}
        if differ:
            raise UserInputError(f"{path} was cached from another model: " + ", ".join(
                f"{key} {was} there, {now} here" for key, (was, now) in differ.items()) +
                "; pass the model the cache came from (or none, to read the tensors alone).")
    return VLMActivationCache(cache_dict, model, has_batch_dim=bool(has_batch_dim))
