"""PaliGemma (`PaliGemmaForConditionalGeneration`): SigLIP tower, linear projector, Gemma decoder, the prompt
as a bidirectional prefix.

- Decoder: PaliGemma 1's Gemma text model, the Llama layout with Gemma's ``(1 + w)`` RMSNorms
  (`ZeroCenteredRMSNorm`), embeddings scaled by sqrt(d_model) (`ScaledEmbed`), GELU-tanh gated MLP and the
  final norm folded into `W_U`. PaliGemma 2's Gemma 2 text model soft-caps every attention score
  (``c * tanh(s / c)``) and the logits; vlens's attention does not reproduce that, so PaliGemma 2 is refused
  with that reason rather than run inexactly.
- Prefix-LM mask (HF's `token_type_ids`): every token of type 0 (the images, `<bos>`, the prompt and its
  newline: what the processor marks as the prefix) sees every other one, on top of the causal mask (one
  bidirectional block, `attention_blocks`); suffix tokens (type 1: training targets, generated tokens) are
  causal. Inputs without `token_type_ids` get the processor's rule (all prefix); token types shorter than
  the ids (tokens appended by teacher forcing) are extended with suffix tokens, as HF's `generate` does.
- Positions are 1-based (HF adds 1 to its positions in forward and generate): real tokens ``cumsum(mask)``,
  HF generate's rule; padding continues that count backwards from the first real token (a per-row shift of
  HF forward's ``arange + 1``), so that padding queries, which the prefix block lets read the prompt, see
  the same relative positions as in HF's forward.
- Vision: HF's SigLIP tower (forward hooks give `vision.blocks.{i}.hook_resid_post` and per-head
  `vision.blocks.{i}.attn.hook_z`), its post-LayerNorm'd output at `vision.hook_image_features`
  [n_images, n_patches, width], the linear projector -> `vision.hook_image_embeds`. Each image is resized to
  the tower's size and gives (image_size / patch_size)^2 tokens on a square grid.
- Prompt: ``<image>`` x n_images, ``<bos>``, the question, ``\\n`` (PaliGemma has no chat format; a raw prompt,
  ``chat=False``, gets no newline). The processor refuses prompts without images; `process` formats every
  row itself, as the processor formats prompts with images. A fine-tuning batch's answers (after the
  newline) are suffix tokens (`mark_answer_tokens`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from vlens.core.architectures.base import DecoderParts, HFModule, token_id_list
from vlens.core.architectures.gemma3 import Gemma3Adapter
from vlens.core.architectures.registry import register_adapter
from vlens.core.components import (
    RotaryEmbedding,
    ScaledEmbed,
    TransformerBlock,
    Unembed,
    ZeroCenteredRMSNormPre,
)
from vlens.core.config import VLMConfig
from vlens.utils.errors import UserInputError


@register_adapter
class PaliGemmaAdapter(Gemma3Adapter):
    """Gemma 3's vision side (SigLIP tower, hooks, one fixed-size grid per image) and token-type bookkeeping;
    its own decoder config, prefix block, 1-based positions and prompt format."""

    hf_class_names = ("PaliGemmaForConditionalGeneration",)
    family = "paligemma"
    query_norm_head_axis = -2  # no query norm

    def build_config(self, hf_model: HFModule) -> VLMConfig:
        config = hf_model.config
        text = config.text_config
        if text.model_type != "gemma":
            raise UserInputError(
                f"this PaliGemma checkpoint's text model is {text.model_type!r} (PaliGemma 2 uses Gemma 2, which "
                "soft-caps every attention score and the logits); vlens runs PaliGemma with a Gemma text model "
                "only, because its attention does not reproduce soft-capping exactly.")
        # PaliGemmaConfig sets the text model's use_bidirectional_attention (only a mask-less SDPA call reads
        # it; PaliGemma always builds its mask from the token types, as here)
        vision = config.vision_config
        self.image_size = int(vision.image_size)
        side = self.image_size // int(vision.patch_size)
        self.tokens_per_image = side * side
        self.image_grid = (side, side)
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
            d_head=text.head_dim,
            d_mlp=text.intermediate_size,
            d_vocab=text.vocab_size,
            act_fn=getattr(text, "hidden_activation", None) or text.hidden_act,
            eps=text.rms_norm_eps,
            rope_theta=float(rope.get("rope_theta", 10000.0)),
            rope_kind="1d",
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
            default_prepend_bos=False,  # the processor writes <bos> after the images
        )

    # ---- decoder ----
    def build_decoder(self, hf_model: HFModule, cfg: VLMConfig) -> DecoderParts:
        lm = self.language_model(hf_model)
        return DecoderParts(
            embed=ScaledEmbed(lm.embed_tokens, placeholder_id=cfg.image_token_id),
            blocks=[self.build_block(cfg, layer, hf_layer) for layer, hf_layer in enumerate(lm.layers)],
            ln_final=ZeroCenteredRMSNormPre(lm.norm.eps),
            unembed=Unembed(hf_model.lm_head, lm.norm.weight, ln_final_source=lm.norm,
                            ln_final_offset=self.norm_weight_offset),
            rotary=RotaryEmbedding(lm.rotary_emb, cfg.rope_kind),
        )

    def build_block(self, cfg: VLMConfig, layer: int, hf_layer: HFModule) -> TransformerBlock:
        return TransformerBlock(  # Gemma's layout is Llama's; only the norms differ (build_norm: 1 + w)
            layer,
            ln1=self.build_norm(cfg, hf_layer.input_layernorm),
            attn=self.build_attention(cfg, layer, hf_layer),
            ln2=self.build_norm(cfg, hf_layer.post_attention_layernorm),
            mlp=self.build_mlp(cfg, layer, hf_layer),
        )

    # ---- token types and the prefix block ----
    def check_inputs(self, cfg: VLMConfig, inputs) -> None:
        pixel_values = inputs.pixel_values
        if pixel_values is not None and (pixel_values.ndim != 4
                                         or tuple(pixel_values.shape[-2:]) != (self.image_size, self.image_size)):
            raise UserInputError(
                f"PaliGemma's vision tower takes pixel_values [n_images, 3, {self.image_size}, {self.image_size}], "
                f"got {tuple(pixel_values.shape)}: build inputs with model.prepare(...) or the PaliGemma processor, "
                "which resizes every image to that size.")
        ids = inputs.input_ids
        types = inputs.extra.get("token_type_ids")
        if types is None:
            inputs.extra["token_type_ids"] = torch.zeros_like(ids)  # the processor's rule: a prompt is all prefix
        elif types.shape[0] != ids.shape[0] or types.shape[-1] > ids.shape[-1]:
            raise UserInputError(f"token_type_ids {tuple(types.shape)} do not fit input_ids {tuple(ids.shape)}")
        elif types.shape[-1] < ids.shape[-1]:  # appended tokens are suffix tokens (HF generate's rule)
            inputs.extra["token_type_ids"] = torch.nn.functional.pad(types, (0, ids.shape[-1] - types.shape[-1]),
                                                                     value=1)

    def attention_blocks(self, cfg: VLMConfig, inputs) -> Tensor | None:
        """HF's `block_sequence_ids`: 0 for every prefix token (type 0, padding included: the padding mask
        removes those keys), -1 for suffix tokens."""
        types = inputs.extra.get("token_type_ids")
        if types is None:
            return torch.zeros_like(inputs.input_ids)
        types = types.to(inputs.input_ids.device)
        return torch.where(types == 0, torch.zeros_like(types), torch.full_like(types, -1))

    # ---- positions ----
    def position_ids(self, hf_model: HFModule, inputs) -> tuple[Tensor, None]:
        mask = inputs.attention_mask.long()
        positions = mask.cumsum(-1)  # 1-based at real tokens: HF generate's cumsum - 1, plus PaliGemma's 1
        first = mask.argmax(-1, keepdim=True)  # the first real token of each row
        before = torch.arange(mask.shape[-1], device=mask.device)[None, :] - first + 1
        return torch.where((mask == 0) & (before <= 0), before, positions), None

    def decode_position_ids(self, attention_mask: Tensor, n_new: int, deltas: Tensor | None = None) -> Tensor:
        return attention_mask.long().cumsum(-1)[:, -n_new:]

    # ---- prompts ----
    def process(self, processor, texts: list[str], images: list | None, **kwargs: Any):
        """HF's formatting for every row (``<image>`` x n, ``<bos>``, the text), done here so rows without
        an image (which HF's processor refuses, or gives a misplaced ``<bos>``) get it too: the images'
        placeholders expanded to `image_seq_length` tokens, every token of type 0 (prefix). The newline HF's
        processor appends belongs to the prompt format (`fallback_chat_prompt`), so that a prompt followed by
        its answer (fine-tuning) is prefix, newline, answer, as HF's processor makes it with ``suffix=``."""
        image_token = getattr(processor, "image_token", "<image>")
        tokenizer = processor.tokenizer
        rows = images if images is not None else [[] for _ in texts]
        if len(rows) != len(texts):
            raise UserInputError(f"got {len(rows)} image lists for {len(texts)} prompts")
        formatted = []
        for text, row in zip(texts, rows, strict=True):
            if text.count(image_token) != len(row):
                raise UserInputError(f"a PaliGemma prompt holds {text.count(image_token)} {image_token} "
                                     f"placeholders for {len(row)} images: {text!r}")
            end = text.rfind(image_token) + len(image_token) if row else 0
            expanded = text[:end].replace(image_token, image_token * processor.image_seq_length)
            formatted.append(expanded + tokenizer.bos_token + text[end:])
        encoded = dict(tokenizer(formatted, return_tensors="pt", padding=True, add_special_tokens=False,
                                 return_token_type_ids=True))
        encoded["token_type_ids"] = torch.zeros_like(encoded["input_ids"])
        flat = [image for row in rows for image in row]
        if flat:
            encoded["pixel_values"] = processor.image_processor(flat, return_tensors="pt")["pixel_values"]
        return encoded

    def image_placeholder(self) -> str:
        return "<image>"

    def fallback_chat_prompt(self, question: str, n_images: int) -> str:
        return self.image_placeholder() * n_images + question.strip() + "\n"

    def mark_answer_tokens(self, cfg: VLMConfig, inputs, counts: list[int]) -> None:
        """The answers a fine-tuning batch ends with are suffix tokens (type 1): causal, never read by the prompt
        (HF's processor marks its ``suffix=`` so)."""
        types = inputs.extra["token_type_ids"]
        for row, count in enumerate(counts):
            if count:
                types[row, types.shape[-1] - count:] = 1
