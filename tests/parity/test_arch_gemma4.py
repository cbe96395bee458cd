"""Gemma 4 in HookedVLM: the parity matrix against HF eager on tiny shapes, plus what is Gemma 4's own: per-layer
embeddings, head sizes per layer type, the value norm, keys as values, bidirectional images in the sliding
layers only, soft-capped logits, the layer scalar, its vision encoder and pooled soft tokens, the processor."""

from __future__ import annotations

import functools

import pytest
import torch

from tests.helpers.arch_parity import (
    assert_bf16_within_hf_noise,
    assert_generate_matches_hf,
    assert_hook_shapes,
    assert_hook_z_edit_matches_hf,
    assert_logits_match,
    assert_no_hooks_left_after_exception,
    assert_saved_checkpoint_loads,
    assert_scores_edit_matches_scaling_q,
    hf_logits,
    input_matrix,
)
from vlens.testing import random_image

torch.set_num_threads(1)

# head sizes per layer type (12 / 20, 8 / 16), GQA and MQA, keys as values with their own global kv heads,
# per-layer embeddings on / off, soft cap on / off, images bidirectional in sliding layers / causal,
# full layer last / first, 4 px / 6 px patches, biases
SHAPES = {
    "gqa2_ple8_softcap_bidir_pool2": dict(),
    "mqa_kv_eq_v_full_first_no_ple_bias": dict(
        n_layers=4, d_model=40, n_heads=5, n_kv_heads=1, d_head=8, global_head_dim=16, sliding_window=4,
        layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
        attention_k_eq_v=True, num_global_key_value_heads=5, ple_dim=0, final_logit_softcapping=None,
        bidirectional_vision=False, attention_bias=True, patch_size=6, pooling_kernel_size=2, vision_heads=3,
        vision_head_dim=8, vocab_size=90, partial_rotary_factor=0.25),
    # experts beside the dense MLP (4 experts, top 2), a sliding then a full layer (sizes whose bf16 rows are
    # multiples of 16 bytes: HF's grouped_mm experts need it on CPU)
    "moe4_top2_mha3_window5": dict(
        n_layers=2, d_model=40, n_heads=3, n_kv_heads=3, d_head=12, global_head_dim=24, sliding_window=5,
        layer_types=["sliding_attention", "full_attention"], enable_moe_block=True, num_experts=4, top_k_experts=2,
        moe_intermediate_size=16, ple_dim=6),
}
PROCESSOR_KWARGS = {"gqa2_ple8_softcap_bidir_pool2": dict(patch_size=4, pooling_kernel_size=2),
                    "mqa_kv_eq_v_full_first_no_ple_bias": dict(patch_size=6, pooling_kernel_size=2),
                    "moe4_top2_mha3_window5": dict(patch_size=4, pooling_kernel_size=2)}
IMAGE_SIZES = [(40, 60), (96, 64), (32, 48), (64, 64), (50, 50), (64, 96)]


def _processor(shape: str):
    from vlens.testing.gemma4 import tiny_gemma4_processor

    return tiny_gemma4_processor(**PROCESSOR_KWARGS[shape])


@functools.lru_cache(maxsize=3)
def _pair(shape: str):
    from vlens import HookedVLM
    from vlens.testing.gemma4 import tiny_gemma4_model

    hf = tiny_gemma4_model(seed=len(shape), **SHAPES[shape])
    return hf, HookedVLM.from_hf(hf, processor=_processor(shape))


@functools.lru_cache(maxsize=3)
def _cases(shape: str) -> dict:
    _, model = _pair(shape)
    return input_matrix(model, IMAGE_SIZES)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_logits_match_hf_eager(shape):
    hf, model = _pair(shape)
    assert_logits_match(model, hf, _cases(shape))


def test_config_reads_gemma4_specifics():
    hf, model = _pair("mqa_kv_eq_v_full_first_no_ple_bias")
    c = model.cfg
    assert (c.n_heads, c.n_key_value_heads, c.d_head, c.d_model, c.d_vocab) == (5, 1, 8, 40, 90)
    assert [c.d_head_at(x) for x in range(4)] == [16, 8, 8, 16]
    assert [c.kv_heads_at(x) for x in range(4)] == [5, 1, 1, 5]
    assert not c.uniform_heads and c.attn_scale == 1.0 and model.blocks[0].attn.scaling == 1.0
    assert [model.blocks[i].attn.sliding_window for i in range(4)] == [None, 4, 4, None]
    assert [model.blocks[i].attn.rotary_index for i in range(4)] == [0, 1, 1, 0]
    assert model.blocks[0].attn.values_from_keys and model.blocks[0].attn.W_V.shape == (5, 40, 16)
    assert not model.blocks[1].attn.values_from_keys and model.blocks[1].attn.W_K.shape == (5, 40, 8)
    assert model.unembed.lm_head.weight is model.embed.embedding.weight  # tied
    assert model.blocks[1].ln2.w is hf.model.language_model.layers[1].pre_feedforward_layernorm.weight
    ids = torch.tensor([[2, 5, 13]])
    torch.testing.assert_close(model.W_E[ids], model.embed(ids), atol=0, rtol=0)
    placeholders = torch.tensor([[8, 9, 12]])  # image, video, audio: embedded as <pad>, as HF does
    torch.testing.assert_close(model.embed(placeholders), model.W_E[torch.zeros_like(placeholders)], atol=0, rtol=0)
    _, plain = _pair("gqa2_ple8_softcap_bidir_pool2")
    assert plain.unembed.softcap == 12.0 and plain.blocks[0].ple_dim == 8 and model.blocks[0].ple_dim == 0


def test_hook_shapes_per_layer_inputs_and_regions():
    hf, model = _pair("gqa2_ple8_softcap_bidir_pool2")
    inputs = _cases("gqa2_ple8_softcap_bidir_pool2")["two_images_different_sizes"]
    cache = assert_hook_shapes(model, inputs)
    b, p = inputs.input_ids.shape
    assert tuple(cache["blocks.2.attn.hook_z"].shape) == (b, p, 4, 20)  # the full layer's own head size
    assert tuple(cache["blocks.2.attn.hook_k"].shape) == (b, p, 2, 20)
    assert tuple(cache["blocks.1.hook_per_layer_input"].shape) == (b, p, 8)
    assert tuple(cache["blocks.1.hook_ple_out"].shape) == (b, p, model.cfg.d_model)
    # the per-layer inputs are HF's (project_per_layer_inputs of the image-merged embeddings)
    lm = hf.model.language_model
    ids = inputs.input_ids.masked_fill(inputs.input_ids == model.cfg.image_token_id, 0)
    with torch.no_grad():
        expected = lm.project_per_layer_inputs(cache["hook_inputs_embeds"], lm.get_per_layer_inputs(ids, None))
    torch.testing.assert_close(cache["blocks.1.hook_per_layer_input"], expected[:, :, 1], atol=1e-6, rtol=0)
    # 96x64 and 32x48 images: aspect kept, 8 px cells (4 px patches pooled 2x2)
    grids = inputs.regions.image_grid[0]
    assert [rows * cols for rows, cols in grids] == [len(r) for r in inputs.regions.images[0]]
    assert grids[0][1] > grids[0][0] and grids[1][0] > grids[1][1]
    n_tokens = sum(r * c for r, c in grids)
    assert tuple(cache["vision.hook_image_features"].shape) == (n_tokens, 24)
    assert tuple(cache["vision.hook_image_embeds"].shape) == (n_tokens, model.cfg.d_model)
    assert tuple(cache["vision.blocks.1.attn.hook_z"].shape) == (2, 280, 2, 12)
    tokenizer = model.processor.tokenizer
    for image, tokens in enumerate(inputs.regions.images[0]):
        assert bool((inputs.input_ids[0, tokens] == model.cfg.image_token_id).all())
        start = inputs.regions.marker_positions(0, "start")[image]
        end = inputs.regions.marker_positions(0, "end")[image]
        assert tokenizer.convert_ids_to_tokens(int(inputs.input_ids[0, start])) == "<|image>"
        assert tokenizer.convert_ids_to_tokens(int(inputs.input_ids[0, end])) == "<image|>"
        assert int(start) == int(tokens[0]) - 1 and int(end) == int(tokens[-1]) + 1


@pytest.mark.parametrize("shape,layer", [("gqa2_ple8_softcap_bidir_pool2", 1), ("gqa2_ple8_softcap_bidir_pool2", 2),
                                         ("mqa_kv_eq_v_full_first_no_ple_bias", 0)])
def test_hook_z_edit_equals_hf_o_proj_input_edit(shape, layer):
    hf, model = _pair(shape)
    assert_hook_z_edit_matches_hf(model, hf, _cases(shape)["left_padded_batch"], layer=layer, head=1)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_attn_scores_edit_equals_scaling_q_after_q_norm(shape):
    hf, model = _pair(shape)
    # a sliding layer: the helper reads the config's head size (the full layers' is global_head_dim)
    layer = next(x for x in range(model.cfg.n_layers) if model.blocks[x].attn.sliding_window is not None)
    assert_scores_edit_matches_scaling_q(model, hf, _cases(shape)["left_padded_batch"], layer=layer, head=1)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_value_and_per_layer_edits_equal_hf(shape):
    """Flipping hook_v of one kv head equals flipping HF's value-norm output for that head; zeroing a layer's per-layer input or PLE output equals the same edit in HF."""
    hf, model = _pair(shape)
    inputs = _cases(shape)["one_image"]
    layers = hf.model.language_model.layers
    layer = 0

    def flip_v(v, hook):
        v = v.clone()
        v[:, :, 0] = v[:, :, 0].flip(-1)
        return v

    hf_attn = layers[layer].self_attn
    # the value norm's output [batch, pos, kv_heads, d] (k_proj's output normed, where keys are values)
    flipped = [(hf_attn.v_norm, lambda m, a, out: torch.cat([out[..., :1, :].flip(-1), out[..., 1:, :]], dim=-2))]
    expected = hf_logits(hf, inputs, forward_hooks=flipped)
    with torch.no_grad():
        ours = model.run_with_hooks(inputs, fwd_hooks=[(f"blocks.{layer}.attn.hook_v", flip_v)])
        plain = model(inputs)
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)
    assert (ours - plain).abs().max() > 1e-4
    if model.blocks[1].ple_dim:
        with torch.no_grad():
            ours = model.run_with_hooks(inputs, fwd_hooks=[("blocks.1.hook_per_layer_input", lambda x, hook: x * 0)])
        expected = hf_logits(hf, inputs, pre_hooks=[(layers[1], lambda m, args: (args[0], args[1] * 0))])
        torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)
        assert (ours - plain).abs().max() > 1e-4
        with torch.no_grad():
            ours = model.run_with_hooks(inputs, fwd_hooks=[("blocks.1.hook_ple_out", lambda x, hook: x * 0)])
        expected = hf_logits(hf, inputs, forward_hooks=[(layers[1].post_per_layer_input_norm,
                                                          lambda m, a, out: out * 0)])
        torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_patterns_equal_hf_attentions(shape):
    """Per-head patterns equal HF eager's: an image's tokens see each other in the sliding layers when the
    config makes images bidirectional, never in the full layers."""
    hf, model = _pair(shape)
    for case in ("two_images_different_sizes", "left_padded_batch"):
        inputs = _cases(shape)[case]
        _, cache = model.run_with_cache(inputs, names_filter=lambda n: n.endswith("hook_pattern"))
        with torch.no_grad():
            attentions = hf(**inputs.to_hf_kwargs(), output_attentions=True).attentions
        for layer, expected in enumerate(attentions):
            real = inputs.attention_mask.bool()[:, None, :, None]
            ours = cache[f"blocks.{layer}.attn.hook_pattern"]
            # a left-padded row: HF's forward counts positions from the padding, vlens as generate does from
            # the first real token; rotary cancels the offset up to float error (scores are unscaled here)
            atol = 1e-6 if bool(inputs.attention_mask.all()) else 1e-4
            torch.testing.assert_close(ours * real, expected * real, atol=atol, rtol=0, msg=f"layer {layer}")
    inputs = _cases(shape)["two_images_different_sizes"]
    _, cache = model.run_with_cache(inputs, names_filter=lambda n: n.endswith("hook_pattern"))
    first = inputs.regions.images[0][0]
    q, k = int(first[0]), int(first[1])
    bidirectional = SHAPES[shape].get("bidirectional_vision", True)
    for layer in range(model.cfg.n_layers):
        sliding = model.blocks[layer].attn.sliding_window is not None
        reads_ahead = bool((cache[f"blocks.{layer}.attn.hook_pattern"][0, :, q, k] > 0).all())
        assert reads_ahead == (sliding and bidirectional), layer


@pytest.mark.parametrize("case", ["left_padded_batch", "two_images_different_sizes", "text_only",
                                  "mixed_batch_with_text_only_row"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_greedy_generate_matches_hf(shape, case):
    hf, model = _pair(shape)
    inputs = _cases(shape)[case]
    assert_generate_matches_hf(model, hf, inputs, max_new_tokens=6)


def test_vision_head_and_projector_edits_equal_hf():
    hf, model = _pair("gqa2_ple8_softcap_bidir_pool2")
    inputs = _cases("gqa2_ple8_softcap_bidir_pool2")["one_image"]
    tower = hf.model.vision_tower

    def drop_head(z, hook):
        z = z.clone()
        z[..., 1, :] = 0
        return z

    def drop_head_hf(module, args):
        x = args[0].clone()
        x[..., 12:24] = 0
        return (x,)

    with torch.no_grad():
        ours = model.run_with_hooks(inputs, fwd_hooks=[("vision.blocks.1.attn.hook_z", drop_head)])
    expected = hf_logits(hf, inputs, pre_hooks=[(tower.encoder.layers[1].self_attn.o_proj.linear, drop_head_hf)])
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)
    with torch.no_grad():
        ours = model.run_with_hooks(inputs, fwd_hooks=[("vision.hook_image_features", lambda x, hook: x.flip(0))])
    flipped = [(tower, lambda m, a, out: type(out)(last_hidden_state=out.last_hidden_state.flip(0)))]
    expected = hf_logits(hf, inputs, forward_hooks=flipped)
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)


def test_no_hooks_left_after_exception():
    _, model = _pair("gqa2_ple8_softcap_bidir_pool2")
    inputs = _cases("gqa2_ple8_softcap_bidir_pool2")["one_image"]
    assert_no_hooks_left_after_exception(model, inputs, ["blocks.1.attn.hook_pattern", "blocks.2.hook_per_layer_input",
                                                         "vision.blocks.0.hook_resid_post"])


def test_saved_checkpoint_loads(tmp_path):
    hf, _ = _pair("gqa2_ple8_softcap_bidir_pool2")
    assert_saved_checkpoint_loads(hf, _processor("gqa2_ple8_softcap_bidir_pool2"), tmp_path,
                                  [random_image(40, 56, 3), random_image(64, 32, 4)])


@pytest.mark.parametrize("shape", ["gqa2_ple8_softcap_bidir_pool2", "moe4_top2_mha3_window5"])
def test_bf16_within_hf_noise(shape):
    hf, _ = _pair(shape)
    assert_bf16_within_hf_noise(hf, _processor(shape),
                                lambda model: model.prepare(images=[random_image(48, 40, 1), random_image(40, 40, 2)],
                                                            prompts=["How many dots are there?", "red"]))


def test_processor_equals_hf_gemma4_processor(monkeypatch):
    """vlens's processor gives HF's `Gemma4Processor` outputs (built here without its torchvision video
    processor by skipping HF's class check): tokens, token types, patches and patch positions."""
    from transformers import Gemma4AudioFeatureExtractor, Gemma4Processor
    from transformers.processing_utils import ProcessorMixin

    from vlens.testing.gemma4 import GEMMA4_CHAT_TEMPLATE, gemma4_image_processor, gemma4_tokenizer

    monkeypatch.setattr(ProcessorMixin, "check_argument_for_proper_class", lambda self, name, arg: None)
    ours = _processor("gqa2_ple8_softcap_bidir_pool2")
    theirs = Gemma4Processor(feature_extractor=Gemma4AudioFeatureExtractor(), image_processor=gemma4_image_processor(),
                             tokenizer=gemma4_tokenizer(), video_processor=None, chat_template=GEMMA4_CHAT_TEMPLATE)
    texts = ["<bos><|turn>user\n<|image|>How many <|image|>dots<turn|>\n", "<bos><|turn>user\n<|image|>red<turn|>\n"]
    images = [[random_image(96, 40, 1), random_image(30, 50, 2)], [random_image(64, 64, 3)]]
    expected = theirs(text=texts, images=images, return_tensors="pt", padding=True, add_special_tokens=False)
    got = ours(text=texts, images=images, return_tensors="pt", padding=True, add_special_tokens=False)
    for key in ("input_ids", "attention_mask", "mm_token_type_ids", "pixel_values", "image_position_ids"):
        torch.testing.assert_close(got[key], expected[key], atol=0, rtol=0, msg=key)


KV_SHARED = dict(n_layers=5, num_kv_shared_layers=2, use_double_wide_mlp=True, sliding_window=5,
                 layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
                              "full_attention"])


@functools.lru_cache(maxsize=1)
def _kv_shared_pair():
    from vlens import HookedVLM
    from vlens.testing.gemma4 import tiny_gemma4_model

    hf = tiny_gemma4_model(seed=11, **KV_SHARED)
    return hf, HookedVLM.from_hf(hf, processor=_processor("gqa2_ple8_softcap_bidir_pool2"))


def test_kv_shared_layers_match_hf():
    """Gemma 4 E2B / E4B's layout: the last two layers read the keys / values of the last earlier layer of their
    type (layers 1 and 2: HF's "store"), have no key projections, and a double-wide MLP."""
    hf, model = _kv_shared_pair()
    assert hf.config.get_text_config().kv_sharing_modes == [None, "store", "store", "reuse", "reuse"]
    assert model.blocks[3].attn.__dict__["kv_source"] is model.blocks[2].attn
    assert model.blocks[4].attn.__dict__["kv_source"] is model.blocks[1].attn
    cases = input_matrix(model, IMAGE_SIZES)
    assert_logits_match(model, hf, cases)
    for case in ("left_padded_batch", "two_images_different_sizes"):  # decoding past the window
        assert_generate_matches_hf(model, hf, cases[case], max_new_tokens=8)
    # an edit of the source layer's keys reaches the layers that share them, as in HF
    inputs = cases["one_image"]

    def flip_k(k, hook):
        return k.flip(-1)

    hf_k = hf.model.language_model.layers[1].self_attn.k_proj
    d = model.cfg.d_head_at(1)
    flipped = [(hf_k, lambda m, a, out: out.view(*out.shape[:2], -1, d).flip(-1).reshape(out.shape))]
    with torch.no_grad():
        ours = model.run_with_hooks(inputs, fwd_hooks=[("blocks.1.attn.hook_k", flip_k)])
    torch.testing.assert_close(ours, hf_logits(hf, inputs, forward_hooks=flipped), atol=1e-4, rtol=0)
    # a sharing layer shows the keys / values it reads at its own hook_rot_k / hook_v (it has no hook_k)
    assert not hasattr(model.blocks[3].attn, "hook_k") and model.cfg.d_mlp_at(3) == 2 * model.cfg.d_mlp
    _, cache = model.run_with_cache(inputs, names_filter=lambda n: n.endswith(("hook_rot_k", "hook_v")))
    torch.testing.assert_close(cache["blocks.3.attn.hook_rot_k"], cache["blocks.2.attn.hook_rot_k"], atol=0, rtol=0)
    torch.testing.assert_close(cache["blocks.4.attn.hook_v"], cache["blocks.1.attn.hook_v"], atol=0, rtol=0)


def test_kv_shared_model_passes_vlens_verify():
    from vlens.verify import VerifySettings, verify_model

    _, model = _kv_shared_pair()
    settings = VerifySettings(max_new_tokens=2, repeats=1, case_names=("one_image", "padded_batch"))
    result = verify_model(model, "tiny gemma4 kv-shared", settings, progress=False)
    assert result.passed, result.table_rows()


def test_kv_shared_run_resumed_after_the_source_layer_is_refused():
    from vlens.utils.errors import UserInputError

    _, model = _kv_shared_pair()
    inputs = _cases("gqa2_ple8_softcap_bidir_pool2")["one_image"]
    with torch.no_grad():
        state = model.start_run(inputs)
        resid = model.run_blocks(state.resid, state, 0, 3)
        full = model.finish(model.run_blocks(resid, state, 3))  # the same pass, resumed where it stopped
        torch.testing.assert_close(full, model(inputs), atol=1e-6, rtol=0)
        with pytest.raises(UserInputError, match="start the run at layer 2 or earlier"):
            model.run_blocks(resid, state, 3)  # a new pass that never ran layer 2


def test_expert_hooks_act_as_the_same_edits_in_hf():
    """The experts' routing weights and output are hook points: zeroing one chosen expert's weight, or the whole
    expert output, equals the same edit on HF's router output / post-experts norm; the weights are HF's."""
    hf, model = _pair("moe4_top2_mha3_window5")
    inputs = _cases("moe4_top2_mha3_window5")["one_image"]
    layer = hf.model.language_model.layers[1]
    _, cache = model.run_with_cache(inputs, names_filter=lambda n: ".moe." in n)
    b, p = inputs.input_ids.shape
    assert tuple(cache["blocks.1.moe.hook_router_probs"].shape) == (b, p, 4)
    assert tuple(cache["blocks.1.moe.hook_expert_indices"].shape) == (b, p, 2)

    def drop_first(w, hook):
        w = w.clone()
        w[..., 0] = 0
        return w

    def drop_first_hf(module, args, out):
        probs, w, idx = out
        w = w.clone()
        w[:, 0] = 0
        return probs, w, idx

    with torch.no_grad():
        ours = model.run_with_hooks(inputs, fwd_hooks=[("blocks.1.moe.hook_expert_weights", drop_first)])
        plain = model(inputs)
    torch.testing.assert_close(ours, hf_logits(hf, inputs, forward_hooks=[(layer.router, drop_first_hf)]),
                               atol=1e-4, rtol=0)
    assert (ours - plain).abs().max() > 1e-4
    with torch.no_grad():
        ours = model.run_with_hooks(inputs, fwd_hooks=[("blocks.1.moe.hook_expert_out", lambda x, hook: x * 0)])
    expected = hf_logits(hf, inputs, forward_hooks=[(layer.post_feedforward_layernorm_2, lambda m, a, out: out * 0)])
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)


def test_kv_shared_layers_train_with_gradient_checkpointing():
    """Blocks recomputed in backward read the keys their source layer made in the forward pass: the gradients
    equal those of an uncheckpointed run."""
    from vlens.training.memory import gradient_checkpointing

    _, model = _kv_shared_pair()
    inputs = _cases("gqa2_ple8_softcap_bidir_pool2")["one_image"]

    def grads(checkpointed: bool) -> dict:
        model.zero_grad(set_to_none=True)
        with torch.enable_grad(), gradient_checkpointing(model, checkpointed):
            model(inputs, return_type="loss").backward()
        out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        return out

    plain, checkpointed = grads(False), grads(True)
    assert plain.keys() == checkpointed.keys() and len(plain) > 50
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad, atol=1e-6, rtol=0, msg=name)
