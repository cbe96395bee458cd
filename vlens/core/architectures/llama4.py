"""Llama 4 (`Llama4ForConditionalGeneration`: Scout / Maverick): a MoE decoder with chunked RoPE layers and
global NoPE layers, HF's Llama 4 vision tower with a pixel-shuffle MLP, a linear projector; tiles + a global tile.

- Attention (`Llama4Attention`, HF's order): q / k / v projections (`hook_q/k/v`), then on RoPE layers
  (`no_rope_layers[l] == 1`) rotary on adjacent pairs (HF's complex product, in fp32) and, with `use_qk_norm`,
  a weightless RMS (L2-style) norm of each head's q and k; on NoPE layers (`cfg.nope_layers`) no rotary, and with
  `attn_temperature_tuning` the queries scaled by ``1 + attn_scale * log1p(floor((i + 1) / floor_scale))`` for
  absolute sequence index i (padding included, HF's rule); `hook_rot_q` / `hook_rot_k` are what the scores
  read. "chunked_attention" layers (the RoPE layers when `attention_chunk_size` is set) see only keys of their
  own chunk, counted from each row's first real token (`AttentionMasks.chunked`); their KV cache keeps every key
  (the mask does the chunking).
- MLP: dense `feed_forward` (gate / up / down) on the layers not in `moe_layers`, else `Llama4MoEMLP`: a router
  whose top-k logits go through a sigmoid (`hook_expert_weights`), each chosen expert reads the token scaled by
  its weight (HF multiplies the expert's input, not its output: `hook_expert_out` is the expert's output on the
  scaled token), their sum (`hook_routed_out`) plus an ungated shared expert (`hook_shared_out`).
- Vision: HF's tower run as HF runs it (unfold patch embedding, CLS last, 2-D rotary, pre / post LayerNorm, the
  pixel-shuffle MLP) with hooks on its blocks (`vision.blocks.{i}.hook_resid_post`, per-head
  `vision.blocks.{i}.attn.hook_z`); `vision.hook_image_features` [n_tiles, g^2, vision_output_dim] (projector
  input), `vision.hook_tile_embeds` [n_tiles, g^2, d_model], `vision.hook_image_embeds` [n_image_tokens, d_model].
- Tiles (`Llama4ImageTextProcessor`, HF's layout arithmetic): the image resized (aspect kept) onto the best-fit
  canvas of rows x cols tiles, padded right / bottom, tiles row-major, then a global tile (the whole image
  squashed) when there are several. Regions: one "image" record for one tile; else a "tile" per tile (layout
  cell, layout grid, pixel `box` on the original image and its `extent` over the padding, from ``image_sizes``)
  and the "base" global tile (``original_image_sizes``, which HF's forward never sees). The layout is read from the
  separators between the tiles. Markers: "start"
  (``<|image_start|>``), "tile_x" / "tile_y" (separators), "global_tag" (``<|image|>``), "end".
- Positions: 1-D from the attention mask (HF `generate`'s rule, inherited from LLaVA).
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor, nn

from vlens.core.architectures.base import (
    ArchitectureAdapter,
    DecoderParts,
    HFModule,
    ImageFeatures,
    ImageTile,
    placeholder_runs,
    token_id_list,
)
from vlens.core.architectures.llama4_processor import Llama4ImageTextProcessor, resized_size
from vlens.core.architectures.llava import LlavaAdapter
from vlens.core.architectures.registry import register_adapter
from vlens.core.components import (
    Embed,
    GatedMLP,
    HookedVisionTower,
    RMSNorm,
    RMSNormPre,
    TransformerBlock,
    Unembed,
)
from vlens.core.components.llama4_parts import Llama4Attention, Llama4MoEMLP, Llama4Rotary
from vlens.core.components.vision import attach_vision_head_hooks
from vlens.core.config import VLMConfig
from vlens.core.hooks import HookPoint
from vlens.utils.errors import UserInputError

logger = logging.getLogger(__name__)
MARKS = {"<|image_start|>": "start", "<|tile_x_separator|>": "tile_x", "<|tile_y_separator|>": "tile_y",
         "<|image|>": "global_tag", "<|image_end|>": "end"}


@register_adapter
class Llama4Adapter(LlavaAdapter):
    hf_class_names = ("Llama4ForConditionalGeneration",)
    family = "llama4"

    def language_model(self, hf_model: HFModule) -> HFModule:
        return hf_model.language_model.model

    def build_config(self, hf_model: HFModule) -> VLMConfig:
        config = hf_model.config
        text = config.text_config
        vision = config.vision_config
        self.patch_size = int(vision.patch_size)
        self.shuffle_ratio = float(vision.pixel_shuffle_ratio)
        self.marks: dict[int, str] = {}
        layer_types = list(text.layer_types)
        rope = getattr(text, "rope_parameters", None) or {}
        generation = getattr(hf_model, "generation_config", None)
        eos = getattr(generation, "eos_token_id", None) if generation is not None else None
        eos = eos if eos is not None else text.eos_token_id
        bias = bool(getattr(text, "attention_bias", False))
        moe_layers = [int(x) for x in text.moe_layers]
        return VLMConfig(
            architecture=type(hf_model).__name__,
            n_layers=text.num_hidden_layers,
            d_model=text.hidden_size,
            n_heads=text.num_attention_heads,
            n_key_value_heads=text.num_key_value_heads,
            d_head=text.head_dim,
            d_mlp=text.intermediate_size_mlp,
            d_vocab=text.vocab_size,
            act_fn=text.hidden_act,
            eps=text.rms_norm_eps,
            rope_theta=float(rope.get("rope_theta", 10000.0)),
            rope_kind="1d",
            rope_adjacent_pairs=True,  # HF's complex product pairs (2i, 2i + 1)
            qk_norm=bool(text.use_qk_norm),
            layer_types=layer_types if "chunked_attention" in layer_types else [],
            attention_chunk_size=text.attention_chunk_size,
            nope_layers=[i for i, rope_on in enumerate(text.no_rope_layers) if not rope_on],
            attn_qkv_bias=bias,
            attn_out_bias=bias,
            tie_word_embeddings=bool(getattr(text, "tie_word_embeddings", False)),
            image_token_id=config.image_token_id,
            pad_token_id=getattr(text, "pad_token_id", None),
            eos_token_ids=token_id_list(eos),
            spatial_merge_size=1,
            n_ctx=text.max_position_embeddings,
            model_name=getattr(config, "_name_or_path", "") or "",
            dtype=hf_model.language_model.lm_head.weight.dtype,
            device=str(hf_model.language_model.lm_head.weight.device),
            n_experts=int(text.num_local_experts) if moe_layers else 0,
            n_experts_per_token=int(text.num_experts_per_tok) if moe_layers else 0,
            moe_layers=moe_layers,
            d_expert=int(text.intermediate_size) if moe_layers else 0,
            d_shared_expert=int(text.intermediate_size) if moe_layers else 0,
            default_prepend_bos=True,
        )

    # ---- decoder ----
    def build_decoder(self, hf_model: HFModule, cfg: VLMConfig) -> DecoderParts:
        lm = self.language_model(hf_model)
        return DecoderParts(
            embed=Embed(lm.embed_tokens),
            blocks=[self.build_block(cfg, layer, hf_layer) for layer, hf_layer in enumerate(lm.layers)],
            ln_final=RMSNormPre(cfg.eps),
            unembed=Unembed(hf_model.language_model.lm_head, lm.norm.weight, ln_final_source=lm.norm),
            rotary=Llama4Rotary(lm.rotary_emb, cfg.rope_kind),
        )

    def build_block(self, cfg: VLMConfig, layer: int, hf_layer: HFModule) -> TransformerBlock:
        norm1, norm2 = hf_layer.input_layernorm, hf_layer.post_attention_layernorm
        return TransformerBlock(
            layer,
            ln1=RMSNorm(norm1.weight, norm1.variance_epsilon, source=norm1),
            attn=self.build_attention(cfg, layer, hf_layer),
            ln2=RMSNorm(norm2.weight, norm2.variance_epsilon, source=norm2),
            mlp=self.build_mlp(cfg, layer, hf_layer),
        )

    def build_attention(self, cfg: VLMConfig, layer: int, hf_layer: HFModule) -> Llama4Attention:
        sa = hf_layer.self_attn
        text = sa.config
        return Llama4Attention(cfg, layer, sa.q_proj, sa.k_proj, sa.v_proj, sa.o_proj,
                               qk_norm_eps=text.rms_norm_eps if hasattr(sa, "qk_norm") else None,
                               temperature=(float(text.attn_scale), float(text.floor_scale))
                               if text.attn_temperature_tuning and not sa.use_rope else None)

    def build_mlp(self, cfg: VLMConfig, layer: int, hf_layer: HFModule) -> GatedMLP | Llama4MoEMLP:
        ff = hf_layer.feed_forward
        if not hf_layer.is_moe_layer:
            return GatedMLP(ff.gate_proj, ff.up_proj, ff.down_proj, cfg.act_fn)
        shared = ff.shared_expert
        return Llama4MoEMLP(ff.router, ff.experts, top_k=ff.top_k,
                            shared_expert=GatedMLP(shared.gate_proj, shared.up_proj, shared.down_proj, cfg.act_fn))

    def query_norm(self, hf_layer: HFModule) -> nn.Module | None:
        """None on NoPE layers and without `use_qk_norm` (a temperature scales q_proj's output: rotary and the
        NoPE temperature are linear in q); on a RoPE layer with the norm, refused: HF's `qk_norm` runs after
        rotary on q and k alike (one module), which would undo a scaled q_proj and scale k with q."""
        if getattr(hf_layer.self_attn, "qk_norm", None) is None:
            return None
        raise UserInputError("Llama 4's RoPE layers normalise q and k after rotary with one shared query norm "
                             "(qk_norm): a head temperature can be neither baked into q_proj nor hooked on HF's model "
                             "there; apply it on the HookedVLM (vlens temperature apply)")

    # ---- vision ----
    def bind_processor(self, processor) -> None:
        tokenizer = getattr(processor, "tokenizer", processor)
        self.marks = {}
        if tokenizer is None or not hasattr(tokenizer, "convert_tokens_to_ids"):
            return
        unknown = getattr(tokenizer, "unk_token_id", None)
        for text, kind in MARKS.items():
            value = tokenizer.convert_tokens_to_ids(text)
            if value is not None and value != unknown:
                self.marks[int(value)] = kind

    def build_vision(self, hf_model: HFModule) -> HookedVisionTower:
        tower = hf_model.vision_model
        rotary = tower.rotary_embedding
        if not torch.is_complex(rotary.freqs_ci):  # Module.to(dtype) kept only its real part: HF's table again
            rotary.freqs_ci = rotary._compute_freqs_ci(hf_model.config.vision_config).to(rotary.freqs_ci.device)
        layers = list(tower.model.layers)
        vision = HookedVisionTower(tower, layers, projector=hf_model.multi_modal_projector)
        vision.hook_image_features = HookPoint()  # [n_tiles, g^2, vision_output_dim]: projector input
        vision.hook_tile_embeds = HookPoint()  # [n_tiles, g^2, d_model]: projector output
        heads = hf_model.config.vision_config.num_attention_heads
        attach_vision_head_hooks(vision, [layer.self_attn.o_proj for layer in layers], heads)
        return vision

    def check_inputs(self, cfg: VLMConfig, inputs) -> None:
        pixel_values = inputs.pixel_values
        if pixel_values is None:
            return
        if pixel_values.ndim != 4:
            raise UserInputError(f"Llama 4 expects pixel_values [n_tiles, channels, height, width] (every image's "
                                 f"tiles concatenated), got {tuple(pixel_values.shape)}. Build inputs with "
                                 "model.prepare(...) or the Llama 4 processor.")

    def tile_side(self, inputs) -> int:
        """Tokens per tile side after the pixel shuffle (g)."""
        return int(inputs.pixel_values.shape[-1] // self.patch_size * self.shuffle_ratio)

    def encode_images(self, vision: HookedVisionTower, inputs) -> ImageFeatures:
        tower: HFModule = vision.tower
        dtype = tower.patch_embedding.linear.weight.dtype
        features = tower(inputs.pixel_values.to(dtype), return_dict=True).last_hidden_state
        features = vision.get_submodule("hook_image_features")(features)
        if vision.projector is None:
            raise RuntimeError("a Llama 4 vision tower needs its multi-modal projector")
        per_tile = vision.get_submodule("hook_tile_embeds")(vision.projector(features))
        return ImageFeatures(embeds=vision.hook_image_embeds(per_tile.reshape(-1, per_tile.shape[-1])), deepstack=[])

    # ---- tiles and regions ----
    def images(self, cfg: VLMConfig, inputs) -> list[tuple[int, list[tuple[int, int]], tuple[int, int]]]:
        """Every image in order: (row, its runs of placeholders (start, end), its tile layout (rows, cols)). An
        image's runs are the tiles then the global tile; the layout is read from the separators (rows: the
        ``<|tile_y_separator|>`` tokens, cols: one more than the x separators of a row)."""
        if cfg.image_token_id is None or inputs.pixel_values is None:
            return []
        ids = inputs.input_ids.cpu()
        g = self.tile_side(inputs)
        runs = placeholder_runs(ids, inputs.attention_mask.cpu(), cfg.image_token_id)
        y_sep = next((t for t, k in self.marks.items() if k == "tile_y"), None)
        x_sep = next((t for t, k in self.marks.items() if k == "tile_x"), None)
        out: list[tuple[int, list[tuple[int, int]], tuple[int, int]]] = []
        current: list[tuple[int, int]] = []
        row_of = -1
        rows = cols = 0
        for row, start, end in runs:
            if end - start != g * g:
                raise UserInputError(f"a tile has {end - start} placeholder tokens but the model makes {g * g} per "
                                     "tile: the processor's patch size / pixel shuffle ratio do not fit this model")
            if current and row != row_of:
                raise UserInputError("an image's tiles end without its global tile: build inputs with the processor")
            row_of = row
            current.append((start, end))
            after = int(ids[row, end]) if end < ids.shape[1] else None
            if after == y_sep:
                rows += 1
            if after == x_sep and rows == 0:
                cols += 1
            if after not in (x_sep, y_sep) or x_sep is None:
                out.append((row, current, (rows, cols + 1) if rows else (1, 1)))
                current, rows, cols = [], 0, 0
        if sum(len(runs_) for _, runs_, _ in out) != inputs.pixel_values.shape[0]:
            raise UserInputError(f"the prompts' placeholders make {sum(len(r) for _, r, _ in out)} tiles but "
                                 f"pixel_values holds {inputs.pixel_values.shape[0]}: build inputs with the processor")
        return out

    def image_layouts(self, cfg: VLMConfig, inputs) -> list[list[ImageTile]]:
        images = self.images(cfg, inputs)
        if not images:
            return []
        g = self.tile_side(inputs)
        per = g * g
        tile_px = int(inputs.pixel_values.shape[-1])
        sizes = self.image_sizes(inputs)
        if sizes is not None and len(sizes) != len(images):
            raise UserInputError(f"image_sizes holds {len(sizes)} images but the prompts {len(images)}")
        out = []
        for k, (_, runs, (rows, cols)) in enumerate(images):
            size = None if sizes is None else sizes[k]
            if len(runs) == 1:  # one tile: the image resized (aspect kept) at its top left, padded
                box, extent, _ = self.tile_box(size, (0, 0), (1, 1), tile_px)
                out.append([ImageTile("image", torch.arange(per), (g, g), box=box, extent=extent)])
                continue
            records = []
            for i in range(len(runs) - 1):
                cell = divmod(i, cols)
                box, extent, spatial = self.tile_box(size, cell, (rows, cols), tile_px)
                records.append(ImageTile("tile", torch.arange(i * per, (i + 1) * per), (g, g), index=i, layout=cell,
                                         layout_grid=(rows, cols), box=box, extent=extent, spatial=spatial))
            whole = None if size is None else (0.0, 0.0, float(size[1]), float(size[0]))
            n = len(runs) - 1
            records.append(ImageTile("base", torch.arange(n * per, (n + 1) * per), (g, g), index=n, box=whole))
            out.append(records)
        return out

    def tile_box(self, size: tuple[int, int] | None, cell: tuple[int, int], grid: tuple[int, int], tile_px: int):
        """(box, extent, spatial) of tile `cell` in original pixels: the canvas holds the image resized (aspect kept)
        at its top left, padding right / bottom; extent: the whole tile's span, past the image where it is padded."""
        if size is None:
            return None, None, False
        height, width = size
        canvas = (grid[0] * tile_px, grid[1] * tile_px)
        to_max = bool(getattr(self, "resize_to_max_canvas", False))
        new_h, new_w = resized_size((height, width), canvas, tile_px, to_max)
        sx, sy = width / new_w, height / new_h
        r, c = cell
        x0, y0, x1, y1 = c * tile_px * sx, r * tile_px * sy, (c + 1) * tile_px * sx, (r + 1) * tile_px * sy
        box = (x0, y0, min(x1, float(width)), min(y1, float(height)))
        if box[0] >= width or box[1] >= height:
            return None, None, False  # all padding
        extent = (x0, y0, x1, y1) if (x1 > width or y1 > height) else None
        return box, extent, True

    def image_token_counts(self, cfg: VLMConfig, inputs) -> tuple[list[int], list[tuple[int, int]]]:
        layouts = self.image_layouts(cfg, inputs)
        return [sum(len(t.positions) for t in records) for records in layouts], [records[-1].grid for records in layouts]

    def image_tiles(self, cfg: VLMConfig, inputs) -> list[list[ImageTile]] | None:
        return self.image_layouts(cfg, inputs)

    def image_sizes(self, inputs) -> list[tuple[int, int]] | None:
        sizes = inputs.extra.get("original_image_sizes")
        if sizes is None:
            return None
        values = sizes.tolist() if isinstance(sizes, Tensor) else [list(s) for s in sizes]
        return [(int(h), int(w)) for h, w in values]

    def original_image_sizes(self, inputs) -> list[tuple[int, int]] | None:
        sizes = self.image_sizes(inputs)
        return [(w, h) for h, w in sizes] if sizes else None

    def pixel_entries_per_image(self, cfg: VLMConfig, inputs) -> list[int] | None:
        return [len(runs) for _, runs, _ in self.images(cfg, inputs)]

    def image_markers(self, cfg: VLMConfig, inputs) -> list[list[ImageTile]] | None:
        if inputs.pixel_values is None or not self.marks:
            return None
        ids = inputs.input_ids.cpu()
        out = []
        for row, runs, _ in self.images(cfg, inputs):
            first, last = runs[0][0], runs[-1][1]
            marks = []
            start = first - 1
            while start >= 0 and self.marks.get(int(ids[row, start])) != "start":
                start -= 1
            span = range(max(start, 0), min(last + 1, ids.shape[1]))
            for position in span:
                kind = self.marks.get(int(ids[row, position]))
                if kind is not None:
                    marks.append(ImageTile(kind, torch.tensor([position - first]), (1, 1), spatial=False))
            out.append(marks)
        return out

    image_points_to_grid = ArchitectureAdapter.image_points_to_grid  # the global tile squashes the whole image

    # ---- processor and prompts ----
    def load_processor(self, name_or_path: str, trust_remote_code: bool = False):
        try:
            return Llama4ImageTextProcessor.from_pretrained(name_or_path)
        except (OSError, ValueError, TypeError, KeyError, UserInputError) as error:
            logger.info("Llama4ImageTextProcessor unavailable for %s: %s", name_or_path, error)
            return None

    def image_placeholder(self) -> str:
        return "<|image|>"

    def fallback_chat_prompt(self, question: str, n_images: int) -> str:
        return ("<|header_start|>user<|header_end|>\n\n" + self.image_placeholder() * n_images + question +
                "<|eot|><|header_start|>assistant<|header_end|>\n\n")

