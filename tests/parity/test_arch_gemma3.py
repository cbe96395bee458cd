"""Gemma 3 in HookedVLM: the parity matrix against HF eager on several tiny shapes, plus what is Gemma's own:
the bidirectional image blocks, sliding-window layers (in prefill and in the KV cache), the sandwich norms,
the SigLIP tower and pooled projector, pan-and-scan crops, token types."""

from __future__ import annotations

import functools

import pytest
import torch

from tests.helpers.arch_parity import (
    assert_generate_matches_hf,
    assert_hook_shapes,
    assert_hook_z_edit_matches_hf,
    assert_logits_match,
    assert_no_hooks_left_after_exception,
    assert_saved_checkpoint_loads,
    assert_scores_edit_matches_scaling_q,
    assert_vision_head_and_projector_edits_match_hf,
    hf_logits,
    input_matrix,
)
from vlens.testing import random_image

torch.set_num_threads(1)

# head counts, GQA ratios, head sizes (not d_model / n_heads), windows shorter than the prompt (and than an
# image's block), layer patterns (2 local : 1 global, global first, no global layer), query scalars, biases,
# pooled grids (4x4 patches -> 2x2 tokens, 6x6 -> 3x3), a vocabulary larger than the tokenizer's, linear rope
# scaling on the global layers
SHAPES = {
    "gqa2_window6_local_local_global": dict(),
    "mqa_window3_global_first_bias_3x3": dict(
        n_layers=4, d_model=40, n_heads=5, n_kv_heads=1, d_head=8, sliding_window=3, query_pre_attn_scalar=8,
        layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
        attention_bias=True, tokens_per_image=9, image_size=48, vision_heads=4, vision_depth=3, vocab_size=90,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 50.0},  # Gemma 3 4B's scaling
                         "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000.0}}),
    "mha_all_local_window11": dict(
        n_layers=2, d_model=36, n_heads=2, n_kv_heads=2, d_head=24, sliding_window=11, query_pre_attn_scalar=30,
        layer_types=["sliding_attention", "sliding_attention"], rope_local_theta=30.0),
}
IMAGE_SIZES = [(40, 60), (96, 64), (32, 48), (64, 64), (50, 50), (64, 96)]


def _processor(shape: str, **kwargs):
    from vlens.testing import tiny_gemma3_processor

    kw = SHAPES[shape]
    return tiny_gemma3_processor(image_size=kw.get("image_size", 32), tokens_per_image=kw.get("tokens_per_image", 4),
                                 **kwargs)


@functools.lru_cache(maxsize=4)
def _pair(shape: str):
    from vlens import HookedVLM
    from vlens.testing import tiny_gemma3_model

    hf = tiny_gemma3_model(seed=len(shape), **SHAPES[shape])
    return hf, HookedVLM.from_hf(hf, processor=_processor(shape))


@functools.lru_cache(maxsize=4)
def _cases(shape: str) -> dict:
    _, model = _pair(shape)
    return input_matrix(model, IMAGE_SIZES)


def _pan_and_scan(model, shape: str):
    """Two rows: a wide image (cropped in 3) and a square one; a tall image (cropped in 3)."""
    processor = _processor(shape, pan_and_scan=True, min_crop_size=8)
    texts = [processor.apply_chat_template(
        [{"role": "user", "content": [*[{"type": "image"}] * n, {"type": "text", "text": "How many dots are there?"}]}],
        add_generation_prompt=True, tokenize=False) for n in (2, 1)]
    processor.tokenizer.padding_side = "left"
    encoded = processor(text=texts, images=[[random_image(96, 32, 1), random_image(32, 32, 2)],
                                            [random_image(20, 70, 3)]],
                        return_tensors="pt", padding=True, add_special_tokens=False)
    return model.coerce_inputs(dict(encoded))


def _explicit(n):
    return n.endswith("hook_pattern")


@pytest.mark.parametrize("shape", list(SHAPES))
def test_logits_match_hf_eager(shape):
    hf, model = _pair(shape)
    assert model.cfg.rope_kind == "1d" and model.cfg.qk_norm
    assert model.cfg.d_head == SHAPES[shape].get("d_head", 16)
    cases = dict(_cases(shape))
    cases["pan_and_scan"] = _pan_and_scan(model, shape)
    assert_logits_match(model, hf, cases)


def test_config_reads_gemma_specifics():
    hf, model = _pair("mqa_window3_global_first_bias_3x3")
    c = model.cfg
    assert (c.n_heads, c.n_key_value_heads, c.d_head, c.d_model, c.d_vocab) == (5, 1, 8, 40, 90)
    assert c.attn_scale == pytest.approx(8 ** -0.5) and model.blocks[0].attn.scaling == pytest.approx(8 ** -0.5)
    assert [model.blocks[i].attn.sliding_window for i in range(4)] == [None, 3, 3, None]
    assert c.rope_layer_types == ["full_attention", "sliding_attention"]
    assert [model.blocks[i].attn.rotary_index for i in range(4)] == [0, 1, 1, 0]
    assert c.act_fn == "gelu_pytorch_tanh" and c.tie_word_embeddings and c.default_prepend_bos
    assert model.unembed.lm_head.weight is model.embed.embedding.weight  # tied
    assert model.blocks[0].attn.b_O.abs().sum() > 0
    # W_E is the scaled embedding hook_embed reads; W_U has the final norm's (1 + w) folded in
    ids = torch.tensor([[2, 5, 9]])
    torch.testing.assert_close(model.W_E[ids], model.embed(ids), atol=0, rtol=0)
    w = model.unembed.ln_final_w
    torch.testing.assert_close(model.W_U, (1 + w)[:, None] * hf.lm_head.weight.T, atol=1e-6, rtol=0)
    hf_norm = hf.model.language_model.layers[1].pre_feedforward_layernorm.weight
    assert model.blocks[1].ln2.w is hf_norm  # the HF parameter itself; it multiplies by 1 + w
    torch.testing.assert_close(model.blocks[1].ln2.effective_weight, 1 + hf_norm, atol=0, rtol=0)
    torch.testing.assert_close(model.unembed.final_norm_weight, 1 + w, atol=0, rtol=0)


def test_softcapping_in_the_config_is_what_hf_ignores():
    """HF 5.24's Gemma3ForConditionalGeneration applies neither soft-cap; a config that sets both
    gives the same logits in HF, and in vlens."""
    from vlens import HookedVLM
    from vlens.testing import tiny_gemma3_model

    hf = tiny_gemma3_model(seed=7, attn_logit_softcapping=0.5, final_logit_softcapping=0.3)
    model = HookedVLM.from_hf(hf, processor=_processor("gqa2_window6_local_local_global"))
    inputs = model.prepare(images=[random_image(40, 40, 1)], prompts=["How many dots are there?"])
    with torch.no_grad():
        logits = model(inputs)
    torch.testing.assert_close(logits, hf(**inputs.to_hf_kwargs()).logits, atol=1e-4, rtol=0)
    assert logits.abs().max() > 0.3  # a final cap of 0.3 would have bounded them


def test_hook_shapes_post_norm_and_vision_hooks():
    from vlens import act_name

    hf, model = _pair("mqa_window3_global_first_bias_3x3")
    inputs = _cases("mqa_window3_global_first_bias_3x3")["left_padded_batch"]
    cache = assert_hook_shapes(model, inputs)
    b, p = inputs.input_ids.shape
    for norm in ("ln1_post", "ln2_post"):
        assert tuple(cache[f"blocks.1.{norm}.hook_scale"].shape) == (b, p, 1)
        assert tuple(cache[f"blocks.1.{norm}.hook_normalized"].shape) == (b, p, model.cfg.d_model)
    assert act_name("scale", 1, "ln1_post") == "blocks.1.ln1_post.hook_scale"
    # the attention's own output (the sum of its heads) is ln1_post's input
    attn_sum = cache["blocks.1.ln1_post.hook_normalized"] * cache["blocks.1.ln1_post.hook_scale"]
    heads = cache["blocks.1.attn.hook_result"].sum(2) + model.blocks[1].attn.b_O
    torch.testing.assert_close(heads, attn_sum, atol=1e-5, rtol=1e-5)
    assert tuple(cache["vision.blocks.2.hook_resid_post"].shape) == (2, 36, 32)  # 2 images, 6x6 patches
    assert tuple(cache["vision.blocks.2.attn.hook_z"].shape) == (2, 36, 4, 8)
    assert tuple(cache["vision.hook_image_features"].shape) == (2, 36, 32)
    assert tuple(cache["vision.hook_image_embeds"].shape) == (18, model.cfg.d_model)
    assert [len(r) for r in inputs.regions.image] == [9, 9]
    assert inputs.regions.image_grid == [[(3, 3)], [(3, 3)]]
    for row in range(b):  # the regions are the placeholder tokens
        ids = inputs.input_ids[row, inputs.regions.image[row]]
        assert bool((ids == model.cfg.image_token_id).all())
    assert int((inputs.input_ids == model.cfg.image_token_id).sum()) == 18


@pytest.mark.parametrize("shape", ["gqa2_window6_local_local_global", "mqa_window3_global_first_bias_3x3"])
def test_heads_add_up_to_attn_out_through_the_post_norm(shape):
    """sum_h z_h W_O[h] + b_O is the attention output; through ln1_post (at the run's scale) the heads'
    shares and the bias's add up to hook_attn_out, as vlens.lens.decomposition computes them."""
    from vlens.lens.decomposition import (
        layer_bias_contribution,
        layer_head_contributions,
        reconstruct_attn_out,
    )

    _, model = _pair(shape)
    inputs = _cases(shape)["left_padded_batch"]
    _, cache = model.run_with_cache(inputs)
    for layer in range(model.cfg.n_layers):
        per_head = layer_head_contributions(model, cache, layer)
        bias = layer_bias_contribution(model, cache, layer)
        torch.testing.assert_close(reconstruct_attn_out(per_head, bias), cache[f"blocks.{layer}.hook_attn_out"],
                                   atol=1e-5, rtol=1e-5, msg=f"layer {layer}")
        resid = cache[f"blocks.{layer}.hook_resid_pre"] + cache[f"blocks.{layer}.hook_attn_out"]
        torch.testing.assert_close(resid, cache[f"blocks.{layer}.hook_resid_mid"], atol=0, rtol=0)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_hook_z_edit_equals_hf_o_proj_input_edit(shape):
    hf, model = _pair(shape)
    assert_hook_z_edit_matches_hf(model, hf, _cases(shape)["left_padded_batch"], layer=1, head=1)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("layer", [0, 1])
def test_attn_scores_edit_equals_scaling_q_after_q_norm(shape, layer):
    """HF Gemma 3 normalizes q as [batch, heads, pos, d_head] (the adapter's query_norm_head_axis = 1)."""
    hf, model = _pair(shape)
    assert model.adapter.query_norm_head_axis == 1
    assert_scores_edit_matches_scaling_q(model, hf, _cases(shape)["left_padded_batch"], layer=layer, head=1)


@pytest.mark.parametrize("shape", ["gqa2_window6_local_local_global", "mqa_window3_global_first_bias_3x3"])
def test_patterns_equal_hf_attentions(shape):
    """Per-head patterns equal HF eager's attention weights: causal + bidirectional within each image's block,
    narrowed to the window in sliding layers, padding masked."""
    hf, model = _pair(shape)
    inputs = _cases(shape)["two_images_different_sizes"]
    padded = _cases(shape)["left_padded_batch"]
    for case in (inputs, padded):
        _, cache = model.run_with_cache(case, names_filter=lambda n: n.endswith("hook_pattern"))
        with torch.no_grad():
            attentions = hf(**case.to_hf_kwargs(), output_attentions=True).attentions
        for layer, expected in enumerate(attentions):
            real = case.attention_mask.bool()[:, None, :, None]  # padding queries: HF's uniform rows, ignore
            ours = cache[f"blocks.{layer}.attn.hook_pattern"]
            torch.testing.assert_close(ours * real, expected * real, atol=1e-6, rtol=0, msg=f"layer {layer}")
    # the structure itself, on the one-row two-image prompt
    _, cache = model.run_with_cache(inputs, names_filter=lambda n: n.endswith("hook_pattern"))
    first, second = inputs.regions.images[0]
    window = model.cfg.sliding_window
    assert (len(first) > window) == (shape == "mqa_window3_global_first_bias_3x3")
    for layer in range(model.cfg.n_layers):
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"][0]  # [heads, q, k]
        sliding = model.blocks[layer].attn.sliding_window is not None
        q, k = int(first[0]), int(first[-1])
        # an image token reads every later token of its block (HF's window bounds the look-back only)...
        assert bool((pattern[:, q, k] > 0).all())
        assert float(pattern[:, q, int(second[0])].abs().max()) == 0.0  # ...never the next image
        reads_back = bool((pattern[:, k, q] > 0).all())  # the look-back is windowed in sliding layers
        assert reads_back == (not sliding or k - q < window)
        text = int(inputs.regions.text[0][-1])  # the last text token reads causally
        assert float(pattern[:, text - 1, text].abs().max()) == 0.0
        if model.blocks[layer].attn.sliding_window is not None:
            assert float(pattern[:, text, : text - window + 1].abs().max()) == 0.0
            assert bool((pattern[:, text, text - window + 1:text + 1] > 0).all())


@pytest.mark.parametrize("case", ["left_padded_batch", "two_images_different_sizes", "text_only",
                                  "mixed_batch_with_text_only_row"])
def test_greedy_generate_matches_hf_past_the_window(case):
    hf, model = _pair("mqa_window3_global_first_bias_3x3")
    inputs = _cases("mqa_window3_global_first_bias_3x3")[case]
    assert inputs.seq_len > 4 * model.cfg.sliding_window
    assert_generate_matches_hf(model, hf, inputs, max_new_tokens=8)


def test_greedy_generate_matches_hf_with_pan_and_scan_and_local_only_layers():
    for shape in ("gqa2_window6_local_local_global", "mha_all_local_window11"):
        hf, model = _pair(shape)
        assert_generate_matches_hf(model, hf, _pan_and_scan(model, shape), max_new_tokens=7)


def test_sliding_layers_keep_only_their_window_in_the_kv_cache():
    """During decoding a sliding layer holds window - 1 keys (HF's cache layer), a global layer every key;
    each step's logits equal a full forward over the whole sequence."""
    from vlens.core.components.attention import KVCache

    hf, model = _pair("mqa_window3_global_first_bias_3x3")
    inputs = _cases("mqa_window3_global_first_bias_3x3")["left_padded_batch"]
    window = model.cfg.sliding_window
    out = model.generate(inputs, max_new_tokens=5)
    with torch.no_grad():
        full = model(input_ids=out.sequences, attention_mask=torch.ones_like(out.sequences).masked_fill(
            torch.nn.functional.pad(inputs.attention_mask, (0, 5), value=1) == 0, 0),
            pixel_values=inputs.pixel_values)
    expected = full[:, inputs.seq_len - 1:-1].argmax(-1)
    assert torch.equal(out.tokens, expected)
    cache = KVCache(model.cfg.n_layers, windows=[model.cfg.attention_window(i) for i in range(model.cfg.n_layers)])
    with torch.no_grad():
        state = model.start_run(inputs, kv_cache=cache)
        model.run_blocks(state.resid, state)
    lengths = [k.shape[1] for k in cache.keys]
    assert lengths == [inputs.seq_len, window - 1, window - 1, inputs.seq_len]
    assert cache.length == inputs.seq_len


def test_generate_hooks_see_the_windowed_keys():
    """A pattern hook during decoding sees a sliding layer's window of keys, a global layer's every key."""
    hf, model = _pair("mqa_window3_global_first_bias_3x3")
    inputs = _cases("mqa_window3_global_first_bias_3x3")["one_image"]
    widths: dict[str, list[int]] = {"blocks.0.attn.hook_pattern": [], "blocks.1.attn.hook_pattern": []}

    def record(pattern, hook):
        widths[hook.name].append(pattern.shape[-1])

    model.generate(inputs, max_new_tokens=3, fwd_hooks=[(name, record) for name in widths])
    n = inputs.seq_len
    assert widths["blocks.0.attn.hook_pattern"] == [n, n + 1, n + 2]
    assert widths["blocks.1.attn.hook_pattern"] == [n, 3, 3]


def test_token_types_missing_or_stale_are_the_processors():
    """Without token_type_ids (HF's keyword form) or with ones left from before tokens were appended, the
    blocks come from the image tokens, as the processor marks them."""
    from vlens.core.answers import teacher_force

    hf, model = _pair("gqa2_window6_local_local_global")
    inputs = _cases("gqa2_window6_local_local_global")["left_padded_batch"]
    kwargs = inputs.to_hf_kwargs()
    assert "mm_token_type_ids" not in kwargs and torch.equal(kwargs["token_type_ids"],
                                                             (inputs.input_ids == model.cfg.image_token_id).long())
    bare = {k: v for k, v in kwargs.items() if k != "token_type_ids"}
    with torch.no_grad():
        torch.testing.assert_close(model(**bare), hf(**kwargs).logits, atol=1e-4, rtol=0)
    three = model.to_single_token("3")
    forced = teacher_force(model, inputs, [[three, three, three], [three, three]])
    assert forced.extra["token_type_ids"].shape == forced.input_ids.shape
    with torch.no_grad():
        torch.testing.assert_close(model(forced), hf(**forced.to_hf_kwargs()).logits, atol=1e-4, rtol=0)


def test_one_bos_in_chat_prompts():
    _, model = _pair("gqa2_window6_local_local_global")
    bos = model.tokenizer.bos_token_id
    chat = model.prepare(images=[random_image(32, 32, 1)], prompts=["red"])
    plain = model.prepare(images=[random_image(32, 32, 1)], prompts=["red"], chat=False)
    assert int((chat.input_ids == bos).sum()) == 1 and int(chat.input_ids[0, 0]) == bos
    assert int((plain.input_ids == bos).sum()) == 1 and int(plain.input_ids[0, 0]) == bos  # the tokenizer's own
    assert model.to_str_tokens(chat.input_ids[0])[-3:] == ["<start_of_turn>", "model", "\n"]


def test_wrong_image_size_is_one_clear_error():
    from vlens.utils.errors import UserInputError

    _, model = _pair("gqa2_window6_local_local_global")
    inputs = _cases("gqa2_window6_local_local_global")["one_image"]
    with pytest.raises(UserInputError, match="32x32"):
        model(input_ids=inputs.input_ids, pixel_values=torch.zeros(1, 3, 48, 48))


# ---------------------------------------------------------------------- vision side
def test_vision_block_edit_equals_hf():
    hf, model = _pair("gqa2_window6_local_local_global")
    inputs = _cases("gqa2_window6_local_local_global")["one_image"]
    ours = model.run_with_hooks(inputs, fwd_hooks=[("vision.blocks.0.hook_resid_post", lambda x, hook: x * 0.5)])
    expected = hf_logits(hf, inputs, forward_hooks=[
        (hf.model.vision_tower.encoder.layers[0], lambda m, a, out: out * 0.5)])
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)
    assert (ours - model(inputs)).abs().max() > 1e-4


def test_vision_head_and_projector_hooks_edit_the_tower():
    hf, model = _pair("mqa_window3_global_first_bias_3x3")
    inputs = _cases("mqa_window3_global_first_bias_3x3")["left_padded_batch"]
    assert_vision_head_and_projector_edits_match_hf(model, hf, inputs, hf.model.vision_tower.encoder.layers,
                                                    hf.model.multi_modal_projector,
                                                    hf.config.vision_config.num_attention_heads)


def test_no_hooks_left_after_exception():
    _, model = _pair("gqa2_window6_local_local_global")
    assert_no_hooks_left_after_exception(model, _cases("gqa2_window6_local_local_global")["one_image"],
                                         ["blocks.1.ln1_post.hook_scale", "blocks.2.attn.hook_pattern",
                                          "vision.blocks.0.attn.hook_z", "vision.hook_image_features"])


# ---------------------------------------------------------------------- loading, dtypes
def test_saved_checkpoint_loads_with_its_processor(tmp_path):
    hf, model = _pair("mqa_window3_global_first_bias_3x3")
    assert_saved_checkpoint_loads(hf, model.processor, tmp_path, [random_image(48, 48, 1), random_image(96, 64, 2)])
    from transformers import Gemma3Processor

    from vlens import HookedVLM

    loaded = HookedVLM.from_pretrained(str(tmp_path))
    assert isinstance(loaded.processor, Gemma3Processor) and loaded.tokenizer.boi_token == "<start_of_image>"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_loads_and_matches_hf(dtype, tmp_path):
    """Loaded in bf16 / fp16: the explicit path is HF eager op for op (bit-identical where HF's forward uses
    the same positions: no padding), the SDPA path close."""
    from vlens import HookedVLM

    hf, model = _pair("gqa2_window6_local_local_global")
    hf.save_pretrained(tmp_path)
    model.processor.save_pretrained(tmp_path)
    half = HookedVLM.from_pretrained(str(tmp_path), dtype=dtype, attn_implementation="eager")
    half_hf = half.hf_model
    assert half.cfg.dtype == dtype and half.W_U.dtype == dtype
    inputs = half.prepare(images=[[random_image(40, 60, 1), random_image(64, 64, 2)]], prompts=["How many dots are there?"])
    with torch.no_grad():
        expected = half_hf(**inputs.to_hf_kwargs()).logits.float()
        explicit = half.run_with_hooks(inputs, fwd_hooks=[(_explicit, lambda x, hook: x)]).float()
        fast = half(inputs).float()
    torch.testing.assert_close(explicit, expected, atol=0, rtol=0)
    assert (fast - expected).abs().max() < 0.1


# ---------------------------------------------------------------------- head temperature on the HF model
def test_temperature_on_hf_equals_hooked_and_is_not_baked():
    from vlens.interventions.temperature import HeadTemperature

    hf, model = _pair("gqa2_window6_local_local_global")
    inputs = _cases("gqa2_window6_local_local_global")["left_padded_batch"]
    temp = HeadTemperature(betas={(0, 1): 1.6, (2, 3): 0.7})
    with torch.no_grad(), temp.applied(model):
        hooked = model(inputs)
    with temp.export_to_hf(hf):
        on_hf = hf_logits(hf, inputs)
    torch.testing.assert_close(hooked, on_hf, atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="query norm"):
        temp.baked_state_dict(hf)


def test_image_size_setting_and_object_points():
    """--image-size sets Gemma's fixed resize (a size the tower does not take is one clear error); object
    centres map through the whole-image resize onto the token grid."""
    from vlens import HookedVLM
    from vlens.core.devices import configure_resolution
    from vlens.utils.errors import UserInputError

    hf, model = _pair("gqa2_window6_local_local_global")
    processor = configure_resolution(_processor("gqa2_window6_local_local_global"), image_size=48)
    size = processor.image_processor.size
    assert (size["height"], size["width"]) == (48, 48)
    other = HookedVLM.from_hf(hf, processor=processor)
    with pytest.raises(UserInputError, match="32x32"):
        other.prepare(images=[random_image(40, 60, 1)], prompts=["red"])
    with pytest.raises(UserInputError, match="pixel budget"):
        configure_resolution(_processor("gqa2_window6_local_local_global"), min_pixels=1024)
    points = torch.tensor([[0.0, 0.0], [20.0, 30.0], [40.0, 60.0], [50.0, 10.0]], dtype=torch.float64)
    grid, visible = model.adapter.image_points_to_grid(model.processor, points, (40, 60), (2, 2))
    torch.testing.assert_close(grid, torch.tensor([[-0.5, -0.5], [0.5, 0.5], [1.5, 1.5], [-1 / 6, 2.0]],
                                                  dtype=torch.float64))
    assert visible.tolist() == [True, True, True, False]
