"""A tiny random Llama 4 (`Llama4ForConditionalGeneration`: Llama 4 vision tower + pixel-shuffle MLP, linear
projector, MoE decoder with chunked RoPE layers and NoPE layers) with vlens's torchvision-free processor
(`Llama4ImageTextProcessor`: HF's tile layout, PIL pixels), built offline.

The tokenizer is word-level with Llama 4's special tokens (``<|begin_of_text|>`` added in front of every text, the
header / turn tokens, ``<|image_start|>``, ``<|image|>``, ``<|patch|>``, the tile separators, ``<|image_end|>``).
"""

from __future__ import annotations

from typing import Any

import torch
from tokenizers import processors
from transformers import Llama4Config, Llama4ForConditionalGeneration, PreTrainedTokenizerFast

from vlens.core.architectures.llama4_processor import Llama4ImageTextProcessor, Llama4TileImageProcessor
from vlens.testing.common import TEST_WORDS, perturb_norms
from vlens.testing.gemma3 import gemma_word_tokenizer

LLAMA4_SPECIAL_TOKENS = ["<|finetune_right_pad|>", "<unk>", "<|begin_of_text|>", "<|eot|>", "<|header_start|>",
                         "<|header_end|>", "<|image_start|>", "<|image_end|>", "<|image|>", "<|patch|>",
                         "<|tile_x_separator|>", "<|tile_y_separator|>"]

# Llama 4's chat format (the tokenizer adds <|begin_of_text|>)
LLAMA4_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|header_start|>' + message['role'] + '<|header_end|>\n\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<|image|>' }}{%- elif item['type'] == 'text' -%}{{ item['text'] }}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}{{ '<|eot|>' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|header_start|>assistant<|header_end|>\n\n' }}{%- endif -%}"
)


def llama4_tokenizer(words: list[str] = TEST_WORDS) -> PreTrainedTokenizerFast:
    """An offline word-level tokenizer with Llama 4's special tokens, BOS added."""
    backend, vocab = gemma_word_tokenizer(LLAMA4_SPECIAL_TOKENS, [*words, "system"])
    backend.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", vocab["<|begin_of_text|>"])])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<|finetune_right_pad|>",
                                        eos_token="<|eot|>", bos_token="<|begin_of_text|>")
    tokenizer.chat_template = LLAMA4_CHAT_TEMPLATE
    return tokenizer


def tiny_llama4_processor(tile: int = 16, patch_size: int = 4, pixel_shuffle_ratio: float = 0.5, max_patches: int = 4,
                          tokenizer=None) -> Llama4ImageTextProcessor:
    """vlens's `Llama4ImageTextProcessor`: images onto a best-fit canvas of up to `max_patches` tiles of `tile` px
    (+ a global tile), each tile ``(tile / patch_size * ratio) ** 2`` ``<|patch|>`` tokens."""
    return Llama4ImageTextProcessor(tokenizer or llama4_tokenizer(), Llama4TileImageProcessor(tile, max_patches),
                                    patch_size=patch_size, pixel_shuffle_ratio=pixel_shuffle_ratio,
                                    chat_template=LLAMA4_CHAT_TEMPLATE)


LLAMA4_CONFIG_DEFAULTS: dict[str, Any] = dict(
    n_layers=4, d_model=40, n_heads=4, n_kv_heads=2, d_head=12, d_expert=24, d_mlp=36, n_experts=4, top_k=2,
    moe_layers=(1, 3), no_rope_layers=(1, 1, 1, 0), chunk=5, floor_scale=3, attn_scale=0.7, tile=16, patch_size=4,
    vision_depth=2, vision_width=24, vision_heads=2, vision_output=20)


def tiny_llama4_config(tokenizer=None, **overrides: Any) -> Llama4Config:
    """A tiny Llama 4 config whose token ids match `llama4_tokenizer`. Keywords: those of `LLAMA4_CONFIG_DEFAULTS`
    (decoder sizes, experts, MoE layers, which layers use RoPE (1) or none (0), the chunk, the temperature tuning's
    floor scale and scale, tile side, patch size, vision sizes); any other keyword is a text-config field."""
    tokenizer = tokenizer or llama4_tokenizer()
    o = {**LLAMA4_CONFIG_DEFAULTS, **{k: v for k, v in overrides.items() if k in LLAMA4_CONFIG_DEFAULTS}}
    text = dict(vocab_size=len(tokenizer), hidden_size=o["d_model"], intermediate_size=o["d_expert"],
                intermediate_size_mlp=o["d_mlp"], num_hidden_layers=o["n_layers"], num_attention_heads=o["n_heads"],
                num_key_value_heads=o["n_kv_heads"], head_dim=o["d_head"], num_local_experts=o["n_experts"],
                num_experts_per_tok=o["top_k"], moe_layers=list(o["moe_layers"]),
                no_rope_layers=list(o["no_rope_layers"]), attention_chunk_size=o["chunk"],
                floor_scale=o["floor_scale"], attn_scale=o["attn_scale"], max_position_embeddings=512,
                rope_parameters={"rope_type": "default", "rope_theta": 600.0},
                pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                bos_token_id=tokenizer.bos_token_id)
    text.update({k: v for k, v in overrides.items() if k not in LLAMA4_CONFIG_DEFAULTS})
    width = o["vision_width"]
    vision = dict(hidden_size=width, intermediate_size=4 * width, num_hidden_layers=o["vision_depth"],
                  num_attention_heads=o["vision_heads"], image_size=o["tile"], patch_size=o["patch_size"],
                  pixel_shuffle_ratio=0.5, projector_input_dim=o["vision_output"], projector_output_dim=o["vision_output"],
                  vision_output_dim=o["vision_output"], rope_parameters={"rope_type": "default", "rope_theta": 100.0})
    return Llama4Config(text_config=text, vision_config=vision,
                        image_token_index=tokenizer.convert_tokens_to_ids("<|patch|>"),
                        boi_token_index=tokenizer.convert_tokens_to_ids("<|image_start|>"),
                        eoi_token_index=tokenizer.convert_tokens_to_ids("<|image_end|>"))


def tiny_llama4_model(seed: int = 0, attn_implementation: str = "eager", dtype: torch.dtype = torch.float32,
                      tokenizer=None, **config_kwargs: Any) -> Llama4ForConditionalGeneration:
    """A randomly initialised tiny `Llama4ForConditionalGeneration` (eval mode, norms perturbed). Stops at
    ``<|eot|>``."""
    config = tiny_llama4_config(tokenizer=tokenizer, **config_kwargs)
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    model = Llama4ForConditionalGeneration(config).eval()
    if dtype != torch.float32:
        model = model.to(dtype)
        restore_vision_rotary(model)
    perturb_norms(model, seed)
    with torch.no_grad():  # HF leaves the experts' tensors unset until init: give them values
        for name, param in model.named_parameters():
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                param.normal_(0, 0.05, generator=torch.Generator().manual_seed(seed + 3))
    model.generation_config.eos_token_id = config.get_text_config().eos_token_id
    return model


def restore_vision_rotary(model: Llama4ForConditionalGeneration) -> None:
    """`Module.to(dtype)` casts the vision tower's complex rotary table to a real one (its real part): recompute
    it, as HF builds it, after any dtype change."""
    rotary = model.vision_model.rotary_embedding
    rotary.freqs_ci = rotary._compute_freqs_ci(model.config.vision_config).to(rotary.freqs_ci.device)
