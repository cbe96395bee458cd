"""Tiny random models, tokenizers and processors of every supported family, built offline, for tests,
benchmarks and docs; one module per family (`vlens.testing.qwen`, `vlens.testing.llava`, `vlens.testing.llava_next`, `vlens.testing.internvl`, `vlens.testing.idefics3`, `vlens.testing.idefics2`, `vlens.testing.glm4v`, ...), every
name re-exported here. Nothing here downloads anything: configs come from HF config classes, the
tokenizer from `tokenizers`, the image processor from its parameters (PIL backend, no torchvision).
`vlens.testing.real_vocab` is the real-vocabulary fixture (Qwen2's byte-level BPE, multi-digit
answers). The library never imports this package, except `vlens.zoo.random_tiny` (`--model
random-tiny` is the Qwen2.5-VL builder here).
"""

from vlens.testing.aya_vision import (
    AYA_CHAT_TEMPLATE,
    AYA_SPECIAL_TOKENS,
    aya_vision_tokenizer,
    tiny_aya_vision_config,
    tiny_aya_vision_model,
    tiny_aya_vision_processor,
)
from vlens.testing.common import (
    QWEN_CHAT_TEMPLATE,
    QWEN_SPECIAL_TOKENS,
    TEST_WORDS,
    TINY_WORDS,
    perturb_norms,
    random_image,
    word_level_tokenizer,
)
from vlens.testing.families import (
    TINY_FAMILIES,
    TinyFamily,
    register_tiny_family,
    tiny_families,
    tiny_family,
    tiny_parts,
    write_tiny_folder,
)
from vlens.testing.gemma3 import (
    GEMMA3_CHAT_TEMPLATE,
    GEMMA3_SPECIAL_TOKENS,
    GEMMA3_WORDS,
    gemma3_image_processor,
    gemma3_tokenizer,
    tiny_gemma3_config,
    tiny_gemma3_model,
    tiny_gemma3_processor,
)
from vlens.testing.gemma4 import (
    GEMMA4_CHAT_TEMPLATE,
    GEMMA4_SPECIAL_TOKENS,
    GEMMA4_WORDS,
    gemma4_image_processor,
    gemma4_tokenizer,
    tiny_gemma4_config,
    tiny_gemma4_model,
    tiny_gemma4_processor,
)
from vlens.testing.glm4v import (
    GLM4V_CHAT_TEMPLATE,
    GLM4V_SPECIAL_TOKENS,
    glm4v_tokenizer,
    tiny_glm4v_config,
    tiny_glm4v_model,
    tiny_glm4v_moe_config,
    tiny_glm4v_moe_model,
    tiny_glm4v_processor,
)
from vlens.testing.idefics2 import (
    IDEFICS2_CHAT_TEMPLATE,
    IDEFICS2_SPECIAL_TOKENS,
    IDEFICS2_WORDS,
    idefics2_tokenizer,
    tiny_idefics2_config,
    tiny_idefics2_model,
    tiny_idefics2_processor,
)
from vlens.testing.idefics3 import (
    IDEFICS3_CHAT_TEMPLATE,
    IDEFICS3_SPECIAL_TOKENS,
    IDEFICS3_WORDS,
    SMOLVLM_CHAT_TEMPLATE,
    SMOLVLM_SPECIAL_TOKENS,
    idefics3_tokenizer,
    tiny_idefics3_config,
    tiny_idefics3_model,
    tiny_idefics3_processor,
    tiny_smolvlm_model,
    tiny_smolvlm_processor,
)
from vlens.testing.internvl import (
    INTERNVL_CHAT_TEMPLATE,
    INTERNVL_SPECIAL_TOKENS,
    internvl_tokenizer,
    tiny_internvl_config,
    tiny_internvl_model,
    tiny_internvl_processor,
)
from vlens.testing.lfm2_vl import (
    LFM2_VL_CHAT_TEMPLATE,
    LFM2_VL_SPECIAL_TOKENS,
    lfm2_vl_tokenizer,
    tiny_lfm2_vl_config,
    tiny_lfm2_vl_model,
    tiny_lfm2_vl_processor,
)
from vlens.testing.llama4 import (
    LLAMA4_CHAT_TEMPLATE,
    LLAMA4_SPECIAL_TOKENS,
    llama4_tokenizer,
    tiny_llama4_config,
    tiny_llama4_model,
    tiny_llama4_processor,
)
from vlens.testing.llava import (
    LLAVA_CHAT_TEMPLATE,
    LLAVA_SPECIAL_TOKENS,
    LLAVA_WORDS,
    llava_tokenizer,
    tiny_llava_config,
    tiny_llava_model,
    tiny_llava_processor,
)
from vlens.testing.llava_next import (
    LLAVA_NEXT_CHAT_TEMPLATE,
    LLAVA_NEXT_SPECIAL_TOKENS,
    LLAVA_NEXT_WORDS,
    LLAVA_ONEVISION_CHAT_TEMPLATE,
    LLAVA_ONEVISION_SPECIAL_TOKENS,
    default_pinpoints,
    llava_next_tokenizer,
    llava_onevision_tokenizer,
    tiny_llava_next_config,
    tiny_llava_next_model,
    tiny_llava_next_processor,
    tiny_llava_onevision_config,
    tiny_llava_onevision_model,
    tiny_llava_onevision_processor,
)
from vlens.testing.llava_next_video import (
    LLAVA_NEXT_VIDEO_CHAT_TEMPLATE,
    llava_next_video_tokenizer,
    tiny_llava_next_video_config,
    tiny_llava_next_video_model,
    tiny_llava_next_video_processor,
)
from vlens.testing.mistral3 import (
    MISTRAL3_CHAT_TEMPLATE,
    MISTRAL3_SPECIAL_TOKENS,
    mistral3_tokenizer,
    tiny_mistral3_config,
    tiny_mistral3_model,
    tiny_mistral3_processor,
)
from vlens.testing.molmo2 import (
    MOLMO2_CHAT_TEMPLATE,
    MOLMO2_SPECIAL_TOKENS,
    molmo2_tokenizer,
    tiny_molmo2_config,
    tiny_molmo2_model,
    tiny_molmo2_processor,
)
from vlens.testing.paligemma import (
    PALIGEMMA_SPECIAL_TOKENS,
    PALIGEMMA_WORDS,
    paligemma_tokenizer,
    tiny_paligemma_config,
    tiny_paligemma_model,
    tiny_paligemma_processor,
)
from vlens.testing.phi4_multimodal import (
    PHI4_MULTIMODAL_CHAT_TEMPLATE,
    PHI4_MULTIMODAL_SPECIAL_TOKENS,
    phi4_multimodal_tokenizer,
    tiny_phi4_multimodal_config,
    tiny_phi4_multimodal_model,
    tiny_phi4_multimodal_processor,
)
from vlens.testing.qwen import (
    default_mrope_section,
    qwen3_vl_image_processor,
    qwen_image_processor,
    tiny_hf_model,
    tiny_qwen3_vl_config,
    tiny_qwen3_vl_model,
    tiny_qwen3_vl_processor,
    tiny_qwen_config,
    tiny_qwen_processor,
)
from vlens.testing.qwen3_5 import tiny_qwen3_5_config, tiny_qwen3_5_model
from vlens.testing.qwen3_5_moe import tiny_qwen3_5_moe_config, tiny_qwen3_5_moe_model
from vlens.testing.qwen3_vl_moe import tiny_qwen3_vl_moe_config, tiny_qwen3_vl_moe_model

__all__ = [
    "TINY_FAMILIES", "TinyFamily", "register_tiny_family", "tiny_families", "tiny_family", "tiny_parts",
    "write_tiny_folder",
    "LLAVA_NEXT_CHAT_TEMPLATE", "LLAVA_NEXT_SPECIAL_TOKENS", "LLAVA_NEXT_WORDS", "LLAVA_ONEVISION_CHAT_TEMPLATE",
    "LLAVA_ONEVISION_SPECIAL_TOKENS", "default_pinpoints", "llava_next_tokenizer", "llava_onevision_tokenizer",
    "tiny_llava_next_config", "tiny_llava_next_model", "tiny_llava_next_processor", "tiny_llava_onevision_config",
    "tiny_llava_onevision_model", "tiny_llava_onevision_processor",
    "LLAVA_NEXT_VIDEO_CHAT_TEMPLATE", "llava_next_video_tokenizer", "tiny_llava_next_video_config",
    "tiny_llava_next_video_model", "tiny_llava_next_video_processor",
    "GEMMA3_CHAT_TEMPLATE", "GEMMA3_SPECIAL_TOKENS", "GEMMA3_WORDS", "gemma3_image_processor", "gemma3_tokenizer",
    "tiny_gemma3_config", "tiny_gemma3_model", "tiny_gemma3_processor",
    "GEMMA4_CHAT_TEMPLATE", "GEMMA4_SPECIAL_TOKENS", "GEMMA4_WORDS", "gemma4_image_processor", "gemma4_tokenizer",
    "tiny_gemma4_config", "tiny_gemma4_model", "tiny_gemma4_processor",
    "LLAVA_CHAT_TEMPLATE", "LLAVA_SPECIAL_TOKENS", "LLAVA_WORDS", "QWEN_CHAT_TEMPLATE", "QWEN_SPECIAL_TOKENS",
    "TEST_WORDS", "TINY_WORDS", "default_mrope_section", "llava_tokenizer", "perturb_norms", "qwen3_vl_image_processor",
    "qwen_image_processor", "random_image", "tiny_hf_model", "tiny_llava_config", "tiny_llava_model",
    "tiny_llava_processor", "tiny_qwen3_vl_config", "tiny_qwen3_vl_model", "tiny_qwen3_vl_processor",
    "tiny_qwen_config", "tiny_qwen_processor", "word_level_tokenizer",
    "tiny_qwen3_5_config", "tiny_qwen3_5_model", "tiny_qwen3_5_moe_config", "tiny_qwen3_5_moe_model",
    "tiny_qwen3_vl_moe_config", "tiny_qwen3_vl_moe_model",
    "INTERNVL_CHAT_TEMPLATE", "INTERNVL_SPECIAL_TOKENS", "internvl_tokenizer", "tiny_internvl_config",
    "tiny_internvl_model", "tiny_internvl_processor",
    "IDEFICS3_CHAT_TEMPLATE", "IDEFICS3_SPECIAL_TOKENS", "IDEFICS3_WORDS", "SMOLVLM_CHAT_TEMPLATE",
    "SMOLVLM_SPECIAL_TOKENS", "idefics3_tokenizer", "tiny_idefics3_config", "tiny_idefics3_model",
    "tiny_idefics3_processor", "tiny_smolvlm_model", "tiny_smolvlm_processor",
    "IDEFICS2_CHAT_TEMPLATE", "IDEFICS2_SPECIAL_TOKENS", "IDEFICS2_WORDS", "idefics2_tokenizer",
    "tiny_idefics2_config", "tiny_idefics2_model", "tiny_idefics2_processor",
    "GLM4V_CHAT_TEMPLATE", "GLM4V_SPECIAL_TOKENS", "glm4v_tokenizer", "tiny_glm4v_config", "tiny_glm4v_model",
    "tiny_glm4v_processor", "tiny_glm4v_moe_config", "tiny_glm4v_moe_model",
    "PALIGEMMA_SPECIAL_TOKENS", "PALIGEMMA_WORDS", "paligemma_tokenizer", "tiny_paligemma_config",
    "tiny_paligemma_model", "tiny_paligemma_processor",
    "MISTRAL3_CHAT_TEMPLATE", "MISTRAL3_SPECIAL_TOKENS", "mistral3_tokenizer", "tiny_mistral3_config",
    "tiny_mistral3_model", "tiny_mistral3_processor",
    "LFM2_VL_CHAT_TEMPLATE", "LFM2_VL_SPECIAL_TOKENS", "lfm2_vl_tokenizer", "tiny_lfm2_vl_config",
    "tiny_lfm2_vl_model", "tiny_lfm2_vl_processor",
    "AYA_CHAT_TEMPLATE", "AYA_SPECIAL_TOKENS", "aya_vision_tokenizer", "tiny_aya_vision_config",
    "tiny_aya_vision_model", "tiny_aya_vision_processor",
    "MOLMO2_CHAT_TEMPLATE", "MOLMO2_SPECIAL_TOKENS", "molmo2_tokenizer", "tiny_molmo2_config", "tiny_molmo2_model",
    "tiny_molmo2_processor",
    "LLAMA4_CHAT_TEMPLATE", "LLAMA4_SPECIAL_TOKENS", "llama4_tokenizer", "tiny_llama4_config", "tiny_llama4_model",
    "tiny_llama4_processor",
    "PHI4_MULTIMODAL_CHAT_TEMPLATE", "PHI4_MULTIMODAL_SPECIAL_TOKENS", "phi4_multimodal_tokenizer",
    "tiny_phi4_multimodal_config", "tiny_phi4_multimodal_model", "tiny_phi4_multimodal_processor",
]
