"""Tiny models for the HeadLens tests: one per supported architecture, and a planted "3" head."""

from __future__ import annotations

import functools

import torch

from tests.helpers.models import tiny_vlm
from vlens import HookedVLM
from vlens.testing import random_image, tiny_hf_model, tiny_qwen_processor


def _qwen(family: str) -> HookedVLM:
    return tiny_vlm(family, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2)


# HF class name -> builder of a tiny HookedVLM of that architecture
BUILDERS = {
    "Qwen2VLForConditionalGeneration": lambda: _qwen("qwen2_vl"),
    "Qwen2_5_VLForConditionalGeneration": lambda: _qwen("qwen2_5_vl"),
    "Qwen3VLForConditionalGeneration": lambda: tiny_vlm("qwen3_vl"),
    "LlavaForConditionalGeneration": lambda: tiny_vlm("llava", attention_bias=True),
    "Qwen3VLMoeForConditionalGeneration": lambda: tiny_vlm("qwen3_vl_moe", n_layers=2),
    "Qwen3_5ForConditionalGeneration": lambda: tiny_vlm("qwen3_5"),
    "Qwen3_5MoeForConditionalGeneration": lambda: tiny_vlm("qwen3_5_moe"),
    "LlavaNextForConditionalGeneration": lambda: tiny_vlm("llava_next", d_model=48, n_heads=3, n_kv_heads=1),
    "LlavaOnevisionForConditionalGeneration": lambda: tiny_vlm("llava_onevision", n_heads=4, n_kv_heads=2),
    "Gemma3ForConditionalGeneration": lambda: tiny_vlm("gemma3", attention_bias=True),
    "Gemma4ForConditionalGeneration": lambda: tiny_vlm("gemma4", attention_bias=True),
    # 24 px tiles / sub-images: 4x4 patches of 6 px (6x6 of 4 px for SmolVLM) -> 2x2 tokens after pixel shuffle
    "InternVLForConditionalGeneration": lambda: tiny_vlm("internvl", text_model="llama", d_model=40, n_heads=5,
                                                         n_kv_heads=1, tile=24, patch_size=6, attention_bias=True),
    "Idefics3ForConditionalGeneration": lambda: tiny_vlm("idefics3", d_model=36, n_heads=3, n_kv_heads=1,
                                                         sub_image=24, patch_size=6),
    "PaliGemmaForConditionalGeneration": lambda: tiny_vlm("paligemma", attention_bias=True),
    "Idefics2ForConditionalGeneration": lambda: tiny_vlm("idefics2", d_model=36, n_heads=3, n_kv_heads=1),
    "Glm4vForConditionalGeneration": lambda: tiny_vlm("glm4v", d_model=48, n_heads=3, n_kv_heads=1),
    "Glm4vMoeForConditionalGeneration": lambda: tiny_vlm("glm4v_moe", d_model=48, n_heads=3, n_kv_heads=1),
    "Mistral3ForConditionalGeneration": lambda: tiny_vlm("mistral3", sliding_window=7),
    "Lfm2VlForConditionalGeneration": lambda: tiny_vlm("lfm2_vl", n_layers=2, full_attn_idxs=(0,)),
    "AyaVisionForConditionalGeneration": lambda: tiny_vlm("aya_vision", d_model=40, n_heads=4, n_kv_heads=2),
    "Molmo2ForConditionalGeneration": lambda: tiny_vlm("molmo2", d_model=36, n_heads=3, n_kv_heads=1),
    "Llama4ForConditionalGeneration": lambda: tiny_vlm("llama4"),
    "LlavaNextVideoForConditionalGeneration": lambda: tiny_vlm("llava_next_video"),
    "Phi4MultimodalForCausalLM": lambda: tiny_vlm("phi4_multimodal"),
    "SmolVLMForConditionalGeneration": lambda: tiny_vlm("smolvlm", d_model=40, n_heads=4, n_kv_heads=2,
                                                        sub_image=24, patch_size=4, scale_factor=3),
}


@functools.lru_cache(maxsize=8)
def tiny_model(architecture: str) -> HookedVLM:
    return BUILDERS[architecture]()


def two_image_batch(model):
    """A left-padded batch: two images of different sizes, prompts of different lengths."""
    return model.prepare(images=[random_image(56, 56, 1), random_image(64, 48, 2)],
                         prompts=["How many dots are there?", "red"])


PLANTED_LAYER, PLANTED_HEAD = 1, 2


@functools.lru_cache(maxsize=1)
def planted_three_model() -> HookedVLM:
    """A tiny Qwen2.5-VL whose head L1H2 writes exactly the unembedding direction of "3".

    Number tokens share a common "number" direction in the unembedding (as trained models'
    do), so the numbers that stand nearest "3" are the other numbers. The head's value is a
    constant (zero value weights, value bias e_0), so its output z is e_0 at every position
    whatever it attends to; W_O maps e_0 to ALPHA * W_U[:, "3"].
    """
    hf = tiny_hf_model("qwen2_5_vl", n_layers=2, d_model=64, n_heads=4, n_kv_heads=4, seed=3)
    model = HookedVLM.from_hf(hf, processor=tiny_qwen_processor())
    tokenizer = model.tokenizer
    numbers = [tokenizer.convert_tokens_to_ids(str(i)) for i in range(11)]
    three = tokenizer.convert_tokens_to_ids("3")
    d_head = model.cfg.d_head
    attn = model.blocks[PLANTED_LAYER].attn
    rows = slice(PLANTED_HEAD * d_head, (PLANTED_HEAD + 1) * d_head)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        lm_head = model.unembed.lm_head.weight  # [d_vocab, d_model]
        shared = torch.randn(model.cfg.d_model, generator=generator)
        lm_head[numbers] += 0.3 * shared / shared.norm()
        attn.v_proj.weight[rows] = 0
        attn.v_proj.bias[rows] = 0
        attn.v_proj.bias[rows.start] = 1.0
        attn.o_proj.weight[:, rows] = 0
        attn.o_proj.weight[:, rows.start] = 40.0 * lm_head[three]
    return model
