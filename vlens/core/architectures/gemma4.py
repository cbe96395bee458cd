"""Gemma 4 (`Gemma4ForConditionalGeneration`): Gemma 4 decoder, its patch-position vision encoder, pooled soft
tokens (HF 5.25's `modeling_gemma4.py`).

Decoder (`PerLayerInputBlock`, pieces in `gemma4_parts.py`):
- four sandwich norms per block, plain weights (``w * x``, not Gemma 3's ``1 + w``), all in fp32 as HF;
- attention with per-head q / k norms (HF's modules) and a scale-free value norm, logits unscaled
  (``scaling = 1``), "sliding_attention" layers with `head_dim` and the local rotary base, "full_attention"
  layers with `global_head_dim` (their own head size: `VLMConfig.layer_d_heads`) and proportional rotary
  (HF's own rotary module; the run carries each layer type's table), keys as values where
  `attention_k_eq_v` (then the full layers have `num_global_key_value_heads`: `VLMConfig.layer_kv_heads`);
- per-layer embeddings (PLE): a second embedding of the tokens, combined with a projection of the
  image-merged embeddings (HF's `project_per_layer_inputs`), feed a gated sublayer after the MLP
  (`blocks.{l}.hook_per_layer_input`, `blocks.{l}.hook_ple_out`); then each block's output is multiplied by
  its `layer_scalar`;
- the final norm's weight in fp32, lm_head tied to the scaled embeddings, logits soft-capped
  (``c * tanh(logits / c)``, `final_logit_softcapping`) as HF's forward does.

Masks: with ``use_bidirectional_attention="vision"`` each contiguous run of image tokens sees itself
bidirectionally in the sliding layers only (HF's `create_masks_for_vision_model`: the full layers stay
causal), within the window; otherwise causal everywhere.

Vision: HF's `Gemma4VisionModel` (patch embedder with a 2-D position table, encoder blocks with 2-D rotary
and sandwich norms, average pooling by patch position to kernel x kernel cells, padding stripped; forward
hooks give `vision.blocks.{i}.hook_resid_post` and per-head `vision.blocks.{i}.attn.hook_z`), then
`vision.hook_image_features` [n_image_tokens, width] (the pooled soft tokens) and HF's `embed_vision`
(scale-free RMSNorm, projection) -> `vision.hook_image_embeds` [n_image_tokens, d_model]. Each image keeps its
aspect ratio: its tokens are a (rows, cols) grid of pooled cells, row-major, between `<|image>` and `<image|>`
(`image_markers`).

Mixture of experts (`enable_moe_block`): HF's router and experts beside the dense MLP (`DenseAndExperts`,
`blocks.{l}.moe.hook_*`); the expert-level commands (routing, expert ablation / patching, which read
`MoEMLP`) do not cover them yet.

KV sharing (`num_kv_shared_layers`, Gemma 4 E2B / E4B): the last layers read the rotated keys and values that
the last earlier layer of their type made in the same pass (`Gemma4Attention.kv_source`); their hook_rot_k /
hook_v show what they read, they have no hook_k (edit the source layer's), and a run resumed after the source layer
(start_at_layer, a sweep resuming at a later layer) is refused with that reason rather than read stale keys.

Refused, with the reason: ``use_bidirectional_attention="all"`` (an embedding model's setting), audio and
video inputs.

Positions: 1-D, from the attention mask as HF's `generate` makes them (LLaVA's rule, inherited).
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor

from vlens.core.architectures.base import (
    ArchitectureAdapter,
    DecoderParts,
    HFModule,
    ImageFeatures,
    ImageTile,
    token_id_list,
)
from vlens.core.architectures.gemma3 import Gemma3Adapter
from vlens.core.architectures.gemma4_parts import (
    Fp32RMSNorm,
    Gemma4Attention,
    Gemma4Tables,
    PerLayerEmbed,
    PerLayerInputBlock,
    SoftcapUnembed,
)
from vlens.core.architectures.gemma4_processor import Gemma4ImageTextProcessor
from vlens.core.architectures.registry import register_adapter
from vlens.core.components import HookedVisionTower, TransformerBlock, ZeroCenteredRMSNormPre
from vlens.core.components.vision import attach_vision_head_hooks
from vlens.core.config import VLMConfig
from vlens.core.hooks import HookPoint
from vlens.utils.errors import UserInputError

logger = logging.getLogger(__name__)


@register_adapter
class Gemma4Adapter(Gemma3Adapter):
    """Gemma 3's bookkeeping (1-D positions from the mask, image blocks, prompt turns); Gemma 4's decoder,
    vision side, token layout and processor."""

    hf_class_names = ("Gemma4ForConditionalGeneration",)
    family = "gemma4"
    query_norm_head_axis = -2  # HF normalizes q as [batch, pos, heads, d_head]
    norm_weight_offset = 0.0

    def build_config(self, hf_model: HFModule) -> VLMConfig:
        config = hf_model.config
        text = config.get_text_config()
        # KV sharing: "store" layers keep their keys / values for the later "reuse" layers of their type
        self.kv_modes = list(text.kv_sharing_modes) if getattr(text, "num_kv_shared_layers", 0) else []
        if getattr(text, "use_bidirectional_attention", None) == "all":
            raise UserInputError("this Gemma 4 config sets use_bidirectional_attention='all' (an embedding "
                                 "model's setting); vlens converts the causal Gemma 4 decoder only")
        vision = config.vision_config
        if vision is None:
            raise UserInputError("this Gemma 4 config has no vision_config: vlens runs the image-text model")
        self.pooling_kernel = int(vision.pooling_kernel_size)
        self.bidirectional_images = getattr(text, "use_bidirectional_attention", None) == "vision"
        layers = self.language_model(hf_model).layers
        layer_types = list(text.layer_types)
        d_heads = [int(layer.self_attn.head_dim) for layer in layers]
        kv_heads = [text.num_attention_heads // int(layer.self_attn.num_key_value_groups) for layer in layers]
        # the sliding layers' shape is the config's head_dim / num_key_value_heads; other layers list theirs
        d_mlps = [int(layer.mlp.down_proj.in_features) for layer in layers]  # double-wide in KV-shared layers
        base = layer_types.index("sliding_attention") if "sliding_attention" in layer_types else 0
        d_head, n_kv = d_heads[base], kv_heads[base]
        generation = getattr(hf_model, "generation_config", None)
        eos = getattr(generation, "eos_token_id", None) if generation is not None else None
        eos = eos if eos is not None else text.eos_token_id
        bias = bool(getattr(text, "attention_bias", False))
        rope = text.rope_parameters or {}
        return VLMConfig(
            architecture=type(hf_model).__name__,
            n_layers=text.num_hidden_layers,
            d_model=text.hidden_size,
            n_heads=text.num_attention_heads,
            n_key_value_heads=n_kv,
            d_head=d_head,
            d_mlp=text.intermediate_size,
            d_vocab=text.vocab_size,
            act_fn=text.hidden_activation,
            eps=text.rms_norm_eps,
            rope_theta=float((rope.get("full_attention") or {}).get("rope_theta", 1_000_000.0)),
            rope_kind="1d",
            qk_norm=True,
            attn_scale=1.0,
            layer_types=layer_types,
            sliding_window=text.sliding_window,
            rope_layer_types=sorted(set(layer_types)),  # HF's rotary module orders them so
            layer_d_heads=d_heads if len(set(d_heads)) > 1 else [],
            layer_kv_heads=kv_heads if len(set(kv_heads)) > 1 else [],
            layer_d_mlps=d_mlps if len(set(d_mlps)) > 1 else [],
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
        text = hf_model.config.get_text_config()
        ple = lm if getattr(lm, "hidden_size_per_layer_input", 0) else None
        self.ple_dim = int(text.hidden_size_per_layer_input) if ple is not None else 0
        self.n_tables = len(cfg.rope_layer_types)
        width = max([cfg.d_head_at(layer) for layer in range(cfg.n_layers)] + [self.ple_dim])
        self.kv_producers: dict[str, Gemma4Attention] = {}
        blocks: list[TransformerBlock] = [self.build_block(cfg, layer, hf_layer) for layer, hf_layer in enumerate(lm.layers)]
        return DecoderParts(
            embed=PerLayerEmbed(lm.embed_tokens, ple, placeholder_ids=self.placeholder_ids(hf_model.config),
                                pad_id=int(text.pad_token_id or 0)),
            blocks=blocks,
            ln_final=ZeroCenteredRMSNormPre(lm.norm.variance_epsilon),  # fp32 x / scale; the unembedding applies w in fp32
            unembed=SoftcapUnembed(hf_model.lm_head, lm.norm, getattr(text, "final_logit_softcapping", None)),
            rotary=Gemma4Tables(lm.rotary_emb, cfg.rope_layer_types, width, ple),
        )

    @staticmethod
    def placeholder_ids(config) -> list[int]:
        """The image, video and audio placeholder ids: HF embeds each as the pad token (image ones are then
        overwritten by the image features; the others stay pad embeddings in an image-text run)."""
        ids = (getattr(config, name, None) for name in ("image_token_id", "video_token_id", "audio_token_id"))
        return [int(i) for i in ids if i is not None]

    def build_norm(self, cfg: VLMConfig, hf_norm: HFModule) -> Fp32RMSNorm:
        return Fp32RMSNorm(hf_norm.weight, cfg.eps, source=hf_norm)

    def build_attention(self, cfg: VLMConfig, layer: int, hf_layer: HFModule) -> Gemma4Attention:
        mode = self.kv_modes[layer] if self.kv_modes else None
        layer_type = cfg.layer_types[layer]
        source = self.kv_producers.get(layer_type) if mode == "reuse" else None
        if mode == "reuse" and source is None:
            raise RuntimeError(f"Gemma 4 layer {layer} reuses the keys of an earlier {layer_type} layer; none stores them")
        attn = Gemma4Attention(cfg, layer, hf_layer.self_attn, self.bidirectional_images, kv_source=source)
        if mode == "store":
            attn.shares_kv = True
            self.kv_producers[layer_type] = attn
        return attn

    def build_block(self, cfg: VLMConfig, layer: int, hf_layer: HFModule) -> PerLayerInputBlock:
        parts = dict(ln1=self.build_norm(cfg, hf_layer.input_layernorm),
                     attn=self.build_attention(cfg, layer, hf_layer),
                     ln1_post=self.build_norm(cfg, hf_layer.post_attention_layernorm),
                     ln2=self.build_norm(cfg, hf_layer.pre_feedforward_layernorm),
                     mlp=self.build_mlp(cfg, layer, hf_layer),
                     ln2_post=self.build_norm(cfg, hf_layer.post_feedforward_layernorm))
        has_ple = self.ple_dim > 0
        return PerLayerInputBlock(layer, parts, hf_layer, self.n_tables + layer if has_ple else None,
                                  self.build_norm(cfg, hf_layer.post_per_layer_input_norm) if has_ple else None)

    # ---- vision ----
    def build_vision(self, hf_model: HFModule) -> HookedVisionTower:
        tower = hf_model.model.vision_tower  # Gemma4VisionModel
        layers = list(tower.encoder.layers)
        vision = HookedVisionTower(tower, layers, projector=hf_model.model.embed_vision)
        vision.hook_image_features = HookPoint()  # pooled soft tokens [n_image_tokens, width]
        heads = hf_model.config.vision_config.num_attention_heads
        attach_vision_head_hooks(vision, [layer.self_attn.o_proj.linear for layer in layers], heads)
        return vision

    def check_inputs(self, cfg: VLMConfig, inputs) -> None:
        pixel_values = inputs.pixel_values
        if pixel_values is not None:
            positions = inputs.extra.get("image_position_ids")
            if pixel_values.ndim != 3 or positions is None or tuple(positions.shape) != (*pixel_values.shape[:2], 2):
                raise UserInputError(
                    "Gemma 4 expects pixel_values of shape [n_images, max_patches, 3 * patch_size ** 2] and "
                    "image_position_ids [n_images, max_patches, 2], got pixel_values "
                    f"{tuple(pixel_values.shape)} and image_position_ids "
                    f"{None if positions is None else tuple(positions.shape)}. Build inputs with "
                    "model.prepare(...) or the Gemma 4 processor.")
        for key in ("pixel_values_videos", "input_features"):
            if inputs.extra.get(key) is not None:
                raise UserInputError(f"Gemma 4 inputs with {key}: vlens runs Gemma 4 on images and text only")

    def encode_images(self, vision: HookedVisionTower, inputs) -> ImageFeatures:
        if vision.projector is None:
            raise RuntimeError("a Gemma 4 vision tower needs its embed_vision projector")
        positions = inputs.extra["image_position_ids"]
        # pooled, padding stripped, standardized where the config says: [n_image_tokens, width]
        hidden = vision.tower(pixel_values=inputs.pixel_values, pixel_position_ids=positions,
                              return_dict=True).last_hidden_state
        features = vision.get_submodule("hook_image_features")(hidden)
        return ImageFeatures(embeds=vision.hook_image_embeds(vision.projector(features)), deepstack=[])

    def image_grids(self, inputs) -> list[tuple[int, int]]:
        """(rows, cols) of each image's pooled cells, from its patch positions (x, y; -1 at padding)."""
        positions = inputs.extra["image_position_ids"].cpu()
        grids = []
        for image in positions:
            real = image[(image != -1).all(dim=-1)]
            cols, rows = (int(real[:, 0].max()) + 1, int(real[:, 1].max()) + 1) if len(real) else (0, 0)
            grids.append((rows // self.pooling_kernel, cols // self.pooling_kernel))
        return grids

    def image_token_counts(self, cfg: VLMConfig, inputs) -> tuple[list[int], list[tuple[int, int]]]:
        if inputs.pixel_values is None:
            return [], []
        grids = self.image_grids(inputs)
        return [rows * cols for rows, cols in grids], grids

    def image_markers(self, cfg: VLMConfig, inputs) -> list[list[ImageTile]] | None:
        """`<|image>` just before each image's soft tokens and `<image|>` just after (HF's processor)."""
        if inputs.pixel_values is None:
            return None
        counts, _ = self.image_token_counts(cfg, inputs)
        return [[ImageTile("start", torch.tensor([-1]), (1, 1), spatial=False),
                 ImageTile("end", torch.tensor([count]), (1, 1), spatial=False)] for count in counts]

    image_points_to_grid = ArchitectureAdapter.image_points_to_grid  # aspect-preserving resize, no crop
    mm_token_type_ids = ArchitectureAdapter.mm_token_type_ids  # HF's Gemma 4 reads them (1 at soft tokens)

    def image_views(self, processor, sizes: list[tuple[int, int]]) -> None:
        return None  # no pan-and-scan crops

    # ---- masks ----
    def attention_blocks(self, cfg: VLMConfig, inputs) -> Tensor | None:
        """Each contiguous run of image tokens is one block where the config makes images bidirectional
        (the full-attention layers drop the blocks again: `Gemma4Attention`), else None."""
        if not self.bidirectional_images or cfg.image_token_id is None:
            return None
        is_image = inputs.input_ids == cfg.image_token_id
        previous = torch.nn.functional.pad(is_image, (1, 0), value=False)[:, :-1]
        block = torch.cumsum((is_image & ~previous).int(), dim=1) - 1
        return torch.where(is_image, block, torch.full_like(block, -1))

    # ---- prompts ----
    def processor_images(self, rows: list[list]) -> list:
        return [image for row in rows for image in row]

    def load_processor(self, name_or_path: str, trust_remote_code: bool = False):
        try:
            return Gemma4ImageTextProcessor.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
        except (OSError, ValueError, TypeError, AttributeError) as error:
            logger.info("Gemma4ImageTextProcessor unavailable for %s: %s", name_or_path, error)
            return None

    def image_placeholder(self) -> str:
        return "<|image|>"

    def fallback_chat_prompt(self, question: str, n_images: int) -> str:
        return ("<bos><|turn>user\n" + self.image_placeholder() * n_images + question.strip()
                + "<turn|>\n<|turn>model\n")
