"""TransformerLens's own functions on a HookedVLM (Qwen2.5-VL, Qwen3-VL with DeepStack, LLaVA).

Every check compares numbers: attributions that must add up to the logit difference,
decompositions that must add up to the residual at every position (image positions included),
TransformerLens patching sweeps against vlens's own sweeps, losses against HF's.
"""

from __future__ import annotations

import functools

import pytest
import torch
import transformer_lens.patching as tl_patching
from transformer_lens.FactoredMatrix import FactoredMatrix
from transformer_lens.tools.analysis import logit_lens as tl_logit_lens

from tests.helpers.models import build_pair
from vlens import HookedVLM
from vlens.core.hooks import act_name
from vlens.testing import (
    random_image,
    tiny_hf_model,
    tiny_llava_model,
    tiny_llava_processor,
    tiny_qwen3_vl_model,
    tiny_qwen3_vl_processor,
    tiny_qwen_processor,
)
from vlens.utils.errors import UserInputError

FAMILIES = ["qwen2_5_vl", "qwen3_vl", "llava", "llava_next", "internvl", "idefics3", "smolvlm", "idefics2",
            "aya_vision"]
# a second configuration per family: output biases on (Qwen3: o_proj; LLaVA: o_proj and MLP), tied embeddings
VARIANTS = [(f, "plain") for f in FAMILIES] + [("qwen3_vl", "bias_tied"), ("llava", "bias_tied"), ("qwen2_vl", "plain")]


@functools.lru_cache(maxsize=8)
def _model(family: str, variant: str = "plain", dtype: torch.dtype = torch.float32) -> HookedVLM:
    extra = {"bias_tied": {"attention_bias": True}}.get(variant, {})
    if family == "qwen3_vl":
        hf, processor = tiny_qwen3_vl_model(dtype=dtype, **extra), tiny_qwen3_vl_processor()
    elif family == "llava":
        extra = {**extra, "mlp_bias": True} if extra else extra
        hf, processor = tiny_llava_model(dtype=dtype, **extra), tiny_llava_processor()
    elif family in ("qwen2_vl", "qwen2_5_vl"):
        hf, processor = tiny_hf_model(family, dtype=dtype, **extra), tiny_qwen_processor()
    else:  # tiled and split-image families, as the shared builders make them
        hf, built = build_pair(family, **extra)
        hf, processor = hf.to(dtype), built.processor
    if variant == "bias_tied":
        hf.lm_head.weight = hf.get_input_embeddings().weight
    return HookedVLM.from_hf(hf, processor=processor)


def _model_fresh(family: str, variant: str = "plain") -> HookedVLM:
    model = _model(family, variant)
    model.reset_hooks(including_permanent=True)
    model.set_use_attn_result(False)
    return model


def _inputs(model: HookedVLM):
    """Two rows with one image each, of different sizes: a left-padded batch."""
    size = 64 if model.cfg.n_deepstack_layers else 56
    images = [random_image(size, size, 1), random_image(2 * size, size, 2)]
    return model.prepare(images=images, prompts=["How many dots are there?", "red"])


def _answer_pair(logits: torch.Tensor):
    """Per row: the top token and the 5th, at the final position (left padding: the last column)."""
    top = logits[:, -1].float().topk(5, dim=-1).indices
    rows = torch.arange(logits.shape[0])
    return top[:, 0], top[:, 4], logits[rows, -1, top[:, 0]] - logits[rows, -1, top[:, 4]]


# ---------------------------------------------------------------------- direct logit attribution
@pytest.mark.parametrize(("family", "variant"), VARIANTS)
def test_logit_attrs_add_up_to_the_logit_difference(family, variant):
    model = _model_fresh(family, variant)
    logits, cache = model.run_with_cache(_inputs(model))
    correct, wrong, logit_diff = _answer_pair(logits)
    stacks = {
        "decompose_resid": cache.decompose_resid(pos_slice=-1),
        "full (neurons)": cache.get_full_resid_decomposition(pos_slice=-1, expand_neurons=True),
        "full (mlp layers)": cache.get_full_resid_decomposition(pos_slice=-1, expand_neurons=False),
        "heads + remainder": cache.stack_head_results(pos_slice=-1, incl_remainder=True),
    }
    for name, stack in stacks.items():
        attrs = cache.logit_attrs(stack, tokens=correct, incorrect_tokens=wrong, pos_slice=-1)
        torch.testing.assert_close(attrs.sum(0), logit_diff, rtol=1e-4, atol=1e-6, msg=name)
    # one token pair given as strings, shared by the batch
    answer = model.to_single_token("3")
    other = model.to_single_token("5")
    attrs = cache.logit_attrs(stacks["decompose_resid"], tokens="3", incorrect_tokens="5", pos_slice=-1)
    torch.testing.assert_close(attrs.sum(0), logits[:, -1, answer] - logits[:, -1, other], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_ln_applied_stacks_times_W_U_give_the_logits_everywhere(family):
    model = _model_fresh(family)
    logits, cache = model.run_with_cache(_inputs(model))
    full = cache.get_full_resid_decomposition(apply_ln=True, expand_neurons=False)
    torch.testing.assert_close(full.sum(0) @ model.W_U + model.b_U, logits, rtol=0, atol=1e-5)
    # the projection folded into the decomposition (TransformerLens's memory-saving path)
    ids = torch.tensor([model.to_single_token("3"), model.to_single_token("red")])
    projected = cache.get_full_resid_decomposition(apply_ln=True, project_output_onto=model.W_U[:, ids])
    torch.testing.assert_close(projected.sum(0), logits[..., ids] - model.b_U[ids], rtol=0, atol=1e-5)
    # tokens_to_residual_directions are W_U's columns, without building W_U
    torch.testing.assert_close(model.tokens_to_residual_directions(ids), model.W_U[:, ids].T)
    assert model.tokens_to_residual_directions(int(ids[0])).shape == (model.cfg.d_model,)


def test_effective_W_U_folds_the_final_norm_and_is_never_stored():
    model = _model_fresh("qwen2_5_vl")
    unembed = model.unembed
    w = unembed.ln_final_w
    torch.testing.assert_close(model.W_U, w[:, None] * unembed.lm_head.weight.T, rtol=0, atol=0)
    # computed from the HF parameters on access: no buffer or parameter of that shape is kept
    sizes = [t.shape for t in [*model.parameters(), *model.buffers()]]
    assert (model.cfg.d_model, model.cfg.d_vocab) not in sizes
    with torch.no_grad():
        w.mul_(2.0)
        try:
            torch.testing.assert_close(model.W_U, w[:, None] * unembed.lm_head.weight.T, rtol=0, atol=0)
        finally:
            w.div_(2.0)
    assert w is model.adapter.language_model(model.hf_model).norm.weight  # the HF parameter itself
    with pytest.raises(AttributeError, match="folded"):
        _ = model.ln_final.w


# ---------------------------------------------------------------------- decompositions
@pytest.mark.parametrize("family", FAMILIES)
def test_decompositions_add_up_at_every_position(family):
    model = _model_fresh(family)
    inputs = _inputs(model)
    _, cache = model.run_with_cache(inputs)
    n_layers = model.cfg.n_layers
    is_image = torch.zeros(inputs.input_ids.shape, dtype=torch.bool)
    for row, positions in enumerate(inputs.regions.image):
        is_image[row, positions.cpu()] = True
    assert bool(is_image.any())
    torch.testing.assert_close(cache.image_positions().cpu(), is_image, rtol=0, atol=0)
    for layer in range(n_layers + 1):
        for mlp_input in ([False, True] if layer < n_layers else [False]):
            if layer == n_layers:
                target = cache[f"blocks.{n_layers - 1}.hook_resid_post"]
            else:
                target = cache[f"blocks.{layer}.hook_resid_{'mid' if mlp_input else 'pre'}"]
            stacks = {
                "decompose_resid": cache.decompose_resid(layer=layer, mlp_input=mlp_input),
                "full (neurons)": cache.get_full_resid_decomposition(layer=layer, mlp_input=mlp_input),
                "full (mlp layers)": cache.get_full_resid_decomposition(layer=layer, mlp_input=mlp_input,
                                                                        expand_neurons=False),
            }
            for name, stack in stacks.items():
                error = (stack.sum(0) - target).abs()
                assert error[is_image].max() <= 1e-5 * target.abs().max(), (name, layer, mlp_input, "image")
                assert error[~is_image].max() <= 1e-5 * target.abs().max(), (name, layer, mlp_input, "text")
    stack, labels = cache.decompose_resid(return_labels=True)
    embed, image = stack[labels.index("embed")], stack[labels.index("image_embed")]
    assert not bool(embed[is_image].any()) and not bool(image[~is_image].any())
    torch.testing.assert_close(image[is_image], cache["vision.hook_image_embeds"], rtol=0, atol=0)
    deep = [label for label in labels if label.endswith("_deepstack")]
    assert deep == [f"{layer}_deepstack" for layer in range(model.cfg.n_deepstack_layers)]
    for label in deep:
        layer = int(label.split("_")[0])
        part = stack[labels.index(label)]
        assert labels.index(label) == labels.index(f"{layer}_mlp_out") + 1
        assert not bool(part[~is_image].any())
        torch.testing.assert_close(part[is_image], cache[f"blocks.{layer}.hook_deepstack"], rtol=0, atol=0)
    # accumulated_resid: the last entry is the final residual, and through the final norm the logits
    accumulated = cache.accumulated_resid(apply_ln=True)
    logits = model(inputs)
    torch.testing.assert_close(accumulated[-1] @ model.W_U + model.b_U, logits, rtol=0, atol=1e-5)


def test_batch_sliced_and_batchless_caches_still_add_up():
    model = _model_fresh("qwen3_vl")  # DeepStack features are flattened over the batch's image tokens
    inputs = _inputs(model)
    _, cache = model.run_with_cache(inputs)
    last = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    for batch_slice in (1, [1], [0, 1]):
        sliced = cache.apply_slice_to_batch_dim(batch_slice)
        error = (sliced.decompose_resid().sum(0) - sliced[last]).abs().max()
        assert float(error) <= 1e-5 * float(sliced[last].abs().max()), batch_slice
    one = model.prepare(images=[random_image(64, 64, 1)], prompts=["How many dots are there?"])
    logits, batchless = model.run_with_cache(one, remove_batch_dim=True)
    stack = batchless.get_full_resid_decomposition(pos_slice=-1)
    attrs = batchless.logit_attrs(stack, tokens="3", incorrect_tokens="5", pos_slice=-1, has_batch_dim=False)
    three, five = model.to_single_token("3"), model.to_single_token("5")
    torch.testing.assert_close(attrs.sum(0), logits[0, -1, three] - logits[0, -1, five], rtol=1e-4, atol=1e-6)


def test_decomposition_needs_the_embedding_hooks():
    model = _model_fresh("qwen2_5_vl")
    _, cache = model.run_with_cache(_inputs(model), names_filter=lambda n: "hook_inputs_embeds" not in n)
    with pytest.raises(UserInputError, match="hook_inputs_embeds"):
        cache.decompose_resid()


# ---------------------------------------------------------------------- logit lens
@pytest.mark.parametrize("family", FAMILIES)
def test_transformer_lens_logit_lens_reproduces_the_logits(family):
    model = _model_fresh(family)
    inputs = _inputs(model)
    logits, cache = model.run_with_cache(inputs)
    result = cache.logit_lens(positions=-1)
    assert result.labels[-1] == "final_post" and len(result.labels) == model.cfg.n_layers + 1
    torch.testing.assert_close(result.values[-1], logits[:, -1], rtol=0, atol=1e-5)
    # run by TransformerLens itself, which first checks ln_final -> W_U -> b_U against the model's logits
    answer = model.to_single_token("3")
    ranks = tl_logit_lens(model, inputs, targets="3").rank_trajectory("3")
    expected = (logits[:, -1] > logits[:, -1, answer][:, None]).sum(-1)
    assert ranks[-1].tolist() == expected.tolist()


# ---------------------------------------------------------------------- patching
def _pair_batch(model):
    from vlens.data import make_pair
    from vlens.patching import build_pair_batch

    size = 64 if model.cfg.n_deepstack_layers else 56
    return build_pair_batch(model, [make_pair(2, 3, seed=0, size=size), make_pair(4, 2, seed=1, size=size + 28)])


def _mean_logit_diff(batch):
    from vlens.patching import logit_diff

    rows = torch.arange(batch.n_pairs)

    def metric(logits):
        return logit_diff(logits[rows, batch.final.to(logits.device)], batch.clean_tokens, batch.corrupt_tokens).mean()

    return metric


@pytest.mark.parametrize("family", ["qwen2_5_vl", "llava"])
def test_transformer_lens_patching_agrees_with_vlens_sweeps(family):
    from vlens.patching import patch_layer_head, patch_layer_position

    model = _model_fresh(family)
    batch = _pair_batch(model)  # vlens patches the corrupt run into the clean one: TL's "corrupted" run
    metric = _mean_logit_diff(batch)
    _, corrupt_cache = model.run_with_cache(batch.corrupt)
    heads = tl_patching.get_act_patch_attn_head_out_all_pos(model, batch.clean, corrupt_cache, metric)
    ours = patch_layer_head(model, batch, region="all").metrics["logit_diff"]
    assert heads.shape == ours.shape == (model.cfg.n_layers, model.cfg.n_heads)
    torch.testing.assert_close(heads.cpu(), ours.float(), rtol=0, atol=1e-5)
    assert float(heads.abs().max()) > 1e-3  # the cells differ: a real comparison
    if family == "qwen2_5_vl":
        resid = tl_patching.get_act_patch_resid_pre(model, batch.clean, corrupt_cache, metric)
        ours = patch_layer_position(model, batch, component="resid_pre").metrics["logit_diff"]
        assert resid.shape == ours.shape == (model.cfg.n_layers, batch.seq_len)
        torch.testing.assert_close(resid.cpu(), ours.float(), rtol=0, atol=1e-5)


def test_denoising_equals_transformer_lens_patching_clean_into_corrupt():
    """TransformerLens patches the clean cache into the corrupted run and scores logit[clean answer] -
    logit[corrupt answer]; vlens's direction="denoising" is that sweep, normalised the same way."""
    from tests.helpers.planted import plant_answers, planted_model, planted_pairs
    from vlens.patching import build_pair_batch, logit_diff, patch_layer_head, patch_layer_position

    def restored_metric(batch):  # TL's usual metric: correct (clean) minus incorrect (corrupt) answer
        rows = torch.arange(batch.n_pairs)
        return lambda logits: logit_diff(logits[rows, batch.final.to(logits.device)], batch.corrupt_tokens,
                                         batch.clean_tokens).mean()

    model = _model_fresh("qwen2_5_vl")
    batch = _pair_batch(model)
    restored = restored_metric(batch)
    _, clean_cache = model.run_with_cache(batch.clean)
    tl_heads = tl_patching.get_act_patch_attn_head_out_all_pos(model, batch.corrupt, clean_cache, restored)
    ours = patch_layer_head(model, batch, direction="denoising")
    torch.testing.assert_close(tl_heads.cpu(), ours.metrics["logit_diff"].float(), rtol=0, atol=1e-5)
    tl_resid = tl_patching.get_act_patch_resid_pre(model, batch.corrupt, clean_cache, restored)
    ours_resid = patch_layer_position(model, batch, component="resid_pre", direction="denoising")
    torch.testing.assert_close(tl_resid.cpu(), ours_resid.metrics["logit_diff"].float(), rtol=0, atol=1e-5)
    assert float(tl_resid.abs().max()) > 1e-3  # a real comparison

    # normalised: (m - m_corrupt) / (m_clean - m_corrupt), on a model whose runs differ (the planted head)
    planted = planted_model()
    pairs = build_pair_batch(planted, planted_pairs())
    plant_answers(planted, pairs, scale=50.0)
    restored = restored_metric(pairs)
    _, clean_cache = planted.run_with_cache(pairs.clean)
    tl_heads = tl_patching.get_act_patch_attn_head_out_all_pos(planted, pairs.corrupt, clean_cache, restored)
    with torch.no_grad():
        clean_logits = planted(pairs.clean)
        clean_value, corrupt_value = restored(clean_logits), restored(planted(pairs.corrupt))
    ours = patch_layer_head(planted, pairs, direction="denoising")
    assert ours.effect_floor.defined
    normalised = (tl_heads.cpu() - corrupt_value) / (clean_value - corrupt_value)  # 0 = corrupt, 1 = restored
    # the fast path adds a head's change to the corrupt run: rounding at the logits' magnitude (the
    # planted answers make them large), divided by the small clean - corrupt gap, is the tolerance
    resolution = torch.finfo(torch.float32).eps * float(clean_logits.abs().max())
    atol = 8 * resolution / float((clean_value - corrupt_value).abs())
    torch.testing.assert_close(normalised, ours.metrics["patch_effect"].float(), rtol=1e-4, atol=max(atol, 1e-5))
    assert float(normalised.max()) > 0.9  # the planted head restores the clean answer


def test_transformer_lens_pattern_patching_matches_a_hand_written_hook():
    model = _model_fresh("qwen2_5_vl")
    batch = _pair_batch(model)
    metric = _mean_logit_diff(batch)
    _, corrupt_cache = model.run_with_cache(batch.corrupt, names_filter=lambda n: n.endswith("hook_pattern"))
    swept = tl_patching.get_act_patch_attn_head_pattern_all_pos(model, batch.clean, corrupt_cache, metric)
    layer, head = model.cfg.n_layers - 1, 1
    source = corrupt_cache[f"blocks.{layer}.attn.hook_pattern"]

    def swap_head(pattern, hook):
        pattern = pattern.clone()
        pattern[:, head] = source[:, head]
        return pattern

    with torch.no_grad():
        logits = model.run_with_hooks(batch.clean, fwd_hooks=[(f"blocks.{layer}.attn.hook_pattern", swap_head)])
    assert swept.shape == (model.cfg.n_layers, model.cfg.n_heads)
    torch.testing.assert_close(swept[layer, head], metric(logits), rtol=0, atol=1e-5)


def test_vlm_inputs_have_the_token_surface_patching_reads():
    model = _model_fresh("qwen2_5_vl")
    inputs = _inputs(model)
    assert inputs.shape == inputs.input_ids.shape and inputs.shape[-1] == inputs.seq_len
    assert inputs.device == inputs.input_ids.device


# ---------------------------------------------------------------------- loss and gradients
@pytest.mark.parametrize("family", FAMILIES)
def test_loss_with_labels_equals_hf_and_without_counts_the_text(family):
    model = _model_fresh(family)
    inputs = _inputs(model)
    labels = inputs.input_ids.clone()
    labels[inputs.attention_mask == 0] = -100
    labels[:, :-4] = -100  # the last tokens only, like answer tokens
    with torch.no_grad():
        expected = model.hf_model(**inputs.to_hf_kwargs(), labels=labels).loss
        torch.testing.assert_close(model(inputs, return_type="loss", labels=labels), expected, rtol=1e-5, atol=1e-6)
        logits, loss = model(inputs, return_type="both")
        per_token = model(inputs, return_type="loss", loss_per_token=True)
    # without labels: every next real token that is not an image placeholder
    targets = inputs.input_ids[:, 1:]
    counted = inputs.attention_mask[:, :-1].bool() & inputs.attention_mask[:, 1:].bool()
    counted &= targets != model.cfg.image_token_id
    log_probs = logits[:, :-1].float().log_softmax(-1).gather(-1, targets[..., None])[..., 0]
    torch.testing.assert_close(loss, -log_probs[counted].mean(), rtol=1e-5, atol=1e-6)
    assert per_token.shape == targets.shape and not bool(per_token[~counted].any())
    torch.testing.assert_close(per_token[counted].mean(), loss)
    with pytest.raises(UserInputError, match="labels"):
        model(inputs, return_type="loss", labels=labels[:, 1:])
    with pytest.raises(UserInputError, match="return_type"):
        model(inputs, return_type="loss_sum")


@pytest.mark.parametrize("frozen", [False, True])
def test_run_with_cache_incl_bwd_caches_the_gradients(frozen):
    model = _model_fresh("qwen2_5_vl")
    inputs = _inputs(model)
    name = "blocks.1.hook_resid_pre"
    captured = {}

    def keep(x, hook):
        x.retain_grad()
        captured["x"] = x

    model.zero_grad(set_to_none=True)
    loss = model.run_with_hooks(inputs, return_type="loss", fwd_hooks=[(name, keep)])
    loss.backward()
    expected = captured["x"].grad
    model.zero_grad(set_to_none=True)
    if frozen:
        model.requires_grad_(False)
    try:
        loss, cache = model.run_with_cache(inputs, return_type="loss", incl_bwd=True)
    finally:
        model.requires_grad_(True)
        model.zero_grad(set_to_none=True)
    assert loss.ndim == 0
    # (the cached run materialises attention patterns, the reference uses SDPA: float noise only)
    torch.testing.assert_close(cache[name + "_grad"], expected, rtol=1e-4, atol=1e-7)
    assert "blocks.0.attn.hook_pattern_grad" in cache.cache_dict
    assert not any(hp.fwd_hooks or hp.bwd_hooks for hp in model.hook_dict.values())
    with pytest.raises(UserInputError, match="return_type='loss'"):
        model.run_with_cache(inputs, incl_bwd=True)


# ---------------------------------------------------------------------- the rest of the model surface
def test_factored_OV_and_QK_circuits():
    model = _model_fresh("qwen3_vl")
    OV, QK = model.OV, model.QK
    assert isinstance(OV, FactoredMatrix) and isinstance(QK, FactoredMatrix)
    d = model.cfg.d_model
    assert OV.shape == QK.shape == (model.cfg.n_layers, model.cfg.n_heads, d, d)
    layer, head = 1, 3  # GQA: head 3 reads key/value head 1
    torch.testing.assert_close(OV[layer, head].AB, model.W_V[layer, head] @ model.W_O[layer, head])
    torch.testing.assert_close(QK[layer, head].AB, model.W_Q[layer, head] @ model.W_K[layer, head].T)
    # W_V is the v projection, W_O the output projection (read back from the HF modules)
    x = torch.randn(5, d)
    attn = model.blocks[layer].attn
    v = attn.v_proj(x).view(5, model.cfg.n_key_value_heads, model.cfg.d_head)
    torch.testing.assert_close(x @ model.W_V[layer, head] + model.b_V[layer, head], v[:, head // model.cfg.n_groups])


def test_accumulated_bias_sums_the_output_biases():
    model = _model_fresh("llava", "bias_tied")
    blocks = model.blocks
    expected = blocks[0].attn.o_proj.bias + blocks[0].mlp.down_proj.bias + blocks[1].attn.o_proj.bias
    torch.testing.assert_close(model.accumulated_bias(1, mlp_input=True), expected)
    torch.testing.assert_close(model.accumulated_bias(1, include_mlp_biases=False), blocks[0].attn.o_proj.bias)
    assert not bool(_model_fresh("qwen2_5_vl").accumulated_bias(2).any())  # q/k/v biases never reach the residual


def test_act_name_knows_every_transformer_lens_name_vlens_has():
    model = _model_fresh("qwen3_vl")
    language_hooks = [name for name in model.hook_dict if not name.startswith("vision.")]
    for name in language_hooks:
        assert act_name(name) == name  # full names pass, and the validator knows every hook
    short = {("resid_pre", 0): "blocks.0.hook_resid_pre", ("mlp_pre", 1): "blocks.1.mlp.hook_pre",
             ("mlp_post", 1): "blocks.1.mlp.hook_post", ("attn", 2): "blocks.2.attn.hook_pattern",
             ("attn_logits", 0): "blocks.0.attn.hook_attn_scores", ("key", 1): "blocks.1.attn.hook_k",
             ("k6",): "blocks.6.attn.hook_k", ("scale4ln1",): "blocks.4.ln1.hook_scale",
             ("normalized", 2, "ln2"): "blocks.2.ln2.hook_normalized", ("scale",): "ln_final.hook_scale",
             ("embed",): "hook_embed", ("deepstack", 0): "blocks.0.hook_deepstack"}
    for args, full in short.items():
        assert act_name(*args) == full
    for args in [("pos_embed",), ("mid", 0), ("attn_in", 1), ("z", -1)]:
        with pytest.raises(UserInputError):
            act_name(*args)


def test_add_hook_with_an_unknown_name_suggests_names():
    model = _model_fresh("qwen2_5_vl")
    with pytest.raises(UserInputError, match="blocks.0.hook_resid_pre"):
        model.add_hook("blocks.0.hook_resid_pr", lambda x, hook: x)
    model.add_hook("blocks.0.hook_resid_pre", lambda x, hook: None)
    assert len(model.hook_dict["blocks.0.hook_resid_pre"].fwd_hooks) == 1
    model.reset_hooks()
    model.set_use_split_qkv_input(False)
    with pytest.raises(NotImplementedError, match="hook_q"):
        model.set_use_split_qkv_input(True)
    with pytest.raises(NotImplementedError):
        model.set_use_attn_in(True)


def test_tokenization_helpers():
    llava, qwen = _model_fresh("llava"), _model_fresh("qwen2_5_vl")
    declared = llava.tokenizer.bos_token
    llava.tokenizer.bos_token = "<s>"  # as in LLaVA's own tokenizer (the offline one declares none)
    try:
        bos = llava.tokenizer.bos_token_id
        with_bos = llava.to_tokens("How many", prepend_bos=True)[0].tolist()
        assert with_bos == [bos, *llava.to_tokens("How many")[0].tolist()]
    finally:
        llava.tokenizer.bos_token = declared
    with pytest.raises(UserInputError, match="BOS"):
        qwen.to_tokens("red", prepend_bos=True)
    pad = qwen.tokenizer.pad_token_id
    left = qwen.to_tokens(["How many dots", "red"], padding_side="left")
    right = qwen.to_tokens(["How many dots", "red"], padding_side="right")
    assert left[1, 0] == pad and right[1, -1] == pad and left[1, -1] == right[1, 0]
    three = qwen.to_single_token("3")
    assert qwen.to_single_str_token(three) == "3"
    assert qwen.get_token_position("dots", "How many dots are there ? dots") == 2
    assert qwen.get_token_position("dots", "How many dots are there ? dots", mode="last") == 6
    inputs = qwen.prepare(images=[random_image(56, 56, 0)], prompts=["How many dots are there?"])
    position = qwen.get_token_position("dots", inputs)
    assert int(inputs.input_ids[0, position]) == qwen.to_single_token("dots")
    with pytest.raises(UserInputError, match="does not occur"):
        qwen.get_token_position("red", "How many dots")


def test_bf16_attributions_run_and_are_close_to_fp32():
    exact = _model_fresh("qwen2_5_vl")
    half = _model("qwen2_5_vl", "plain", torch.bfloat16)
    inputs = _inputs(exact)
    logits, _ = exact.run_with_cache(inputs)
    correct, wrong, logit_diff = _answer_pair(logits)
    half_logits, cache = half.run_with_cache(inputs)
    stack = cache.get_full_resid_decomposition(pos_slice=-1)
    attrs = cache.logit_attrs(stack, tokens=correct, incorrect_tokens=wrong, pos_slice=-1)
    spread = float(logits[:, -1].detach().std())
    torch.testing.assert_close(attrs.float().sum(0), logit_diff, rtol=0, atol=0.05 * spread)
    resid = cache[f"blocks.{half.cfg.n_layers - 1}.hook_resid_post"].float()
    assert float((cache.decompose_resid().float().sum(0) - resid).abs().max()) <= 0.02 * float(resid.abs().max())
