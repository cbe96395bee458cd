"""Every command runs on a saved random folder of each built-in family (tests/helpers/family_commands.py)."""

from __future__ import annotations

import pytest

from tests.helpers.family_commands import (
    counting_folder,
    run_every_command,
    run_expert_commands,
    save_family_folder,
)
from vlens import testing
from vlens.cli import main

# family -> (HF model, processor, flags that size the images, whether `temperature export` applies)
FAMILIES = {
    "qwen2_vl": (lambda: testing.tiny_hf_model("qwen2_vl", seed=1, n_layers=2, d_model=48, n_heads=3, n_kv_heads=1),
                 testing.tiny_qwen_processor, ["--image-size", "56"], True),
    "qwen2_5_vl": (lambda: testing.tiny_hf_model("qwen2_5_vl", seed=2, n_layers=3, d_model=40, n_heads=5, n_kv_heads=1),
                   testing.tiny_qwen_processor, ["--image-size", "56"], True),
    "qwen3_vl": (lambda: testing.tiny_qwen3_vl_model(seed=3, n_layers=2, n_heads=6, n_kv_heads=2, d_head=8),
                 testing.tiny_qwen3_vl_processor, ["--image-size", "64"], False),
    "llava": (lambda: testing.tiny_llava_model(seed=4, n_layers=2, d_model=48, n_heads=6, n_kv_heads=3),
              testing.tiny_llava_processor, [], True),
    "qwen3_vl_moe": (lambda: testing.tiny_qwen3_vl_moe_model(seed=5, n_layers=2, n_heads=3, n_kv_heads=1, d_head=8,
                                                               n_experts=4, top_k=2, d_expert=12),
                     testing.tiny_qwen3_vl_processor, ["--image-size", "64"], False),
    # hybrid decoders: linear-attention layers have 4 heads, full attention 2 (and 3)
    "qwen3_5": (lambda: testing.tiny_qwen3_5_model(seed=6, n_layers=3, n_heads=2, n_kv_heads=1, d_head=8,
                                                     linear_heads=4, linear_key_heads=2, linear_d_head=6,
                                                     linear_d_key=6),
                testing.tiny_qwen3_vl_processor, ["--image-size", "64"], False),
    "qwen3_5_moe": (lambda: testing.tiny_qwen3_5_moe_model(seed=7, n_layers=2, n_heads=3, n_kv_heads=1, d_head=8,
                                                             linear_heads=2, linear_key_heads=1, linear_d_head=8,
                                                             linear_d_key=6, n_experts=4, top_k=2, d_expert=10),
                    testing.tiny_qwen3_vl_processor, ["--image-size", "64"], False),
    # anyres: tiles of 28 px (2x2 tokens); --image-size 56 keeps the pinpoints up to 56 x 56 (at most 2x2 tiles)
    "llava_next": (lambda: testing.tiny_llava_next_model(seed=5, n_layers=2, d_model=48, n_heads=6, n_kv_heads=2,
                                                         tile=28, patch_size=14),
                   lambda: testing.tiny_llava_next_processor(tile=28, patch_size=14), ["--image-size", "56"], True),
    "llava_onevision": (lambda: testing.tiny_llava_onevision_model(seed=6, n_layers=2, d_model=40, n_heads=5,
                                                                   n_kv_heads=1, tile=28, patch_size=14,
                                                                   vision_aspect_ratio="anyres_max_2"),
                        lambda: testing.tiny_llava_onevision_processor(tile=28, patch_size=14,
                                                                       vision_aspect_ratio="anyres_max_2"),
                        ["--image-size", "56"], True),
    # dynamic tiles of 28 px (2x2 tokens); --image-size 56 allows (56 // 28)^2 = 4 tiles + the thumbnail
    "internvl": (lambda: testing.tiny_internvl_model(seed=8, n_layers=2, d_model=40, n_heads=5, n_kv_heads=1, tile=28,
                                                     patch_size=7),
                 lambda: testing.tiny_internvl_processor(tile=28, patch_size=7), ["--image-size", "56"], True),
    # split images: --image-size 56 resizes to 56 px on the longest edge, then 28 px sub-images + the global image
    "idefics3": (lambda: testing.tiny_idefics3_model(seed=9, n_layers=2, d_model=48, n_heads=4, n_kv_heads=2,
                                                     sub_image=28, patch_size=7),
                 lambda: testing.tiny_idefics3_processor(sub_image=28, patch_size=7), ["--image-size", "56"], True),
    "smolvlm": (lambda: testing.tiny_smolvlm_model(seed=10, n_layers=2, d_model=36, n_heads=3, n_kv_heads=1,
                                                   sub_image=28, patch_size=7),
                lambda: testing.tiny_smolvlm_processor(sub_image=28, patch_size=7), ["--image-size", "56"], True),
    # fixed-size images (the processor resizes every image to the tower's 32 px); the query norm refuses export
    "gemma3": (lambda: testing.tiny_gemma3_model(seed=5, n_layers=3, d_model=40, n_heads=5, n_kv_heads=1, d_head=8,
                                                sliding_window=4),
               testing.tiny_gemma3_processor, [], False),
    # fixed-size images (28 px, 4x4 patches); prompts are one bidirectional prefix
    "paligemma": (lambda: testing.tiny_paligemma_model(seed=11, n_layers=2, d_model=40, n_heads=4, n_kv_heads=2,
                                                       d_head=10),
                  testing.tiny_paligemma_processor, [], True),
    # frames of at most 56 px on the longest edge, split into 4 crops + the whole image, 5 perceiver latents each
    "idefics2": (lambda: testing.tiny_idefics2_model(seed=12, n_layers=2, d_model=40, n_heads=4, n_kv_heads=2,
                                                     patch_size=7, image_size=56),
                 lambda: testing.tiny_idefics2_processor(shortest_edge=28, longest_edge=56, split=True),
                 ["--image-size", "56"], True),
    # 48 px images (a multiple of 6 px patches x 2 x 2 merge): 4x4 tokens
    "glm4v": (lambda: testing.tiny_glm4v_model(seed=13, n_layers=2, d_model=48, n_heads=3, n_kv_heads=1),
              testing.tiny_glm4v_processor, ["--image-size", "48"], True),
    "glm4v_moe": (lambda: testing.tiny_glm4v_moe_model(seed=14, n_layers=2, d_model=48, n_heads=3, n_kv_heads=1,
                                                       n_experts=4, top_k=2, d_expert=12, n_group=2, topk_group=1),
                  testing.tiny_glm4v_processor, ["--image-size", "48"], True),
    # Pixtral: --image-size 40 bounds the longest edge (48 px by default), 4 px patches merged 2x2, [IMG_BREAK] / [IMG_END] markers
    "mistral3": (lambda: testing.tiny_mistral3_model(seed=12, n_layers=2, d_model=40, n_heads=4, n_kv_heads=2,
                                                     d_head=10),
                 testing.tiny_mistral3_processor, ["--image-size", "40"], True),
    # attention, a short convolution, attention; --image-size 32: at most 16 tokens whole, 4 tiles of 16 px
    "lfm2_vl": (lambda: testing.tiny_lfm2_vl_model(seed=15, n_layers=3, d_model=40, n_heads=4, n_kv_heads=2),
                testing.tiny_lfm2_vl_processor, ["--image-size", "32"], False),
    # Cohere2 decoder (parallel attention + MLP, a sliding RoPE layer then a global NoPE one, logit scale);
    # SigLIP on 24 px tiles of 3 px patches shuffled 2x2, up to 4 tiles + a thumbnail, tag tokens as markers
    "aya_vision": (lambda: testing.tiny_aya_vision_model(seed=13, n_layers=2, d_model=40, n_heads=4, n_kv_heads=2),
                   testing.tiny_aya_vision_processor, ["--image-size", "48"], True),
    # 16 px crops overlapping by a 4 px patch, pooled 2 x 2; --image-size 32 allows (32 // 16)^2 = 4 crops
    "molmo2": (lambda: testing.tiny_molmo2_model(seed=16, n_layers=2, d_model=40, n_heads=4, n_kv_heads=2),
               testing.tiny_molmo2_processor, ["--image-size", "32"], False),
    # per-layer embeddings, sliding (12-d heads) and full (20-d heads) layers, images pooled 2x2 from 4 px patches
    "gemma4": (lambda: testing.tiny_gemma4_model(seed=16, n_layers=3, d_model=40, n_heads=4, n_kv_heads=2),
               testing.tiny_gemma4_processor, ["--image-size", "48"], False),
    # MoE on layers 1 and 3 (sigmoid top-2 of 4, shared expert), chunked RoPE layers with the q / k norm, a NoPE
    # layer with temperature tuning; 16 px tiles of 4 px patches, up to 4 tiles + a global tile
    "llama4": (lambda: testing.tiny_llama4_model(seed=16), testing.tiny_llama4_processor, ["--image-size", "32"],
               False),
    # fused qkv / gate-up projections, partial rotary; 16 px crops of 4 px patches pooled 2 x 2, at most 4 crops +
    # the global view; vlens's LoRA refuses the fused qkv_proj (temperature export folds into its query rows)
    "phi4_multimodal": (lambda: testing.tiny_phi4_multimodal_model(seed=17), testing.tiny_phi4_multimodal_processor,
                        ["--image-size", "32"], True),
}
# families whose blocks run attention and MLP in parallel, or add more than attention and MLP to the residual
# (Gemma 4's per-layer-embedding sublayer and layer scalar): `circuit` refuses them (exit status 2)
PARALLEL_BLOCKS = {"aya_vision", "gemma4"}

# families whose LoRA training is refused (a fused qkv projection): `train` exits 2
LORA_REFUSED = {"phi4_multimodal"}

# families whose every attention layer normalizes its queries: `temperature export` refuses them
QUERY_NORM_REFUSES_EXPORT = {"qwen3_vl", "qwen3_vl_moe", "gemma3", "gemma4", "llama4"}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return counting_folder(tmp_path_factory.mktemp("data"))


@pytest.mark.parametrize("family", FAMILIES)
def test_every_command_on_a_saved_folder(family, tmp_path, data, capsys):
    build, processor, image_args, export = FAMILIES[family]
    hf = build()
    folder = save_family_folder(hf, processor(), tmp_path / family)
    cfg = hf.config.get_text_config()
    linear = [t == "linear_attention" for t in getattr(cfg, "layer_types", None) or []]
    heads = [cfg.linear_num_value_heads if is_linear else cfg.num_attention_heads
             for is_linear in (linear or [False] * cfg.num_hidden_layers)]
    out = tmp_path / "out"
    run_every_command(folder, out, data, image_args, n_layers=cfg.num_hidden_layers,
                      n_heads=max(heads), export=export, n_heads_total=sum(heads),
                      circuit=family not in PARALLEL_BLOCKS, train=family not in LORA_REFUSED)
    n_experts = getattr(cfg, "num_experts", 0) or getattr(cfg, "n_routed_experts", 0) or \
        getattr(cfg, "num_local_experts", 0)  # GLM-4.5V's and Llama 4's names
    if n_experts:  # the mixture-of-experts commands
        done = run_expert_commands(folder, tmp_path / "out", image_args)
        n_layers = cfg.num_hidden_layers
        assert len(done["routing"]["share"]["image"][0]) == n_experts
        ranked = done["ablate --unit expert"]["results"]["counting"]["ranked_heads"]
        assert done["ablate --unit expert"]["results"]["counting"]["unit"] == "expert" and "expert" in ranked[0]
        assert len(done["patch --mode layer-expert"]["experts"]) == n_experts
        assert len(done["patch --mode layer-expert"]["layers"]) <= n_layers
    if family in QUERY_NORM_REFUSES_EXPORT:  # a query norm would undo a scaled q_proj: one line, exit 2, nothing written
        capsys.readouterr()
        code = main(["temperature", "export", "--model", folder, "--temps", str(out / "fit"),
                     "--out", str(out / "export")])
        assert code == 2 and "query norm" in capsys.readouterr().err
        assert not (out / "export").exists()


@pytest.mark.parametrize("family", ["llava_next", "llava_onevision"])
def test_anyres_folder_loads_in_bfloat16_and_runs(family, tmp_path, data):
    """--dtype bfloat16 on a saved folder: the model loads in bf16 (tower, projector, newline, decoder) and
    the commands run; the logits stay close to the fp32 model's (and in fp16)."""
    import torch

    from tests.helpers.family_commands import results, run
    from vlens import HookedVLM

    build, processor, image_args, _ = FAMILIES[family]
    folder = save_family_folder(build(), processor(), tmp_path / family)
    run(["eval", "--model", folder, "--dtype", "bfloat16", "--device", "cpu", "--data", str(data), "--limit", "2",
         "--max-new-tokens", "2", "--out", str(tmp_path / "eval")])
    assert results(tmp_path / "eval")["metrics"]["n"] == 2
    run(["logit-lens", "--model", folder, "--dtype", "bfloat16", "--device", "cpu", "--data", str(data),
         "--out", str(tmp_path / "lens")])
    half = HookedVLM.from_pretrained(folder, device="cpu", dtype=torch.bfloat16)
    full = HookedVLM.from_pretrained(folder, device="cpu", dtype=torch.float32)
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    assert half.vision.image_newline.dtype == torch.bfloat16
    from vlens.testing import random_image

    images, prompt = [random_image(56, 40, 1)], "How many dots are there?"
    with torch.no_grad():
        low = half(half.prepare(images=images, prompts=[prompt])).float()
        high = full(full.prepare(images=images, prompts=[prompt]))
    assert torch.isfinite(low).all()
    assert (low - high).abs().max() < 0.1 * high.abs().max()
    fp16 = HookedVLM.from_pretrained(folder, device="cpu", dtype="float16")
    with torch.no_grad():
        logits = fp16(fp16.prepare(images=images, prompts=[prompt])).float()
    assert fp16.cfg.dtype == torch.float16 and (logits - high).abs().max() < 0.05 * high.abs().max()


@pytest.mark.parametrize("family", ["internvl", "idefics3", "smolvlm", "idefics2"])
def test_split_image_folder_loads_in_half_precision_and_runs(family, tmp_path, data):
    """--dtype bfloat16 on a saved folder: the model loads in bf16 (tower, projector, decoder) and the commands
    run; the logits stay close to the fp32 model's (and in fp16)."""
    import torch

    from tests.helpers.family_commands import results, run
    from vlens import HookedVLM
    from vlens.testing import random_image

    build, processor, image_args, _ = FAMILIES[family]
    folder = save_family_folder(build(), processor(), tmp_path / family)
    run(["eval", "--model", folder, "--dtype", "bfloat16", "--device", "cpu", "--data", str(data), "--limit", "2",
         "--max-new-tokens", "2", *image_args, "--out", str(tmp_path / "eval")])
    assert results(tmp_path / "eval")["metrics"]["n"] == 2
    full = HookedVLM.from_pretrained(folder, device="cpu", dtype=torch.float32)
    images, prompt = [random_image(70, 40, 1)], "How many dots are there?"
    with torch.no_grad():
        high = full(full.prepare(images=images, prompts=[prompt]))
    for dtype, tolerance in ((torch.bfloat16, 0.1), (torch.float16, 0.05)):
        half = HookedVLM.from_pretrained(folder, device="cpu", dtype=dtype)
        assert {p.dtype for p in half.parameters()} == {dtype} and half.cfg.dtype == dtype
        with torch.no_grad():
            low = half(half.prepare(images=images, prompts=[prompt])).float()
        assert torch.isfinite(low).all()
        assert (low - high).abs().max() < tolerance * high.abs().max()
