"""LFM2-VL (`Lfm2VlForConditionalGeneration`): SigLIP2 NaFlex tower, pixel-unshuffle + MLP projector, LFM2's
hybrid decoder of short convolutions and softmax attention.

- Decoder (`model.language_model`, an `Lfm2Model`): per-layer `layer_types`, "conv" or "full_attention".
  A "conv" layer (`layer.conv`, HF's `Lfm2ShortConv`) becomes `ShortConv` (hooks on the gates b / c, the
  values x, the convolution's input b * x and output, and `attn.hook_z` = c * conv before out_proj; heads
  are groups of the attention head size of the depthwise channels; conv state in `KVCache.conv_states`,
  HF's own `causal_conv1d_fn` / `causal_conv1d_update`); an attention layer is softmax attention with HF's
  per-head q / k RMSNorms (`q_layernorm`, `k_layernorm`) and `out_proj`. Norms: `operator_norm` before
  the mixer, `ffn_norm` before the SwiGLU MLP (`feed_forward.w1` gate, `w3` up, `w2` down), the final
  `embedding_norm` folded into W_U. 1-D RoPE, positions from the attention mask (LLaVA's rule).
- Vision: HF's `Siglip2VisionModel` (patchified tiles [n_tiles, max_patches, 3 p^2], positional embeddings
  resized to each tile's `spatial_shapes`, padding patches masked), called as HF calls it; every encoder
  block's output at `vision.blocks.{i}.hook_resid_post`, per-head `vision.blocks.{i}.attn.hook_z`, the
  post-LayerNorm output at `vision.hook_image_features` [n_tiles, max_patches, width] (what the projector
  reads); HF's gather of each tile's factor x factor patch blocks and the projector (pixel unshuffle,
  LayerNorm, MLP) -> `vision.hook_image_embeds` [n_image_tokens, d_model].
- Tokens of an image (HF's `Lfm2VlProcessor`): ``<|image_start|>``, then either one tile's tokens (the image
  resized whole: kind "image") or, for a large image, per tile ``<|img_row_r_col_c|>`` + its tokens ("tile"
  records with their `layout` cell of the (rows, cols) `layout_grid`: the tiles cut the image resized to
  cols x rows tiles, equal bands) and ``<|img_thumbnail|>`` + the thumbnail's tokens (kind "base": the
  whole image resized), then ``<|image_end|>``. The tags are markers ("start", "tile_tag", "global_tag",
  "end"), read through the model's processor's tokenizer (`bind_processor`). Which tiles belong to which
  image follows from the runs of placeholders and each tile's token count (spatial_shapes / factor).
- Processor: HF's image processor needs torchvision; `Lfm2VlImageTextProcessor` does its job with PIL
  (`lfm2_vl_processor`), and `load_processor` builds it from a folder.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

import torch
from torch import Tensor

from vlens.core.architectures.base import (
    DecoderParts,
    HFModule,
    ImageFeatures,
    ImageTile,
    placeholder_runs,
    token_id_list,
)
from vlens.core.architectures.lfm2_vl_processor import Lfm2VlImageTextProcessor
from vlens.core.architectures.llava import LlavaAdapter
from vlens.core.architectures.registry import register_adapter
from vlens.core.architectures.simple_processor import processor_from_folder
from vlens.core.components import (
    Attention,
    Embed,
    GatedDeltaNet,
    GatedMLP,
    HookedVisionTower,
    RMSNorm,
    RMSNormPre,
    RotaryEmbedding,
    ShortConv,
    TransformerBlock,
    Unembed,
)
from vlens.core.components.vision import attach_vision_head_hooks
from vlens.core.config import VLMConfig
from vlens.core.hooks import HookPoint
from vlens.utils.errors import UserInputError

_TILE_TAG = re.compile(r"<\|img_row_(\d+)_col_(\d+)\|>")


@dataclass
class _Tags:
    """The token ids around LFM2-VL's placeholders (None / empty: unknown, no processor bound)."""

    start: int | None = None
    end: int | None = None
    thumbnail: int | None = None
    tiles: dict[int, tuple[int, int]] = field(default_factory=dict)  # <|img_row_r_col_c|> id -> (r - 1, c - 1)


@dataclass
class _Run:
    """One run of placeholders: its row, [start, end), the token before it and the tiles it holds."""

    row: int
    start: int
    end: int
    tag: int  # -1: none (the run starts the row)
    tiles: list[int]


@register_adapter
class Lfm2VlAdapter(LlavaAdapter):
    """LFM2's hybrid decoder, SigLIP2 NaFlex tiles and thumbnails (module docstring)."""

    hf_class_names = ("Lfm2VlForConditionalGeneration",)
    family = "lfm2_vl"

    def build_config(self, hf_model: HFModule) -> VLMConfig:
        config = hf_model.config
        text = config.text_config
        self.factor = int(config.downsample_factor)
        self.patch_size = int(config.vision_config.patch_size)
        self.tags = getattr(self, "tags", _Tags())
        rope = getattr(text, "rope_parameters", None) or {}
        generation = getattr(hf_model, "generation_config", None)
        eos = getattr(generation, "eos_token_id", None) if generation is not None else None
        d_head = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        mlp: HFModule = self.decoder_layers(hf_model)[0].feed_forward
        return VLMConfig(
            architecture=type(hf_model).__name__,
            n_layers=text.num_hidden_layers,
            d_model=text.hidden_size,
            n_heads=text.num_attention_heads,
            n_key_value_heads=text.num_key_value_heads or text.num_attention_heads,
            d_head=d_head,
            d_mlp=int(mlp.w1.out_features),
            d_vocab=text.vocab_size,
            act_fn="silu",
            eps=text.norm_eps,
            rope_theta=float(rope.get("rope_theta", 10000.0)),
            rope_kind="1d",
            layer_types=list(text.layer_types),
            # a conv layer's heads: its channels in groups of the attention head size
            linear_n_heads=text.hidden_size // d_head,
            linear_d_head=d_head,
            linear_conv_kernel=int(text.conv_L_cache),
            qk_norm=True,
            attn_qkv_bias=False,
            attn_out_bias=False,
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            image_token_id=config.image_token_id,
            pad_token_id=getattr(text, "pad_token_id", None),
            eos_token_ids=token_id_list(eos if eos is not None else text.eos_token_id),
            spatial_merge_size=1,
            n_ctx=text.max_position_embeddings,
            model_name=getattr(config, "_name_or_path", "") or "",
            dtype=hf_model.lm_head.weight.dtype,
            device=str(hf_model.lm_head.weight.device),
        )

    # ---- decoder ----
    def build_decoder(self, hf_model: HFModule, cfg: VLMConfig) -> DecoderParts:
        lm = self.language_model(hf_model)
        return DecoderParts(
            embed=Embed(lm.embed_tokens),
            blocks=[self.build_block(cfg, layer, hf_layer) for layer, hf_layer in enumerate(lm.layers)],
            ln_final=RMSNormPre(cfg.eps),
            unembed=Unembed(hf_model.lm_head, lm.embedding_norm.weight, ln_final_source=lm.embedding_norm),
            rotary=RotaryEmbedding(lm.rotary_emb, cfg.rope_kind),
        )

    def build_block(self, cfg: VLMConfig, layer: int, hf_layer: HFModule) -> TransformerBlock:
        mlp = hf_layer.feed_forward
        return TransformerBlock(layer, ln1=RMSNorm(hf_layer.operator_norm.weight, cfg.eps, source=hf_layer.operator_norm),
                                attn=self.build_attention(cfg, layer, hf_layer),
                                ln2=RMSNorm(hf_layer.ffn_norm.weight, cfg.eps, source=hf_layer.ffn_norm),
                                mlp=GatedMLP(mlp.w1, mlp.w3, mlp.w2, "silu"))

    def build_attention(self, cfg: VLMConfig, layer: int, hf_layer: HFModule) -> Attention | GatedDeltaNet | ShortConv:
        if cfg.is_linear_attention(layer):
            module = sys.modules[type(hf_layer.conv).__module__]  # HF's own conv functions (or its kernels)
            return ShortConv(cfg, layer, hf_layer.conv, module.causal_conv1d_fn, module.causal_conv1d_update)
        sa = hf_layer.self_attn
        return Attention(cfg, layer, sa.q_proj, sa.k_proj, sa.v_proj, sa.out_proj, q_norm=sa.q_layernorm,
                         k_norm=sa.k_layernorm)

    def query_projection(self, hf_layer: HFModule):
        if getattr(hf_layer, "self_attn", None) is None:
            raise UserInputError("this decoder layer is a short-convolution layer: it has no q_proj")
        return hf_layer.self_attn.q_proj

    def query_norm(self, hf_layer: HFModule):
        sa = getattr(hf_layer, "self_attn", None)
        return None if sa is None else sa.q_layernorm

    # ---- vision ----
    def build_vision(self, hf_model: HFModule) -> HookedVisionTower:
        tower = hf_model.model.vision_tower  # Siglip2VisionModel
        layers = list(tower.encoder.layers)
        vision = HookedVisionTower(tower, layers, projector=hf_model.model.multi_modal_projector)
        vision.hook_image_features = HookPoint()  # [n_tiles, max_patches, width]: the tower's output
        attach_vision_head_hooks(vision, [layer.self_attn.out_proj for layer in layers],
                                 hf_model.config.vision_config.num_attention_heads)
        return vision

    def check_inputs(self, cfg: VLMConfig, inputs) -> None:
        pixel_values = inputs.pixel_values
        if pixel_values is None:
            return
        shapes, mask = inputs.extra.get("spatial_shapes"), inputs.extra.get("pixel_attention_mask")
        if pixel_values.ndim != 3 or shapes is None or mask is None:
            raise UserInputError(f"LFM2-VL expects patchified tiles: pixel_values [n_tiles, max_patches, 3 * patch^2] "
                                 f"with spatial_shapes and pixel_attention_mask, got pixel_values "
                                 f"{tuple(pixel_values.shape)}. Build inputs with model.prepare(...) or the processor.")
        n_tiles = pixel_values.shape[0]
        if tuple(shapes.shape) != (n_tiles, 2) or tuple(mask.shape) != tuple(pixel_values.shape[:2]):
            raise UserInputError(f"spatial_shapes must be [{n_tiles}, 2] and pixel_attention_mask "
                                 f"{list(pixel_values.shape[:2])}, got {list(shapes.shape)} and {list(mask.shape)}")
        if bool((shapes % self.factor != 0).any()):
            raise UserInputError(f"every tile's patch rows and columns must be multiples of the downsample factor "
                                 f"{self.factor}, got spatial_shapes {shapes.tolist()}")

    def encode_images(self, vision: HookedVisionTower, inputs) -> ImageFeatures:
        tower: HFModule = vision.tower
        shapes = inputs.extra["spatial_shapes"]
        hidden = tower(pixel_values=inputs.pixel_values, spatial_shapes=shapes,
                       pixel_attention_mask=inputs.extra["pixel_attention_mask"]).last_hidden_state
        hidden = vision.get_submodule("hook_image_features")(hidden)
        if vision.projector is None:
            raise RuntimeError("an LFM2-VL vision tower needs its multi-modal projector")
        return ImageFeatures(embeds=vision.hook_image_embeds(_project(vision.projector, hidden, shapes, self.factor)),
                             deepstack=[])

    # ---- tiles and regions ----
    def bind_processor(self, processor) -> None:
        tokenizer = getattr(processor, "tokenizer", processor)
        if tokenizer is None or not hasattr(tokenizer, "convert_tokens_to_ids"):
            self.tags = _Tags()
            return
        unknown = getattr(tokenizer, "unk_token_id", None)

        def token_id(name: str, default: str) -> int | None:
            value = tokenizer.convert_tokens_to_ids(getattr(processor, name, None) or default)
            return None if value is None or value == unknown else int(value)

        tiles = {int(i): (int(m[1]) - 1, int(m[2]) - 1) for t, i in tokenizer.get_vocab().items()
                 if (m := _TILE_TAG.fullmatch(t))}
        self.tags = _Tags(start=token_id("image_start_token", "<|image_start|>"),
                          end=token_id("image_end_token", "<|image_end|>"),
                          thumbnail=token_id("image_thumbnail_token", "<|img_thumbnail|>"), tiles=tiles)

    def _tile_grids(self, inputs) -> list[tuple[int, int]]:
        return [(int(h) // self.factor, int(w) // self.factor) for h, w in inputs.extra["spatial_shapes"].tolist()]

    def _images(self, cfg: VLMConfig, inputs) -> list[list[_Run]]:
        """Every image of the batch in order, as its runs of placeholders (each holding whole tiles)."""
        if inputs.pixel_values is None or cfg.image_token_id is None:
            return []
        ids = inputs.input_ids.cpu()
        grids = self._tile_grids(inputs)
        runs, tile = [], 0
        for row, start, end in placeholder_runs(ids, inputs.attention_mask.cpu(), cfg.image_token_id):
            held, total = [], 0
            while total < end - start and tile < len(grids):
                total += grids[tile][0] * grids[tile][1]
                held.append(tile)
                tile += 1
            if total != end - start:
                raise UserInputError(f"a run of {end - start} image placeholders does not match the tiles of "
                                     "pixel_values (spatial_shapes / downsample factor): build inputs with "
                                     "model.prepare(...) or the model's processor")
            runs.append(_Run(row, start, end, int(ids[row, start - 1]) if start > 0 else -1, held))
        if tile != len(grids):
            raise UserInputError(f"the prompts' image placeholders hold {tile} tiles but pixel_values has {len(grids)}")
        images: list[list[_Run]] = []
        for run in runs:
            cell = self.tags.tiles.get(run.tag)
            continues = images and images[-1][-1].row == run.row and (
                run.tag == self.tags.thumbnail or (cell is not None and cell != (0, 0)))
            if continues:
                images[-1].append(run)
            else:
                images.append([run])
        return images

    def image_tiles(self, cfg: VLMConfig, inputs) -> list[list[ImageTile]] | None:
        grids = self._tile_grids(inputs) if inputs.pixel_values is not None else []
        out = []
        for runs in self._images(cfg, inputs):
            cells = [self.tags.tiles[r.tag] for r in runs if r.tag in self.tags.tiles]
            layout_grid = (max(c[0] for c in cells) + 1, max(c[1] for c in cells) + 1) if cells else None
            records, offset, index = [], 0, 0
            for run in runs:
                cell = self.tags.tiles.get(run.tag)
                for tile in run.tiles:
                    grid = grids[tile]
                    n = grid[0] * grid[1]
                    positions = torch.arange(offset, offset + n)
                    if len(runs) == 1 and len(run.tiles) == 1:
                        records.append(ImageTile("image", positions, grid))
                    elif run.tag == self.tags.thumbnail and len(run.tiles) == 1:
                        records.append(ImageTile("base", positions, grid, index=index))
                    elif cell is not None and len(run.tiles) == 1:
                        records.append(ImageTile("tile", positions, grid, index=index, layout=cell,
                                                 layout_grid=layout_grid))
                    else:  # tiles without tags (use_image_special_tokens=False): no known place on the image
                        records.append(ImageTile("tile", positions, grid, index=index, spatial=False))
                    offset, index = offset + n, index + 1
            out.append(records)
        return out

    def image_token_counts(self, cfg: VLMConfig, inputs) -> tuple[list[int], list[tuple[int, int]]]:
        """Per image: its tiles' tokens (spatial_shapes / factor each); grid: its whole-image view's (the only
        tile, or the thumbnail; without one, the last tile's)."""
        records = self.image_tiles(cfg, inputs) or []
        views = [next((r for r in recs if r.kind in ("image", "base")), recs[-1]) for recs in records]
        return [sum(len(r.positions) for r in recs) for recs in records], [v.grid for v in views]

    def pixel_entries_per_image(self, cfg: VLMConfig, inputs) -> list[int] | None:
        return [sum(len(r.tiles) for r in runs) for runs in self._images(cfg, inputs)]

    def image_markers(self, cfg: VLMConfig, inputs) -> list[list[ImageTile]] | None:
        if inputs.pixel_values is None or self.tags.start is None:
            return None
        ids = inputs.input_ids.cpu()
        return [self._marks(runs, ids[runs[0].row]) for runs in self._images(cfg, inputs)]

    def _marks(self, runs: list[_Run], row: Tensor) -> list[ImageTile]:
        """One image's structure tokens, positions from its first placeholder: ``<|image_start|>``, each tile's
        ``<|img_row_r_col_c|>`` (with its layout cell), ``<|img_thumbnail|>``, ``<|image_end|>``."""
        first = runs[0].start
        marks: list[ImageTile] = []

        def add(kind: str, position: int, layout=None, layout_grid=None) -> None:
            marks.append(ImageTile(kind, torch.tensor([position - first]), (1, 1), layout=layout,
                                   layout_grid=layout_grid, spatial=False))

        cells = [self.tags.tiles[r.tag] for r in runs if r.tag in self.tags.tiles]
        layout_grid = (max(c[0] for c in cells) + 1, max(c[1] for c in cells) + 1) if cells else None
        opening = first - 1 if runs[0].tag == self.tags.start else first - 2
        if opening >= 0 and int(row[opening]) == self.tags.start:
            add("start", opening)
        for run in runs:
            if run.tag in self.tags.tiles:
                add("tile_tag", run.start - 1, self.tags.tiles[run.tag], layout_grid)
            elif run.tag == self.tags.thumbnail:
                add("global_tag", run.start - 1)
        closing = runs[-1].end
        if closing < len(row) and int(row[closing]) == self.tags.end:
            add("end", closing)
        return marks

    # ---- prompts ----
    def load_processor(self, name_or_path: str, trust_remote_code: bool = False):
        return processor_from_folder(Lfm2VlImageTextProcessor, name_or_path, trust_remote_code)

    def image_placeholder(self) -> str:
        return "<image>"

    def fallback_chat_prompt(self, question: str, n_images: int) -> str:
        return ("<|startoftext|><|im_start|>user\n" + self.image_placeholder() * n_images + question +
                "<|im_end|>\n<|im_start|>assistant\n")


def _project(projector: HFModule, hidden: Tensor, spatial_shapes: Tensor, factor: int) -> Tensor:
    """[n_image_tokens, d_model]: HF's `Lfm2VlModel.get_image_features` after the tower: each tile's
    factor x factor patch blocks gathered side by side into one patch grid (padding slots read patch 0 and
    are dropped after), the projector (pixel unshuffle, LayerNorm, MLP) on it, the real tokens kept."""
    num_images, num_patches, _ = hidden.shape
    device = hidden.device
    spatial_shapes = spatial_shapes.to(device)
    widths = spatial_shapes[:, 1, None]
    blocks_per_row = widths // factor
    num_tokens = (spatial_shapes[:, 0, None] // factor) * blocks_per_row
    token = torch.arange(num_patches // factor ** 2, device=device)[None]
    block_offset = torch.arange(factor, device=device)
    rows = (token // blocks_per_row * factor)[..., None, None] + block_offset[:, None]
    columns = (token % blocks_per_row * factor)[..., None, None] + block_offset
    image_offset = torch.arange(num_images, device=device)[:, None, None, None] * num_patches
    patch_index = image_offset + rows * widths[..., None, None] + columns
    is_token = token < num_tokens
    patch_index = patch_index.masked_fill(~is_token[..., None, None], 0)
    patch_index = patch_index.flatten(0, 1).permute(1, 0, 2).reshape(factor, -1)
    patch_grid = hidden.reshape(-1, hidden.shape[-1])[patch_index]
    features = projector(patch_grid.unsqueeze(0))
    return features.reshape(-1, features.shape[-1])[is_token.flatten()]
