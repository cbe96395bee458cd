"""Aya Vision (`AyaVisionForConditionalGeneration`): SigLIP, pixel shuffle + SwiGLU projector, dynamic tiles
with a thumbnail; a Cohere2 (Command R7B / A) text decoder.

- Decoder (`ParallelBlock`): one bias-free LayerNorm (HF's `Cohere2LayerNorm`: mean removed, fp32) feeds
  attention and MLP in parallel, ``resid + attn + mlp``; `hook_resid_mid` is ``resid_pre + attn_out``, and
  the MLP reads ``ln1(resid_pre)`` (methods that rebuild it from ``ln2(resid_mid)`` refuse the family).
  HF's `layer_types`: "sliding_attention" layers see their last `sliding_window` keys and rotate q / k
  with RoPE on adjacent pairs (2i, 2i + 1: `rope_adjacent_pairs`), "full_attention" layers see every key
  and use no position encoding at all (`nope_layers`); in `generate` a sliding layer's KV cache keeps only
  its window, as HF's does. The final LayerNorm's weight is folded into `W_U` with HF's `logit_scale`
  (logits = lm_head(w * norm(x)) * logit_scale); embeddings tied to lm_head.
- Tiles (HF's `GotOcr2ImageProcessor` with `crop_to_patches`, InternVL's rule): each image is resized,
  aspect NOT kept, to the (rows x cols) tile layout whose aspect ratio is closest to the image's, cut into
  rows * cols square tiles, and followed by a thumbnail (the whole image squashed) when it has more than one
  tile. pixel_values [n_tiles, C, T, T] holds every image's tiles in order.
- Vision (block by block, LLaVA's `project_images`): SigLIP's hidden state `vision_feature_layer` (all
  patches: the "full" strategy; SigLIP has no CLS), HF's projector: pixel shuffle (f x f patches -> one
  token), LayerNorm, linear, SwiGLU, linear.
- Placeholders (HF's `AyaVisionProcessor`): ``<|START_OF_IMG|>`` then, per tile k, the text ``TILE_{k}`` and
  L ``<|IMG_PATCH|>`` tokens, then ``TILE_GLOBAL`` and the thumbnail's L tokens, then ``<|END_OF_IMG|>``
  (a one-tile image has only the global part). L = (T / (patch * f))^2.
- Regions: InternVL's records (`internvl_tiles`): one "image" record for a one-tile image, else a "tile"
  per tile (row-major over the layout; `layout`, `layout_grid` and pixel `box` from the original size that
  `AyaVisionImageTextProcessor` returns as ``image_sizes``) and the "base" thumbnail, last. `markers`:
  "start" / "end" and the tag tokens before each tile ("tile_tag") and before the thumbnail ("global_tag").
- Hooks: `vision.blocks.{i}.hook_resid_post` [n_tiles, (T/p)^2, width], `vision.blocks.{i}.attn.hook_z`,
  `vision.hook_image_features` [n_tiles, (T/p)^2, width] (projector input, before the pixel shuffle),
  `vision.hook_tile_embeds` [n_tiles, L, d_model] (projector output), `vision.hook_image_embeds`
  [n_image_tokens, d_model].
- Prompt (Aya Vision's chat template, the tokenizer adds ``<BOS_TOKEN>``): ``<|START_OF_TURN_TOKEN|><|USER_TOKEN|><image>{question}
  <|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>``.
"""

from __future__ import annotations

import logging

import torch
from transformers import AyaVisionProcessor

from vlens.core.architectures.base import (
    DecoderParts,
    HFModule,
    ImageFeatures,
    ImageTile,
    placeholder_runs,
    token_id_list,
)
from vlens.core.architectures.internvl import InternVLAdapter, flat_images, image_hw
from vlens.core.architectures.llava import LlavaAdapter
from vlens.core.architectures.registry import register_adapter
from vlens.core.components import Attention, Embed, GatedMLP, HookedVisionTower, RotaryEmbedding, Unembed
from vlens.core.components.layer_norm import LayerNorm, LayerNormPre
from vlens.core.components.parallel_block import ParallelBlock
from vlens.core.components.vision import attach_vision_head_hooks
from vlens.core.config import VLMConfig
from vlens.core.hooks import HookPoint
from vlens.utils.errors import UserInputError

logger = logging.getLogger(__name__)


class AyaVisionImageTextProcessor(AyaVisionProcessor):
    """HF's `AyaVisionProcessor` that also returns each image's original ``image_sizes`` [n_images, 2] (height,
    width), which the tile regions need (Aya Vision's HF forward ignores it). Built like HF's."""

    def __call__(self, images=None, text=None, **kwargs):
        out = super().__call__(images=images, text=text, **kwargs)
        if images is not None:
            sizes = [list(image_hw(image)) for image in flat_images(images)]
            out["image_sizes"] = torch.tensor(sizes, dtype=torch.long) if kwargs.get("return_tensors") == "pt" else sizes
        return out


@register_adapter
class AyaVisionAdapter(InternVLAdapter):
    """InternVL's tile bookkeeping (GotOcr2 tiles + thumbnail, `image_sizes`), LLaVA's SigLIP features; its own
    Cohere2 decoder, tile grouping (tiles are separated by tag text) and markers."""

    hf_class_names = ("AyaVisionForConditionalGeneration",)
    family = "aya_vision"

    def build_config(self, hf_model: HFModule) -> VLMConfig:
        config = hf_model.config
        text = config.text_config
        if text.model_type != "cohere2":
            raise UserInputError(f"this Aya Vision checkpoint's text model is {text.model_type!r}; vlens runs Aya "
                                 "Vision with its Cohere2 decoder only (Aya Vision 8B / 32B)")
        self.feature_layer = config.vision_feature_layer
        self.select_strategy = config.vision_feature_select_strategy
        self.patch_size = int(config.vision_config.patch_size)
        self.downsample_factor = int(config.downsample_factor)
        self.downsample_ratio = 1.0 / self.downsample_factor  # read by InternVL's `tile_side`
        self.tower_has_cls = False
        self.start_id: int | None = None
        self.end_id: int | None = None
        layer_types = list(text.layer_types)
        rope = getattr(text, "rope_parameters", None) or {}
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
            d_head=text.hidden_size // text.num_attention_heads,  # Cohere2 ignores any head_dim
            d_mlp=text.intermediate_size,
            d_vocab=text.vocab_size,
            act_fn=text.hidden_act,
            eps=text.layer_norm_eps,
            rope_theta=float(rope.get("rope_theta", 10000.0)),
            rope_kind="1d",
            rope_adjacent_pairs=True,  # HF's Cohere rotary interleaves: pairs (2i, 2i + 1)
            layer_types=layer_types,
            sliding_window=text.sliding_window,
            nope_layers=[i for i, kind in enumerate(layer_types) if kind != "sliding_attention"],
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
            normalization_type="LN",
            parallel_attn_mlp=True,
            default_prepend_bos=True,
        )

    # ---- decoder ----
    def build_decoder(self, hf_model: HFModule, cfg: VLMConfig) -> DecoderParts:
        lm = self.language_model(hf_model)
        return DecoderParts(
            embed=Embed(lm.embed_tokens),
            blocks=[self.build_block(cfg, layer, hf_layer) for layer, hf_layer in enumerate(lm.layers)],
            ln_final=LayerNormPre(lm.norm.variance_epsilon),  # fp32 out: Unembed applies w in fp32, then casts
            unembed=Unembed(hf_model.lm_head, lm.norm.weight, ln_final_source=lm.norm,
                            logit_scale=float(hf_model.config.text_config.logit_scale)),
            rotary=RotaryEmbedding(lm.rotary_emb, cfg.rope_kind),
        )

    def build_block(self, cfg: VLMConfig, layer: int, hf_layer: HFModule) -> ParallelBlock:
        norm = hf_layer.input_layernorm
        sa, mlp = hf_layer.self_attn, hf_layer.mlp
        return ParallelBlock(
            layer,
            ln1=LayerNorm(norm.weight, norm.variance_epsilon, source=norm),
            attn=Attention(cfg, layer, sa.q_proj, sa.k_proj, sa.v_proj, sa.o_proj),
            mlp=GatedMLP(mlp.gate_proj, mlp.up_proj, mlp.down_proj, cfg.act_fn),
        )

    def bind_processor(self, processor) -> None:
        tokenizer = getattr(processor, "tokenizer", processor)
        self.start_id = self.end_id = None
        if tokenizer is None or not hasattr(tokenizer, "convert_tokens_to_ids"):
            return
        unknown = getattr(tokenizer, "unk_token_id", None)
        for name, default in (("start_of_img_token", "<|START_OF_IMG|>"), ("end_of_img_token", "<|END_OF_IMG|>")):
            value = tokenizer.convert_tokens_to_ids(getattr(processor, name, default))
            value = None if value is None or value == unknown else int(value)
            setattr(self, "start_id" if name.startswith("start") else "end_id", value)

    # ---- vision ----
    def build_vision(self, hf_model: HFModule) -> HookedVisionTower:
        tower = hf_model.model.vision_tower  # SiglipVisionModel
        core = getattr(tower, "vision_model", tower)
        layers = list(core.encoder.layers)
        vision = HookedVisionTower(tower, layers, projector=hf_model.model.multi_modal_projector)
        vision.hook_image_features = HookPoint()  # [n_tiles, (T/p)^2, width]: projector input
        vision.hook_tile_embeds = HookPoint()  # [n_tiles, L, d_model]: projector output
        heads = hf_model.config.vision_config.num_attention_heads
        attach_vision_head_hooks(vision, [layer.self_attn.out_proj for layer in layers], heads)
        return vision

    def check_inputs(self, cfg: VLMConfig, inputs) -> None:
        strategy = inputs.extra.get("vision_feature_select_strategy") or self.select_strategy
        if strategy != "full":
            raise UserInputError(f"Aya Vision's SigLIP tower has no CLS token: vision_feature_select_strategy "
                                 f"'default' would drop a patch and leave a grid the pixel shuffle cannot fold; got "
                                 f"{strategy!r}, use 'full'")
        pixel_values = inputs.pixel_values
        if pixel_values is None:
            return
        if pixel_values.ndim != 4:
            raise UserInputError(f"Aya Vision expects pixel_values [n_tiles, channels, height, width] (every image's "
                                 f"tiles concatenated), got {tuple(pixel_values.shape)}. Build inputs with "
                                 "model.prepare(...) or the Aya Vision processor.")
        height, width = pixel_values.shape[-2:]
        step = self.patch_size * self.downsample_factor
        if height != width or height % step:
            raise UserInputError(f"Aya Vision tiles must be square and a multiple of patch size x downsample factor "
                                 f"({step} px), got {height}x{width}: the processor's size sets them")

    def encode_images(self, vision: HookedVisionTower, inputs) -> ImageFeatures:
        per_tile = self.project_images(vision, inputs, inputs.pixel_values)  # [n_tiles, g, g, d_model]
        per_tile = vision.get_submodule("hook_tile_embeds")(per_tile.reshape(per_tile.shape[0], -1, per_tile.shape[-1]))
        return ImageFeatures(embeds=vision.hook_image_embeds(per_tile.reshape(-1, per_tile.shape[-1])), deepstack=[])

    project_images = LlavaAdapter.project_images

    # ---- tiles and regions ----
    def tile_groups(self, cfg: VLMConfig, inputs) -> list[list[tuple[int, int, int]]]:
        """Every image of the batch in order, as its runs of placeholders (row, start, end): its tiles, then the
        thumbnail. An image spans ``<|START_OF_IMG|>`` ... ``<|END_OF_IMG|>`` (known through the processor's
        tokenizer); without one, an image ends at the run after the tag every prompt's last image ends with."""
        if cfg.image_token_id is None or inputs.pixel_values is None:
            return []
        ids = inputs.input_ids.cpu()
        runs = placeholder_runs(ids, inputs.attention_mask.cpu(), cfg.image_token_id)
        global_tag = None
        if self.end_id is None and runs:
            last = runs[-1]
            global_tag = int(ids[last[0], last[1] - 1]) if last[1] > 0 else None
        groups: list[list[tuple[int, int, int]]] = []
        current: list[tuple[int, int, int]] = []
        for row, start, end in runs:
            if current and current[-1][0] != row:
                groups.append(current)
                current = []
            current.append((row, start, end))
            closes = (int(ids[row, end]) == self.end_id if end < ids.shape[1] else False) if self.end_id is not None \
                else (start > 0 and int(ids[row, start - 1]) == global_tag)
            if closes:
                groups.append(current)
                current = []
        if current:
            groups.append(current)
        return groups

    def tiles_per_image(self, cfg: VLMConfig, inputs) -> list[int]:
        """Per image: its tiles in pixel_values (thumbnail included)."""
        if inputs.pixel_values is None:
            return []
        g = self.tile_side(inputs)
        groups = self.tile_groups(cfg, inputs)
        for group in groups:
            for _, start, end in group:
                if end - start != g * g:
                    raise UserInputError(f"a tile has {end - start} placeholder tokens but the model makes {g * g} "
                                         "per tile: the processor's patch_size / img_size do not fit this model "
                                         "((tile side / (patch * downsample_factor)) ** 2)")
        counts = [len(group) for group in groups]
        if sum(counts) != inputs.pixel_values.shape[0]:
            raise UserInputError(f"the prompts' placeholders make {sum(counts)} tiles but pixel_values holds "
                                 f"{inputs.pixel_values.shape[0]}: build inputs with model.prepare(...) or the processor")
        return counts

    def image_markers(self, cfg: VLMConfig, inputs) -> list[list[ImageTile]] | None:
        """Per image: "start" / "end" (``<|START_OF_IMG|>`` / ``<|END_OF_IMG|>``), the tag text before each tile
        ("tile_tag", index = the tile's place) and before the thumbnail ("global_tag"); positions from the
        image's first placeholder token."""
        if inputs.pixel_values is None or self.start_id is None or self.end_id is None:
            return None
        ids = inputs.input_ids.cpu()
        out = []
        for group in self.tile_groups(cfg, inputs):
            row, first = group[0][0], group[0][1]
            marks = []
            opening = first - 1  # <|START_OF_IMG|>: before the first tile's tag
            while opening >= 0 and int(ids[row, opening]) != self.start_id:
                opening -= 1
            previous_end = first
            if opening >= 0:
                marks.append(ImageTile("start", torch.tensor([opening - first]), (1, 1), spatial=False))
                previous_end = opening + 1
            for k, (_, start, end) in enumerate(group):
                kind = "global_tag" if k == len(group) - 1 else "tile_tag"
                if start > previous_end:
                    marks.append(ImageTile(kind, torch.arange(previous_end - first, start - first),
                                           (1, start - previous_end), index=k, spatial=False))
                previous_end = end
            if previous_end < ids.shape[1] and int(ids[row, previous_end]) == self.end_id:
                marks.append(ImageTile("end", torch.tensor([previous_end - first]), (1, 1), spatial=False))
            out.append(marks)
        return out

    # ---- processor and prompts ----
    def load_processor(self, name_or_path: str, trust_remote_code: bool = False):
        try:
            return AyaVisionImageTextProcessor.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
        except (OSError, ValueError, TypeError, AttributeError, ImportError) as error:
            logger.info("AyaVisionImageTextProcessor unavailable for %s: %s", name_or_path, error)
            return None

    def processor_images(self, rows: list[list]) -> list:
        return [image for row in rows for image in row]

    def image_placeholder(self) -> str:
        return "<image>"

    def fallback_chat_prompt(self, question: str, n_images: int) -> str:
        return ("<|START_OF_TURN_TOKEN|><|USER_TOKEN|>" + self.image_placeholder() * n_images + question +
                "<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>")
