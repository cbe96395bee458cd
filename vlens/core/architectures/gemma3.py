"""Gemma 3 (`Gemma3ForConditionalGeneration`): Gemma 3 decoder, SigLIP tower, pooled projector.

Decoder (`SandwichBlock` of `ZeroCenteredRMSNorm`s around the core `Attention` and `GatedMLP`):
- four norms per block with Gemma's ``(1 + w)`` weights, all in fp32 as HF computes them:
  ln1 = input_layernorm, ln1_post = post_attention_layernorm, ln2 = pre_feedforward_layernorm,
  ln2_post = post_feedforward_layernorm; `hook_attn_out` / `hook_mlp_out` are the post-norm
  outputs (what is added to the residual), the final norm's ``1 + w`` is folded into `W_U`;
- per-head q/k norm (HF's own modules, after `hook_q`/`hook_k`, before rotary), queries scaled by
  ``query_pre_attn_scalar ** -0.5``;
- HF's `layer_types`: "sliding_attention" layers see their last `sliding_window` keys (themselves
  included) and read the local rotary base, "full_attention" layers every key and the global base;
  the run carries both rotary tables (`LayerTypeRotary`); in `generate` a sliding layer's KV cache
  keeps only its window, as HF's does;
- embeddings scaled by sqrt(d_model) in the weight dtype (HF's module; `W_E` is the scaled matrix),
  lm_head tied to them; GELU-tanh gated MLP.
- Soft-capping: HF 5.24's `Gemma3ForConditionalGeneration` applies neither `attn_logit_softcapping`
  (never passed to its attention functions) nor `final_logit_softcapping` (only its text-only
  `Gemma3ForCausalLM` does), so neither is applied here, whatever the config says.

Attention masks: HF's, from `token_type_ids` (1 at `<image_soft_token>`): causal OR "same image
block" (each contiguous run of image tokens sees itself bidirectionally), AND the window in sliding
layers, AND padding. Inputs without `token_type_ids` get them from the image token ids (what the
processor returns; HF itself would then attend causally over the images). Decoding steps are causal
(HF passes no token types after the prompt).

Vision: HF's SigLIP tower (forward hooks give `vision.blocks.{i}.hook_resid_post` and per-head
`vision.blocks.{i}.attn.hook_z`), then `vision.hook_image_features` [n_images, n_patches, width]
(the tower's post-LayerNorm'd output, the projector's input) and HF's projector (average pool to
`mm_tokens_per_image`, RMSNorm, projection) -> `vision.hook_image_embeds` [n_image_tokens, d_model].
Every image (and pan-and-scan crop) is resized to the tower's size and gives mm_tokens_per_image
tokens on a square grid.

Positions: 1-D, from the attention mask as HF's `generate` makes them (LLaVA's rule, inherited).
Prompt: ``<bos><start_of_turn>user\\n<start_of_image>{question}<end_of_turn>\\n<start_of_turn>model\\n``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from vlens.core.architectures.base import DecoderParts, HFModule, ImageFeatures, token_id_list
from vlens.core.architectures.llava import LlavaAdapter
from vlens.core.architectures.registry import register_adapter
from vlens.core.components import (
    HookedVisionTower,
    LayerTypeRotary,
    SandwichBlock,
    ScaledEmbed,
    TransformerBlock,
    Unembed,
    ZeroCenteredRMSNormPre,
)
from vlens.core.components.vision import attach_vision_head_hooks
from vlens.core.config import VLMConfig
from vlens.core.hooks import HookPoint
from vlens.utils.errors import UserInputError

PAN_AND_SCAN_FIELDS = ("do_pan_and_scan", "pan_and_scan_min_crop_size", "pan_and_scan_max_num_crops",
                       "pan_and_scan_min_ratio_to_activate")


def pan_and_scan_crops(width: int, height: int, settings: dict) -> list[tuple[int, int, int, int]]:
    """The pixel boxes of Gemma 3's pan-and-scan crops of a width x height image (HF's `pan_and_scan`,
    row-major; [] when the image is not elongated enough or the crops would be too small)."""
    min_crop, max_crops = int(settings["pan_and_scan_min_crop_size"]), int(settings["pan_and_scan_max_num_crops"])
    ratio = float(settings["pan_and_scan_min_ratio_to_activate"])
    wide = width >= height
    long_side, short_side = (width, height) if wide else (height, width)
    if long_side / short_side < ratio:
        return []
    n = min(max(2, min(int(math.floor(long_side / min_crop)), int(math.floor(long_side / short_side + 0.5)))),
            max_crops)
    n_w, n_h = (n, 1) if wide else (1, n)
    crop_w, crop_h = int(math.ceil(width / n_w)), int(math.ceil(height / n_h))
    if min(crop_w, crop_h) < min_crop:
        return []
    return [(x, y, min(x + crop_w, width), min(y + crop_h, height))
            for y in range(0, crop_h * n_h, crop_h) for x in range(0, crop_w * n_w, crop_w)]


@register_adapter
class Gemma3Adapter(LlavaAdapter):
    """Shares LLaVA's bookkeeping (1-D positions from the mask, one [C, H, W] tensor per image, the
    resize-only point mapping); its own decoder, vision side, masks and prompt format."""

    hf_class_names = ("Gemma3ForConditionalGeneration",)
    family = "gemma3"
    # HF's Gemma 3 attention normalizes q after moving heads forward: q_norm's output is
    # [batch, n_heads, pos, d_head] (read by head temperatures acting on an HF model)
    query_norm_head_axis = 1
    norm_weight_offset = 1.0  # Gemma's norms multiply by 1 + w (`ZeroCenteredRMSNorm`)

    def build_config(self, hf_model: HFModule) -> VLMConfig:
        config = hf_model.config
        text = config.text_config
        if getattr(text, "use_bidirectional_attention", False):
            raise UserInputError("this Gemma 3 config sets use_bidirectional_attention (an embedding model's "
                                 "setting); vlens converts the causal Gemma 3 decoder only")
        # placeholders per image (the processor's image_seq_length) and the grid HF's projector pools to
        # (patches per side // kernel, kernel = patches per side // int(sqrt(mm_tokens_per_image)))
        self.tokens_per_image = int(config.mm_tokens_per_image)
        self.image_size = int(config.vision_config.image_size)
        patches = self.image_size // int(config.vision_config.patch_size)
        kernel = max(patches // max(math.isqrt(self.tokens_per_image), 1), 1)
        self.image_grid = (patches // kernel, patches // kernel)
        layer_types = list(text.layer_types)
        rope = text.rope_parameters or {}
        generation = getattr(hf_model, "generation_config", None)
        eos = getattr(generation, "eos_token_id", None) if generation is not None else None
        eos = eos if eos is not None else text.eos_token_id
        bias = bool(getattr(text, "attention_bias", False))
        return VLMConfig(
            architecture=type(hf_model).__name__,
            n_layers=text.num_hidden_layers,
            d_model=text.hidden_size,
            n_heads=text.num_attention_heads,
            n_key_value_heads=text.num_key_value_heads,
            d_head=text.head_dim,
            d_mlp=text.intermediate_size,
            d_vocab=text.vocab_size,
            act_fn=text.hidden_activation,
            eps=text.rms_norm_eps,
            rope_theta=float((rope.get("full_attention") or {}).get("rope_theta", 1_000_000.0)),
            rope_kind="1d",
            qk_norm=True,
            attn_scale=float(text.query_pre_attn_scalar) ** -0.5,
            layer_types=layer_types,
            sliding_window=text.sliding_window,
            rope_layer_types=sorted(set(layer_types)),  # HF's rotary module orders them so
            attn_qkv_bias=bias,
            attn_out_bias=bias,
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", True)),
            image_token_id=config.image_token_id,
            pad_token_id=getattr(text, "pad_token_id", None),
            eos_token_ids=token_id_list(eos),
            spatial_merge_size=1,
            n_ctx=text.max_position_embeddings,
            model_name=getattr(config, "_name_or_path", "") or "",
            dtype=hf_model.lm_head.weight.dtype,
            device=str(hf_model.lm_head.weight.device),
            default_prepend_bos=True,
        )

    # ---- decoder ----
    def build_decoder(self, hf_model: HFModule, cfg: VLMConfig) -> DecoderParts:
        lm = self.language_model(hf_model)
        blocks = [self.build_block(cfg, layer, hf_layer) for layer, hf_layer in enumerate(lm.layers)]
        return DecoderParts(
            embed=ScaledEmbed(lm.embed_tokens, placeholder_id=cfg.image_token_id),
            blocks=blocks,
            # normalized in fp32; the unembedding applies 1 + w in fp32 and casts, as HF's final norm
            ln_final=ZeroCenteredRMSNormPre(lm.norm.eps),
            unembed=Unembed(hf_model.lm_head, lm.norm.weight, ln_final_source=lm.norm,
                            ln_final_offset=self.norm_weight_offset),
            rotary=LayerTypeRotary(lm.rotary_emb, cfg.rope_layer_types),
        )

    def build_block(self, cfg: VLMConfig, layer: int, hf_layer: HFModule) -> TransformerBlock:
        return SandwichBlock(
            layer,
            ln1=self.build_norm(cfg, hf_layer.input_layernorm),
            attn=self.build_attention(cfg, layer, hf_layer),  # HF's q_norm / k_norm, Gemma's scale and window
            ln1_post=self.build_norm(cfg, hf_layer.post_attention_layernorm),
            ln2=self.build_norm(cfg, hf_layer.pre_feedforward_layernorm),
            mlp=self.build_mlp(cfg, layer, hf_layer),
            ln2_post=self.build_norm(cfg, hf_layer.post_feedforward_layernorm),
        )

    # ---- vision ----
    def build_vision(self, hf_model: HFModule) -> HookedVisionTower:
        tower = hf_model.model.vision_tower  # SiglipVisionModel
        core = getattr(tower, "vision_model", tower)
        layers = list(core.encoder.layers)
        vision = HookedVisionTower(tower, layers, projector=hf_model.model.multi_modal_projector)
        vision.hook_image_features = HookPoint()  # projector input [n_images, n_patches, width]
        heads = hf_model.config.vision_config.num_attention_heads
        attach_vision_head_hooks(vision, [layer.self_attn.out_proj for layer in layers], heads)
        return vision

    def check_inputs(self, cfg: VLMConfig, inputs) -> None:
        pixel_values = inputs.pixel_values
        if pixel_values is not None:
            if pixel_values.ndim != 4:
                raise UserInputError(
                    f"Gemma 3 expects pixel_values of shape [n_images, channels, height, width], got "
                    f"{tuple(pixel_values.shape)}. Build inputs with model.prepare(...) or the Gemma 3 processor.")
            if tuple(pixel_values.shape[-2:]) != (self.image_size, self.image_size):
                raise UserInputError(
                    f"Gemma 3's vision tower takes {self.image_size}x{self.image_size} images, got "
                    f"{pixel_values.shape[-2]}x{pixel_values.shape[-1]}: build inputs with model.prepare(...) or the "
                    "Gemma 3 processor, which resizes every image to that size.")
        types = inputs.extra.get("token_type_ids")
        if types is None or tuple(types.shape) != tuple(inputs.input_ids.shape):
            # missing, or left over from before tokens were appended (teacher forcing): the processor's rule
            inputs.extra["token_type_ids"] = self.token_type_ids(cfg, inputs.input_ids)

    def token_type_ids(self, cfg: VLMConfig, input_ids: Tensor) -> Tensor:
        """[batch, pos] HF's token types: 1 at image tokens, 0 elsewhere (what `Gemma3Processor` returns)."""
        if cfg.image_token_id is None:
            return torch.zeros_like(input_ids)
        return (input_ids == cfg.image_token_id).long()

    def encode_images(self, vision: HookedVisionTower, inputs) -> ImageFeatures:
        if vision.projector is None:
            raise RuntimeError("a Gemma 3 vision tower needs its multi-modal projector")
        # the tower's post-LayerNorm'd last hidden state [n_images, n_patches, width] is the projector's input
        hidden = vision.tower(pixel_values=inputs.pixel_values, return_dict=True).last_hidden_state
        features = vision.get_submodule("hook_image_features")(hidden)  # the hook point build_vision added
        embeds = vision.projector(features)  # pooled: [n_images, tokens_per_image, d_model]
        return ImageFeatures(embeds=vision.hook_image_embeds(embeds.reshape(-1, embeds.shape[-1])), deepstack=[])

    def image_token_counts(self, cfg: VLMConfig, inputs) -> tuple[list[int], list[tuple[int, int]]]:
        """mm_tokens_per_image per image (each pan-and-scan crop is an image of its own), on a square grid."""
        if inputs.pixel_values is None:
            return [], []
        n_images = inputs.pixel_values.shape[0]
        return [self.tokens_per_image] * n_images, [self.image_grid] * n_images

    def image_views(self, processor, sizes: list[tuple[int, int]]) -> list[tuple[int, tuple[int, int, int, int]]] | None:
        """With pan-and-scan on, each image is followed by its crops (HF's `pan_and_scan`: 2 to max crops
        along the longer side, ceil(side / n) px each, the last one cut at the edge)."""
        image_processor = getattr(processor, "image_processor", processor)
        settings = {**{k: getattr(image_processor, k, None) for k in PAN_AND_SCAN_FIELDS},
                    **{k: v for k, v in (getattr(processor, "images_kwargs", None) or {}).items()
                       if k in PAN_AND_SCAN_FIELDS and v is not None}}
        if not settings.get("do_pan_and_scan"):
            return None
        views = []
        for index, (width, height) in enumerate(sizes):
            views.append((index, (0, 0, width, height)))
            views += [(index, crop) for crop in pan_and_scan_crops(width, height, settings)]
        return views

    # ---- masks ----
    def attention_blocks(self, cfg: VLMConfig, inputs) -> Tensor | None:
        """HF's `get_block_sequence_ids_for_mask`: each contiguous run of image tokens is one block
        (numbered per row from 0), every other token -1."""
        types = inputs.extra.get("token_type_ids")
        if types is None:
            types = self.token_type_ids(cfg, inputs.input_ids)
        is_image = types.to(inputs.input_ids.device) == 1
        previous = torch.nn.functional.pad(is_image, (1, 0), value=False)[:, :-1]
        starts = is_image & ~previous
        block = torch.cumsum(starts.int(), dim=1) - 1
        return torch.where(is_image, block, torch.full_like(block, -1))

    # ---- prompts ----
    def processor_images(self, rows: list[list]) -> list:
        """One list of images per prompt: Gemma 3's processor checks each prompt's image count."""
        return [list(row) for row in rows]

    def image_placeholder(self) -> str:
        return "<start_of_image>"

    def fallback_chat_prompt(self, question: str, n_images: int) -> str:
        return ("<bos><start_of_turn>user\n" + self.image_placeholder() * n_images + question.strip()
                + "<end_of_turn>\n<start_of_turn>model\n")
