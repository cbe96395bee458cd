"""Tiny random Qwen3.5 models (hybrid Gated DeltaNet + gated attention decoder), offline.

The processor is Qwen3-VL's (`tiny_qwen3_vl_processor`: 16 px patches, Qwen's chat format).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

from vlens.testing.common import QWEN_SPECIAL_TOKENS, finish_tiny_model, word_level_tokenizer
from vlens.testing.qwen import default_mrope_section


def hybrid_layer_types(n_layers: int, full_every: int = 2) -> list[str]:
    """Qwen3.5's layout: every `full_every`-th layer full attention, the others linear attention."""
    return ["full_attention" if (layer + 1) % full_every == 0 else "linear_attention" for layer in range(n_layers)]


def qwen3_5_text_config(tokenizer=None, vocab_size: int | None = None, n_layers: int = 3, d_model: int = 48,
                        n_heads: int = 3, n_kv_heads: int = 1, d_head: int = 16, d_mlp: int = 56,
                        layer_types: list[str] | None = None, linear_heads: int = 4, linear_key_heads: int = 2,
                        linear_d_head: int = 12, linear_d_key: int = 10, conv_kernel: int = 3,
                        partial_rotary_factor: float = 0.5, mrope_section: list[int] | None = None,
                        attention_bias: bool = False, **overrides: Any) -> dict:
    """The text half of a tiny Qwen3.5 config (dict), special-token ids matching `word_level_tokenizer`.

    Head shapes of the two layer kinds are independent: full attention n_heads x d_head (GQA over
    n_kv_heads), linear attention linear_heads value heads of linear_d_head over linear_key_heads
    query/key heads of linear_d_key. Default layout: linear, full, linear.
    """
    tokenizer = tokenizer or word_level_tokenizer()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS}
    rotary_dim = int(d_head * partial_rotary_factor)
    section = mrope_section or default_mrope_section(rotary_dim)
    text = dict(vocab_size=vocab_size or len(tokenizer), hidden_size=d_model, intermediate_size=d_mlp,
                num_hidden_layers=n_layers, num_attention_heads=n_heads, num_key_value_heads=n_kv_heads,
                head_dim=d_head, max_position_embeddings=2048, rms_norm_eps=1e-6, attention_bias=attention_bias,
                layer_types=layer_types or hybrid_layer_types(n_layers), linear_num_value_heads=linear_heads,
                linear_num_key_heads=linear_key_heads, linear_value_head_dim=linear_d_head,
                linear_key_head_dim=linear_d_key, linear_conv_kernel_dim=conv_kernel,
                pad_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section,
                                 "partial_rotary_factor": partial_rotary_factor, "mrope_interleaved": True})
    text.update(overrides)
    return text


def qwen3_5_vision_config(d_model: int, vision_depth: int = 2, vision_width: int = 32, vision_heads: int = 2,
                          num_position_embeddings: int = 16) -> dict:
    """A tiny Qwen3.5 vision tower (16 px patches, 2x2 merge) writing d_model-sized image tokens."""
    return dict(depth=vision_depth, hidden_size=vision_width, intermediate_size=2 * vision_width,
                num_heads=vision_heads, patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                out_hidden_size=d_model, num_position_embeddings=num_position_embeddings, in_channels=3)


def special_token_ids(tokenizer=None) -> dict:
    """The multimodal token ids of the tiny tokenizer, as the config's keyword arguments."""
    tokenizer = tokenizer or word_level_tokenizer()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS}
    return dict(image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])


def tiny_qwen3_5_config(vision_depth: int = 2, vision_width: int = 32, vision_heads: int = 2, tokenizer=None,
                        **text_kwargs: Any) -> Qwen3_5Config:
    """A tiny Qwen3.5 config (keywords of `qwen3_5_text_config` for the decoder)."""
    text = qwen3_5_text_config(tokenizer=tokenizer, **text_kwargs)
    vision = qwen3_5_vision_config(text["hidden_size"], vision_depth, vision_width, vision_heads)
    return Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False,
                         **special_token_ids(tokenizer))


def enliven_linear_attention(model: torch.nn.Module, seed: int) -> None:
    """HF's init gives Gated DeltaNet layers decays exp(g) of about e^-15 (A up to 16: no memory past one
    token) and projections of std 0.02 (outputs far below the residual's size). Redraw them so the
    recurrent state carries several tokens (A in [0.05, 0.6], dt_bias near -1), beta and g vary by
    token, and the layer writes outputs of the residual's size: tests then see every part of it."""
    generator = torch.Generator().manual_seed(seed + 11)

    def randn(shape, std: float) -> torch.Tensor:
        return std * torch.randn(shape, generator=generator)

    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".linear_attn." not in name:
                continue
            if name.endswith("A_log"):
                param.copy_(torch.empty(param.shape).uniform_(0.05, 0.6, generator=generator).log())
            elif name.endswith("dt_bias"):
                param.copy_(-1.0 + randn(param.shape, 0.3))
            elif name.endswith(("in_proj_a.weight", "in_proj_b.weight")):
                param.copy_(randn(param.shape, 1.0 / param.shape[1] ** 0.5))
            elif name.endswith(("in_proj_qkv.weight", "in_proj_z.weight", "out_proj.weight")):
                param.copy_(randn(param.shape, 1.0 / param.shape[1] ** 0.5))
            elif name.endswith("conv1d.weight"):
                param.copy_(randn(param.shape, 1.0 / param.shape[-1] ** 0.5))


def finish_tiny(model, seed: int):
    """Eval mode, EOS, perturbed norms (zero-centred norm weights start at 0; DeltaNet's gate norm at 1)
    and linear-attention layers with memory (`enliven_linear_attention`)."""
    finish_tiny_model(model, seed)
    enliven_linear_attention(model, seed)
    return model


def tiny_qwen3_5_model(seed: int = 0, attn_implementation: str = "eager", dtype: torch.dtype = torch.float32,
                       **config_kwargs: Any) -> Qwen3_5ForConditionalGeneration:
    """A randomly initialised tiny `Qwen3_5ForConditionalGeneration` (eval mode, norms perturbed)."""
    config = tiny_qwen3_5_config(**config_kwargs)
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    return finish_tiny(Qwen3_5ForConditionalGeneration(config).to(dtype), seed)  # type: ignore[arg-type]
