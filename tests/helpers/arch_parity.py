"""The parity matrix every architecture must pass, written once for any (HF model, HookedVLM) pair.

Each check compares HookedVLM against the HF model it wraps (fp32, eager attention), with the
same edit made on the HF side through PyTorch hooks where the check is about an edit.
"""

from __future__ import annotations

import pytest
import torch


def hf_attention(model, hf, layer: int):
    """The HF token mixer of decoder layer `layer`: its self-attention, or its linear attention
    (`linear_attn`, a hybrid decoder's Gated DeltaNet; `conv`, LFM2's short convolution) where it has none."""
    hf_layer = model.adapter.language_model(hf).layers[layer]
    return getattr(hf_layer, "self_attn", None) or getattr(hf_layer, "linear_attn", None) or hf_layer.conv


def input_matrix(model, sizes: list[tuple[int, int]]) -> dict:
    """The parity suite's inputs, from six (width, height) image sizes: one image; two images of
    different sizes in one prompt; a left-padded batch of two; text only (one row, and a padded
    batch); a batch with a text-only row."""
    from vlens.testing import random_image

    img = [random_image(w, h, seed) for seed, (w, h) in enumerate(sizes, start=1)]
    return {
        "one_image": model.prepare(images=[img[0]], prompts=["How many dots are there?"]),
        "two_images_different_sizes": model.prepare(images=[[img[1], img[2]]], prompts=["What colour is the"]),
        "left_padded_batch": model.prepare(images=[img[3], img[4]], prompts=["How many dots are there?", "red"]),
        "text_only": model.prepare(prompts=["How many dots are there?"]),
        "text_only_padded_batch": model.prepare(prompts=["How many dots are there?", "red"]),
        "mixed_batch_with_text_only_row": model.prepare(images=[img[5], None], prompts=["red ?", "yes no"]),
    }


def assert_logits_match(model, hf, cases: dict, atol: float = 1e-4) -> None:
    """Logits equal HF eager at every position (padding included) for each named input."""
    for name, inputs in cases.items():
        with torch.no_grad():
            expected = hf(**inputs.to_hf_kwargs()).logits
            ours = model(inputs)
            explicit = model.run_with_hooks(inputs, fwd_hooks=[(lambda n: n.endswith("hook_pattern"),
                                                                lambda x, hook: x)])
        assert ours.shape == expected.shape, name
        torch.testing.assert_close(ours, expected, atol=atol, rtol=0, msg=f"sdpa path / {name}")
        torch.testing.assert_close(explicit, expected, atol=atol, rtol=0, msg=f"explicit path / {name}")


def assert_hook_shapes(model, inputs) -> dict:
    """The decoder hooks have TransformerLens shapes; returns the cache for family-specific checks."""
    model.set_use_attn_result(True)
    try:
        _, cache = model.run_with_cache(inputs, attn_scores=True)
    finally:
        model.set_use_attn_result(False)
    c = model.cfg
    b, p = inputs.input_ids.shape
    n_img = sum(len(r) for r in inputs.regions.image)
    expected = {
        "hook_embed": (b, p, c.d_model),
        "hook_inputs_embeds": (b, p, c.d_model),
        "vision.hook_image_embeds": (n_img, c.d_model),
        "blocks.0.hook_resid_pre": (b, p, c.d_model),
        "blocks.0.hook_resid_mid": (b, p, c.d_model),
        "blocks.0.hook_attn_out": (b, p, c.d_model),
        "blocks.0.hook_mlp_out": (b, p, c.d_model),
        "blocks.0.ln1.hook_scale": (b, p, 1),
        "blocks.0.ln1.hook_normalized": (b, p, c.d_model),
        f"blocks.{c.n_layers - 1}.hook_resid_mid": (b, p, c.d_model),
        "blocks.0.attn.hook_q": (b, p, c.n_heads, c.d_head),
        "blocks.0.attn.hook_k": (b, p, c.n_key_value_heads, c.d_head),
        "blocks.0.attn.hook_v": (b, p, c.n_key_value_heads, c.d_head),
        "blocks.0.attn.hook_rot_q": (b, p, c.n_heads, c.d_head),
        "blocks.0.attn.hook_rot_k": (b, p, c.n_key_value_heads, c.d_head),
        "blocks.0.attn.hook_attn_scores": (b, c.n_heads, p, p),
        "blocks.0.attn.hook_pattern": (b, c.n_heads, p, p),
        "blocks.0.attn.hook_z": (b, p, c.n_heads, c.d_head),
        "blocks.0.attn.hook_result": (b, p, c.n_heads, c.d_model),
        "blocks.0.mlp.hook_pre": (b, p, c.d_mlp),
        "blocks.0.mlp.hook_pre_linear": (b, p, c.d_mlp),
        "blocks.0.mlp.hook_post": (b, p, c.d_mlp),
        f"blocks.{c.n_layers - 1}.hook_resid_post": (b, p, c.d_model),
        "ln_final.hook_scale": (b, p, 1),
        "ln_final.hook_normalized": (b, p, c.d_model),
    }
    for name, shape in expected.items():
        assert tuple(cache[name].shape) == shape, name
    return cache


def assert_head_decomposition(model, inputs) -> None:
    """sum_h z_h @ W_O[h] + b_O == hook_attn_out at every layer."""
    _, cache = model.run_with_cache(inputs)
    for layer in range(model.cfg.n_layers):
        attn = model.blocks[layer].attn
        per_head = torch.einsum("bphd,hdm->bphm", cache[f"blocks.{layer}.attn.hook_z"], attn.W_O)
        torch.testing.assert_close(per_head.sum(2) + attn.b_O, cache[f"blocks.{layer}.hook_attn_out"],
                                   atol=1e-5, rtol=0, msg=f"layer {layer}")


def hf_logits(hf, inputs, forward_hooks=(), pre_hooks=()):
    """HF logits with temporary PyTorch hooks: (module, fn) pairs, removed on return."""
    handles = [m.register_forward_hook(fn) for m, fn in forward_hooks]
    handles += [m.register_forward_pre_hook(fn) for m, fn in pre_hooks]
    try:
        with torch.no_grad():
            return hf(**inputs.to_hf_kwargs()).logits
    finally:
        for handle in handles:
            handle.remove()


def assert_hook_z_edit_matches_hf(model, hf, inputs, layer: int, head: int) -> None:
    """Editing one head's z equals the same edit on the input of HF's o_proj (out_proj for linear attention)."""
    d_head = model.cfg.d_head_at(layer)
    cols = slice(head * d_head, (head + 1) * d_head)

    def edit_z(z, hook):
        z = z.clone()
        z[:, :, head] = 0.5 * z[:, :, head] + 0.1
        return z

    def edit_o_proj_input(module, args):
        x = args[0].clone()
        x[..., cols] = 0.5 * x[..., cols] + 0.1
        return (x,)

    with torch.no_grad():
        ours = model.run_with_hooks(inputs, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", edit_z)])
    attn = hf_attention(model, hf, layer)
    expected = hf_logits(hf, inputs, pre_hooks=[(getattr(attn, "o_proj", None) or attn.out_proj, edit_o_proj_input)])
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)


def assert_scores_edit_matches_scaling_q(model, hf, inputs, layer: int, head: int, beta: float = 1.7) -> None:
    """Scaling one head's scores equals scaling its query in HF after the q norm (if any), before rotary.

    Rotary is linear, so scaling q before it equals scaling after it. With a q norm (Qwen3-VL, Gemma 3)
    the scale must come after the norm, which would otherwise undo it.
    """
    d_head = model.cfg.d_head
    attn = hf_attention(model, hf, layer)

    def scale_scores(scores, hook):
        scores = scores.clone()
        scores[:, head] = scores[:, head] * beta
        return scores

    def scale_q(module, args, output):
        output = output.clone()
        if output.shape[-1] == d_head:  # q_norm output, heads on the adapter's axis ([b, pos, heads, d] or [b, heads, pos, d])
            index = [slice(None)] * output.ndim
            index[model.adapter.query_norm_head_axis] = head
            output[tuple(index)] *= beta
        else:  # q_proj output [b, pos, heads * d_head]
            output[..., head * d_head:(head + 1) * d_head] *= beta
        return output

    q_module = getattr(attn, "q_norm", None) or getattr(attn, "q_layernorm", None) or attn.q_proj
    with torch.no_grad():
        ours = model.run_with_hooks(inputs, fwd_hooks=[(f"blocks.{layer}.attn.hook_attn_scores", scale_scores)])
        plain = model(inputs)
    expected = hf_logits(hf, inputs, forward_hooks=[(q_module, scale_q)])
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)
    assert (ours - plain).abs().max() > 1e-4  # the edit did something


def assert_generate_matches_hf(model, hf, inputs, max_new_tokens: int = 6) -> None:
    """Greedy tokens equal HF generate's."""
    out = model.generate(inputs, max_new_tokens=max_new_tokens)
    with torch.no_grad():
        expected = hf.generate(**inputs.to_hf_kwargs(), max_new_tokens=max_new_tokens, do_sample=False)
    new = expected[:, inputs.seq_len:]
    assert torch.equal(out.tokens[:, : new.shape[1]], new), (out.tokens, new)


def assert_no_hooks_left_after_exception(model, inputs, hook_names: list[str]) -> None:
    """A hook that raises leaves no hook behind (run_with_hooks, hooks(), generate)."""

    def boom(x, hook):
        raise RuntimeError("hook failed")

    for name in hook_names:
        with pytest.raises(RuntimeError, match="hook failed"):
            model.run_with_hooks(inputs, fwd_hooks=[(name, boom)])
        with pytest.raises(RuntimeError, match="hook failed"), model.hooks(fwd_hooks=[(name, boom)]):
            model(inputs)
    with pytest.raises(RuntimeError, match="hook failed"):
        model.generate(inputs, max_new_tokens=2, fwd_hooks=[(hook_names[0], boom)])
    leftover = [name for name, hp in model.hook_dict.items() if hp.fwd_hooks or hp.bwd_hooks]
    assert leftover == []
    assert not any(block.attn.needs_pattern() for block in model.blocks)


def assert_saved_checkpoint_loads(hf, processor, folder, images, prompt: str = "How many dots are there?") -> None:
    """save_pretrained -> HookedVLM.from_pretrained rebuilds the family, its processor, and HF's logits."""
    from vlens import HookedVLM

    hf.save_pretrained(folder)
    processor.save_pretrained(folder)
    model = HookedVLM.from_pretrained(str(folder))
    inputs = model.prepare(images=[images], prompts=[prompt])
    with torch.no_grad():
        torch.testing.assert_close(model(inputs), hf(**inputs.to_hf_kwargs()).logits, atol=1e-4, rtol=0)
    assert model.cfg.architecture == type(hf).__name__


def assert_bf16_within_hf_noise(hf, processor, make_inputs, slack: float = 2.0) -> None:
    """In bf16, HookedVLM is as close to HF fp32 as HF's own bf16 is: max |ours_bf16 - hf_fp32| over the
    real tokens is at most `slack` x max |hf_bf16 - hf_fp32| (+ 1e-3). `make_inputs(model)` builds the inputs.

    The bf16 HF model is a copy of `hf` (left in fp32)."""
    import copy

    from vlens import HookedVLM

    hf16 = copy.deepcopy(hf).to(torch.bfloat16)
    model16 = HookedVLM.from_hf(hf16, processor=processor)
    assert model16.cfg.dtype == torch.bfloat16
    inputs = make_inputs(model16)
    real = inputs.attention_mask.bool()
    with torch.no_grad():
        reference = hf(**inputs.to_hf_kwargs()).logits.float()[real]
        hf_noise = (hf16(**inputs.to_hf_kwargs()).logits.float()[real] - reference).abs().max()
        ours = (model16(inputs).float()[real] - reference).abs().max()
    assert hf_noise > 0, "HF's bf16 run should differ from fp32"
    assert ours <= slack * hf_noise + 1e-3, (float(ours), float(hf_noise))


def assert_vision_head_and_projector_edits_match_hf(model, hf, inputs, layers, projector, n_heads: int,
                                                    layer: int = 1, head: int = 1) -> None:
    """Dropping one vision head (`vision.blocks.{layer}.attn.hook_z`), flipping the projector's input
    (`vision.hook_image_features`) and zeroing its output (`vision.hook_image_embeds`) equal the same edits on
    HF's tower `layers` (an attention with `out_proj`) and `projector`."""

    def drop_head(z, hook):
        z = z.clone()
        z[..., head, :] = 0
        return z

    def drop_head_hf(module, args):
        x = args[0].clone()
        width = x.shape[-1] // n_heads
        x[..., head * width:(head + 1) * width] = 0
        return (x,)

    torch.testing.assert_close(
        model.run_with_hooks(inputs, fwd_hooks=[(f"vision.blocks.{layer}.attn.hook_z", drop_head)]),
        hf_logits(hf, inputs, pre_hooks=[(layers[layer].self_attn.out_proj, drop_head_hf)]), atol=1e-4, rtol=0)
    torch.testing.assert_close(
        model.run_with_hooks(inputs, fwd_hooks=[("vision.hook_image_features", lambda x, hook: x.flip(1))]),
        hf_logits(hf, inputs, pre_hooks=[(projector, lambda m, args: (args[0].flip(1), *args[1:]))]), atol=1e-4,
        rtol=0)
    torch.testing.assert_close(
        model.run_with_hooks(inputs, fwd_hooks=[("vision.hook_image_embeds", lambda x, hook: x * 0)]),
        hf_logits(hf, inputs, forward_hooks=[(projector, lambda m, a, out: out * 0)]), atol=1e-4, rtol=0)
