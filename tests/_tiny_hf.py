"""A tiny random Qwen2.5-VL (HF) with a word-level tokenizer and the PIL image processor.

Random weights: its answers are noise, which is enough to test evaluation plumbing.
Nothing is downloaded. Images are resized to at most 56x56 pixels (4 image tokens).
"""

from __future__ import annotations

import torch
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLProcessor,
    Qwen2VLImageProcessorPil,
)

SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|image_pad|>", "<|video_pad|>",
]  # fmt: skip
WORDS = (
    [
        "[UNK]",
        "\n",
        "user",
        "assistant",
        "?",
        ".",
        "how",
        "many",
        "are",
        "there",
        "answer",
        "with",
        "a",
        "the",
    ]
    + [str(i) for i in range(21)]
    + "zero one two three four five six seven eight nine ten dots red green blue".split()
    + list("ABCD")
)
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for c in message['content'] %}{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class _ImageOnlyProcessor(Qwen2_5_VLProcessor):
    """transformers insists on a video processor, which needs torchvision; images don't."""

    def check_argument_for_proper_class(self, argument_name, argument):
        if argument_name == "video_processor" and argument is None:
            return None
        return super().check_argument_for_proper_class(argument_name, argument)


def build_tiny_processor() -> Qwen2_5_VLProcessor:
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + WORDS)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split("\n", "isolated"),
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Punctuation(),
        ]
    )
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    hf_tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token="[UNK]"
    )
    image_processor = Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=56 * 56)
    return _ImageOnlyProcessor(
        image_processor=image_processor, tokenizer=hf_tokenizer, chat_template=CHAT_TEMPLATE
    )


def build_tiny_model(processor: Qwen2_5_VLProcessor, seed: int = 0) -> Qwen2_5_VLForConditionalGeneration:
    tokenizer = processor.tokenizer
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    special = {"bos_token_id": None, "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"]}
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 256,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]},
            **special,
        },
        vision_config={
            "depth": 1,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": 32,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 56,
            "fullatt_block_indexes": [0],
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        **special,
    )
    torch.manual_seed(seed)
    return Qwen2_5_VLForConditionalGeneration(config).eval()
