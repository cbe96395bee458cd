"""LLaVA-1.5 (`LlavaForConditionalGeneration`): Llama text decoder, CLIP vision tower, MLP projector.

- Decoder: the Llama layer layout is the core's (`ArchitectureAdapter.build_block`); 1-D RoPE
  from HF's rotary module (any rope scaling included). Mistral and Qwen2 text models have the
  same layout; the q/k/v and o biases are read from the modules (Qwen2: q/k/v only). A sliding
  attention window (Mistral; Qwen2 with `use_sliding_window`) is the core's: `cfg.layer_types`
  marks the sliding layers and `cfg.sliding_window` their window, in prefill masks and the KV cache.
- Vision: CLIP's (or SigLIP's, no CLS and no pre-LayerNorm) hidden states are computed block by
  block (embeddings -> pre-LayerNorm -> encoder layers, all of them as HF does), so an edit on
  `vision.blocks.{i}.hook_resid_post`
  always reaches the selected features (HF's own hidden-state capture may record a block's output
  before such an edit, depending on hook registration order). Then, as HF does:
  select the layer(s) (`vision_feature_layer`: int or list, concatenated on the feature axis),
  drop CLS for `vision_feature_select_strategy="default"` (keep it for "full"), project.
- Hooks: `vision.blocks.{i}.hook_resid_post` [n_images, 1 + n_patches, width],
  `vision.blocks.{i}.attn.hook_z` [n_images, 1 + n_patches, n_heads, d_head],
  `vision.hook_image_features` [n_images, n_tokens, width * n_selected_layers] (projector input),
  `vision.hook_image_embeds` [n_image_tokens, d_model] (projector output, images concatenated).
- Positions: [batch, pos] from the attention mask (cumsum - 1, 0 at padding), exactly what HF
  `generate` uses; HF's plain forward uses arange, which differs only by a per-row offset that
  1-D RoPE cancels (equal logits up to float rounding).
- Prompt: `USER: <image>\n{question} ASSISTANT:`; the processor expands each `<image>` to the
  image's token count (n_patches, +1 with "full").
"""

from __future__ import annotations

import torch
from torch import Tensor

from vlens.core.architectures.base import ArchitectureAdapter, HFModule, ImageFeatures, token_id_list
from vlens.core.architectures.registry import register_adapter
from vlens.core.components import HookedVisionTower
from vlens.core.components.vision import attach_vision_head_hooks
from vlens.core.config import VLMConfig
from vlens.core.hooks import HookPoint
from vlens.utils.errors import UserInputError


@register_adapter
class LlavaAdapter(ArchitectureAdapter):
    hf_class_names = ("LlavaForConditionalGeneration",)
    family = "llava"

    def build_config(self, hf_model: HFModule) -> VLMConfig:
        config = hf_model.config
        # read again by the vision side and the placeholder counts
        self.feature_layer = config.vision_feature_layer
        self.select_strategy = config.vision_feature_select_strategy
        self.patch_size = config.vision_config.patch_size
        self.tower_has_cls = hasattr(tower_core(hf_model.model.vision_tower).embeddings, "class_embedding")
        return self.decoder_config(hf_model)

    def decoder_config(self, hf_model: HFModule) -> VLMConfig:
        """The `VLMConfig` of a LLaVA-style model's Llama / Mistral / Qwen2 text decoder (`text_config`),
        its image token `config.image_token_id`; shared by the families that put such a decoder after
        their own vision side (InternVL, Idefics3)."""
        config = hf_model.config
        text = config.text_config
        layer_types, window = sliding_layers(text)
        rope = getattr(text, "rope_parameters", None) or {}
        generation = getattr(hf_model, "generation_config", None)
        eos = getattr(generation, "eos_token_id", None) if generation is not None else None
        eos = eos if eos is not None else text.eos_token_id
        pad = getattr(text, "pad_token_id", None)
        # read from the modules: Llama / Mistral set attention_bias, Qwen2 always has q/k/v bias and none on o
        attn: HFModule = self.decoder_layers(hf_model)[0].self_attn
        return VLMConfig(
            architecture=type(hf_model).__name__,
            n_layers=text.num_hidden_layers,
            d_model=text.hidden_size,
            n_heads=text.num_attention_heads,
            n_key_value_heads=text.num_key_value_heads or text.num_attention_heads,
            d_head=getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads,
            d_mlp=text.intermediate_size,
            d_vocab=text.vocab_size,
            act_fn=text.hidden_act,
            eps=text.rms_norm_eps,
            rope_theta=float(rope.get("rope_theta", 10000.0)),
            rope_kind="1d",
            layer_types=layer_types,
            sliding_window=window,
            qk_norm=getattr(attn, "q_norm", None) is not None,  # a Qwen3 text model (InternVL3.5)
            attn_qkv_bias=attn.q_proj.bias is not None,
            attn_out_bias=attn.o_proj.bias is not None,
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            image_token_id=config.image_token_id,
            pad_token_id=pad if pad is not None else getattr(config, "pad_token_id", None),
            eos_token_ids=token_id_list(eos),
            spatial_merge_size=1,
            n_ctx=text.max_position_embeddings,
            model_name=getattr(config, "_name_or_path", "") or "",
            dtype=hf_model.lm_head.weight.dtype,
            device=str(hf_model.lm_head.weight.device),
        )

    # ---- vision ----
    def build_vision(self, hf_model: HFModule) -> HookedVisionTower:
        tower = hf_model.model.vision_tower
        layers = list(tower_core(tower).encoder.layers)
        vision = HookedVisionTower(tower, layers, projector=hf_model.model.multi_modal_projector)
        vision.hook_image_features = HookPoint()  # projector input
        heads = hf_model.config.vision_config.num_attention_heads
        attach_vision_head_hooks(vision, [layer.self_attn.out_proj for layer in layers], heads)
        return vision

    def check_inputs(self, cfg: VLMConfig, inputs) -> None:
        if inputs.pixel_values is not None and inputs.pixel_values.ndim != 4:
            raise UserInputError(
                f"LLaVA expects pixel_values of shape [n_images, channels, height, width], got "
                f"{tuple(inputs.pixel_values.shape)}. Build inputs with model.prepare(...) or the LLaVA processor."
            )
        self.check_text_inputs(inputs)

    def check_text_inputs(self, inputs) -> None:
        """The checks every LLaVA-style family shares: the feature select strategy."""
        strategy = inputs.extra.get("vision_feature_select_strategy") or self.select_strategy
        if strategy not in ("default", "full"):
            raise UserInputError(f"vision_feature_select_strategy must be 'default' or 'full', got {strategy!r}.")

    def _selection(self, inputs) -> tuple[int | list[int], str]:
        layer = inputs.extra.get("vision_feature_layer")
        strategy = inputs.extra.get("vision_feature_select_strategy")
        return (self.feature_layer if layer is None else layer), (strategy or self.select_strategy)

    def encode_images(self, vision: HookedVisionTower, inputs) -> ImageFeatures:
        embeds = self.project_images(vision, inputs, inputs.pixel_values)  # [n_images, n_tokens, d_model]
        embeds = vision.hook_image_embeds(embeds.reshape(-1, embeds.shape[-1]))
        return ImageFeatures(embeds=embeds, deepstack=[])

    def project_images(self, vision: HookedVisionTower, inputs, pixel_values: Tensor) -> Tensor:
        """[n, n_tokens, d_model]: the vision tower on `pixel_values` [n, C, H, W] block by block, the
        selected layer(s) and strategy, the projector (its input at `vision.hook_image_features`)."""
        return self.project(vision, self.select_features(vision, inputs, pixel_values), "hook_image_features")

    def select_features(self, vision: HookedVisionTower, inputs, pixel_values: Tensor) -> Tensor:
        """[n, n_tokens, width * n_selected_layers]: the tower's selected layer(s), CLS dropped for "default"."""
        feature_layer, strategy = self._selection(inputs)
        layers = [feature_layer] if isinstance(feature_layer, int) else list(feature_layer)
        hidden_states = _tower_hidden_states(vision.tower, pixel_values, layers)
        selected = [hidden_states[i] for i in layers]
        if strategy == "default":
            selected = [h[:, 1:] for h in selected]  # drop CLS
        return torch.cat(selected, dim=-1)

    def project(self, vision: HookedVisionTower, features: Tensor, hook: str) -> Tensor:
        """The projector on `features`, its input passed through the vision hook point `hook`."""
        if vision.projector is None:
            raise RuntimeError("a LLaVA vision tower needs its multi-modal projector")
        # the hook point build_vision added (nn.Module attributes are untyped to checkers)
        return vision.projector(vision.get_submodule(hook)(features))

    def image_token_counts(self, cfg: VLMConfig, inputs) -> tuple[list[int], list[tuple[int, int]]]:
        """n_patches per image (+1 for CLIP's CLS with "full"; "default" drops the first token); grid
        (rows, cols) of patches."""
        if inputs.pixel_values is None:
            return [], []
        _, strategy = self._selection(inputs)
        n_images, _, height, width = inputs.pixel_values.shape
        rows, cols = height // self.patch_size, width // self.patch_size
        count = rows * cols + int(self.tower_has_cls) - (1 if strategy == "default" else 0)
        return [count] * n_images, [(rows, cols)] * n_images

    def image_points_to_grid(
        self, processor, points: Tensor, image_size: tuple[int, int], grid: tuple[int, int]
    ) -> tuple[Tensor, Tensor]:
        """Through CLIP's preprocessing, as the processor runs it: optional pad to square
        (LlavaImageProcessor's do_pad, centred), resize (shortest edge, aspect kept, HF's int
        rounding; or a fixed height x width), then centre crop. Points the crop removes are
        not visible (they get no prior mass)."""
        image_processor = getattr(processor, "image_processor", processor)
        width, height = float(image_size[0]), float(image_size[1])
        x, y = points[:, 0].clone(), points[:, 1].clone()
        if getattr(image_processor, "do_pad", False):
            side = max(width, height)
            x, y = x + (side - width) // 2, y + (side - height) // 2
            width = height = side
        size = getattr(image_processor, "size", None)
        if getattr(image_processor, "do_resize", True) and size is not None:
            new_height, new_width = _clip_resized(size, height, width)
            x, y = x * new_width / width, y * new_height / height
            width, height = float(new_width), float(new_height)
        crop = getattr(image_processor, "crop_size", None)
        if getattr(image_processor, "do_center_crop", False) and crop is not None:
            crop_height, crop_width = float(_size_value(crop, "height")), float(_size_value(crop, "width"))
            x, y = x - _crop_start(width, crop_width), y - _crop_start(height, crop_height)
            width, height = crop_width, crop_height
        visible = (x >= 0) & (x <= width) & (y >= 0) & (y <= height)
        rows, cols = grid
        return torch.stack([y * rows / height - 0.5, x * cols / width - 0.5], dim=-1), visible

    # ---- positions ----
    def mm_token_type_ids(self, cfg: VLMConfig, input_ids: Tensor) -> Tensor | None:
        return None  # LLaVA's positions are 1-D; HF LLaVA takes no token types

    def position_ids(self, hf_model: HFModule, inputs) -> tuple[Tensor, None]:
        return _positions_from_mask(inputs.attention_mask), None

    def decode_position_ids(self, attention_mask: Tensor, n_new: int, deltas: Tensor | None = None) -> Tensor:
        return _positions_from_mask(attention_mask)[:, -n_new:]

    # ---- prompts ----
    def image_placeholder(self) -> str:
        return "<image>"

    def fallback_chat_prompt(self, question: str, n_images: int) -> str:
        return "USER: " + (self.image_placeholder() + "\n") * n_images + question + " ASSISTANT:"


def _positions_from_mask(attention_mask: Tensor) -> Tensor:
    """[batch, pos]: each real token's index among the row's real tokens; 0 at padding (HF generate's rule)."""
    positions = attention_mask.long().cumsum(-1) - 1
    return positions.masked_fill(attention_mask == 0, 0)


def sliding_layers(text_config) -> tuple[list[str], int | None]:
    """(HF layer types, sliding window) of a text model that slides: Mistral slides every layer
    while `sliding_window` is set; Qwen2 (`use_sliding_window`) the layers its `layer_types`
    mark. ([], None) for one that does not (Llama)."""
    window = getattr(text_config, "sliding_window", None)
    if not window:
        return [], None
    layer_types = getattr(text_config, "layer_types", None)
    if layer_types is None:
        return ["sliding_attention"] * text_config.num_hidden_layers, int(window)
    if "sliding_attention" not in layer_types:
        return [], None
    return list(layer_types), int(window)


def tower_core(tower: HFModule) -> HFModule:
    """The module holding embeddings / encoder (CLIP: also pre_layrnorm; SigLIP: none), the tower
    itself (CLIPVisionModel, SiglipVisionModel) or its inner vision_model."""
    for module in (tower, getattr(tower, "vision_model", None)):
        if module is not None and all(hasattr(module, a) for a in ("embeddings", "encoder")) \
                and hasattr(module.encoder, "layers"):
            return module
    raise UserInputError(
        f"vlens supports LLaVA-style models with a CLIP or SigLIP vision tower; got {type(tower).__name__}. Other "
        "towers need their own adapter (see CONTRIBUTING.md, 'Adding an architecture')."
    )


def _tower_hidden_states(tower: HFModule, pixel_values: Tensor, layers: list[int]) -> dict[int, Tensor]:
    """HF's `hidden_states` tuple entries for the requested indices (negative allowed).

    Index 0 is the embeddings (CLIP: after its pre-LayerNorm), index i the output of encoder layer
    i - 1 (before SigLIP's post-LayerNorm, as in HF). Every layer runs, as in HF, so every vision
    hook fires (later layers do not change the features).
    """
    core = tower_core(tower)
    hidden = core.embeddings(pixel_values.to(core.embeddings.patch_embedding.weight.dtype))
    pre_norm = getattr(core, "pre_layrnorm", None)
    if pre_norm is not None:
        hidden = pre_norm(hidden)
    states = [hidden]
    for layer in core.encoder.layers:
        hidden = layer(hidden, None)
        states.append(hidden)
    return {i: states[i] for i in layers}


def _size_value(size, key: str):
    return size.get(key) if isinstance(size, dict) else getattr(size, key, None)


def _clip_resized(size, height: float, width: float) -> tuple[int, int]:
    """(height, width) after CLIP's resize: shortest edge to ``shortest_edge`` with the long edge
    ``int(shortest_edge * long / short)`` (HF's get_resize_output_image_size), or a fixed size."""
    shortest = _size_value(size, "shortest_edge")
    if shortest:
        short, long = min(height, width), max(height, width)
        new_long = int(shortest * long / short)
        return (new_long, shortest) if width <= height else (shortest, new_long)
    fixed_height, fixed_width = _size_value(size, "height"), _size_value(size, "width")
    if fixed_height and fixed_width:
        return int(fixed_height), int(fixed_width)
    raise UserInputError(f"cannot map points through the image processor's size {size}")


def _crop_start(length: float, crop: float) -> float:
    """Where HF's centre crop starts along one axis (negative: the image is padded first)."""
    if length >= crop:
        return float((int(length) - int(crop)) // 2)
    return -float(-(-(int(crop) - int(length)) // 2))  # ceil((crop - length) / 2) of padding
