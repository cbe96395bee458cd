"""Checks the anyres families (LLaVA-NeXT, LLaVA-OneVision) share, against the HF model they wrap.

- `assert_regions_follow_hf_packing`: each image's token count, and every tile record, read back
  from HF's own packed features: the HF projector output is replaced by markers (channel 0: the
  tile's layout row, 1: its column, 2: 1 on high-resolution tiles, 3: 1 on the base view) and
  HF's `image_newline` by a marker of its own, so HF's packing (unpad, OneVision's bilinear
  downscale, newlines) tells which tile each placeholder token came from.
- `assert_anyres_hooks_and_decoder_edits`: the hook shapes (every vision block, per-head vision
  `hook_z`, the anyres hooks), the head decomposition and the decoder's hook_z / scores edits.
- `assert_anyres_edits_match_hf`: edits on `vision.hook_tile_embeds`, `vision.hook_image_features`,
  `vision.hook_image_newline`, `vision.hook_image_embeds`, a vision block and a vision head equal
  the same edits made on the HF model.
"""

from __future__ import annotations

import torch
from transformers.image_processing_utils import select_best_resolution

from tests.helpers.arch_parity import (
    assert_head_decomposition,
    assert_hook_shapes,
    assert_hook_z_edit_matches_hf,
    assert_scores_edit_matches_scaling_q,
    hf_logits,
)


def _hf_packed(hf, inputs, projector_out=None, newline=None) -> list[torch.Tensor]:
    """HF's per-image packed image features (get_image_features' pooler_output), optionally with the
    projector output replaced by `projector_out(out)` and image_newline by `newline`."""
    model = hf.model
    handles = []
    if projector_out is not None:
        handles.append(model.multi_modal_projector.register_forward_hook(lambda mod, args, out: projector_out(out)))
    saved = model.image_newline.detach().clone()
    try:
        with torch.no_grad():
            if newline is not None:
                model.image_newline.copy_(newline)
            kwargs = {k: v for k, v in inputs.to_hf_kwargs().items()
                      if k in ("image_sizes", "batch_num_images", "vision_feature_layer",
                               "vision_feature_select_strategy")}
            return list(model.get_image_features(inputs.pixel_values, **kwargs).pooler_output)
    finally:
        with torch.no_grad():
            model.image_newline.copy_(saved)
        for handle in handles:
            handle.remove()


def assert_regions_follow_hf_packing(model, hf, inputs) -> None:
    """inputs.regions (tiles, newlines, counts) equal what HF's packing does with marked tiles."""
    adapter, regions = model.adapter, inputs.regions
    d_model = model.cfg.d_model
    sizes = adapter.image_sizes(inputs)
    tiles = adapter.tiles_per_image(inputs)
    tile_side = hf.config.vision_config.image_size
    pinpoints = hf.config.image_grid_pinpoints

    def markers(out):
        marked = torch.zeros_like(out)
        start = 0
        for size, n in zip(sizes, tiles, strict=True):
            layout_cols = select_best_resolution(size, pinpoints)[1] // tile_side
            for k in range(n):
                if k == 0:
                    marked[start, :, 3] = 1.0
                else:
                    marked[start + k, :, 0] = (k - 1) // layout_cols
                    marked[start + k, :, 1] = (k - 1) % layout_cols
                    marked[start + k, :, 2] = 1.0
            start += n
        return marked

    newline = torch.zeros(d_model)
    newline[4] = 1.0
    packed = _hf_packed(hf, inputs, markers, newline)
    per_image = [records for row in regions.tiles for records in row]
    positions = [p for row in regions.images for p in row]
    assert [len(p) for p in packed] == [len(p) for p in positions]
    for features, image_positions, records in zip(packed, positions, per_image, strict=True):
        offset = {int(p): k for k, p in enumerate(image_positions.tolist())}
        seen = sorted(int(p) for r in records for p in r.positions)
        assert seen == sorted(offset), "the records must hold every token of the image exactly once"
        for record in records:
            rows = features[[offset[int(p)] for p in record.positions]]
            assert rows.shape[0] == record.grid[0] * record.grid[1], record
            if record.kind == "newline":
                torch.testing.assert_close(rows[:, 4], torch.ones(len(rows)))
            elif record.kind == "base":
                torch.testing.assert_close(rows[:, 3], torch.ones(len(rows)))
            elif record.kind == "tile":
                # tiles: exact markers, or after OneVision's bilinear downscale the tile that holds the
                # token's centre weighs most (within half a cell on each axis)
                torch.testing.assert_close(rows[:, 2], torch.ones(len(rows)), atol=1e-5, rtol=0)
                assert (rows[:, 0] - record.layout[0]).abs().max() <= 0.5 + 1e-5, record
                assert (rows[:, 1] - record.layout[1]).abs().max() <= 0.5 + 1e-5, record
            else:  # an untiled image (OneVision multi-image): one tile (+ CLS), the base view's marker
                assert record.kind in ("image", "cls"), record
                torch.testing.assert_close(rows[:, 3], torch.ones(len(rows)))


def assert_anyres_edits_match_hf(model, hf, inputs, vision_block: int = 0, vision_head: int = 1) -> None:
    """Edits on the anyres vision hooks equal the same edits on the HF model."""
    mm = hf.model
    projector = mm.multi_modal_projector
    delta = torch.linspace(-1, 1, model.cfg.d_model)

    def ours(hooks):
        with torch.no_grad():
            return model.run_with_hooks(inputs, fwd_hooks=hooks)

    with torch.no_grad():
        plain = model(inputs)
    # projector output, every tile
    got = ours([("vision.hook_tile_embeds", lambda x, hook: x * 0.5 + delta)])
    expected = hf_logits(hf, inputs, forward_hooks=[(projector, lambda mod, args, out: out * 0.5 + delta)])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    assert (got - plain).abs().max() > 1e-4
    # projector input
    got = ours([("vision.hook_image_features", lambda x, hook: x * 0.25)])
    expected = hf_logits(hf, inputs, pre_hooks=[(projector, lambda mod, args: (args[0] * 0.25,))])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    # the newline vector
    got = ours([("vision.hook_image_newline", lambda x, hook: x + delta)])
    saved = mm.image_newline.detach().clone()
    try:
        with torch.no_grad():
            mm.image_newline.add_(delta)
        expected = hf_logits(hf, inputs)
    finally:
        with torch.no_grad():
            mm.image_newline.copy_(saved)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    assert (got - plain).abs().max() > 1e-4
    # the packed features (zero every image token): HF with a zero projector output and a zero newline
    got = ours([("vision.hook_image_embeds", lambda x, hook: x * 0)])
    try:
        with torch.no_grad():
            mm.image_newline.zero_()
        expected = hf_logits(hf, inputs, forward_hooks=[(projector, lambda mod, args, out: out * 0)])
    finally:
        with torch.no_grad():
            mm.image_newline.copy_(saved)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    # a vision block's output (= its MLP output + the residual) and one vision head
    tower = mm.vision_tower
    layers = getattr(tower, "vision_model", tower).encoder.layers
    width = hf.config.vision_config.hidden_size
    shift = torch.linspace(-1, 1, width)
    got = ours([(f"vision.blocks.{vision_block}.hook_resid_post", lambda x, hook: x + shift)])
    expected = hf_logits(hf, inputs, forward_hooks=[(layers[vision_block].mlp.fc2, lambda mod, args, out: out + shift)])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    assert (got - plain).abs().max() > 1e-4
    heads = hf.config.vision_config.num_attention_heads
    d_head = width // heads

    def drop_head(z, hook):
        z = z.clone()
        z[..., vision_head, :] = 0
        return z

    def drop_head_hf(module, args):
        x = args[0].clone()
        x[..., vision_head * d_head:(vision_head + 1) * d_head] = 0
        return (x,)

    got = ours([(f"vision.blocks.{vision_block}.attn.hook_z", drop_head)])
    expected = hf_logits(hf, inputs, pre_hooks=[(layers[vision_block].self_attn.out_proj, drop_head_hf)])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    assert (got - plain).abs().max() > 1e-4


def assert_anyres_hooks_and_decoder_edits(model, hf, inputs) -> None:
    """TransformerLens hook shapes (decoder, every vision block and head, the anyres hooks), the per-head
    decomposition, and hook_z / hook_attn_scores edits equal to the same edits on HF."""
    cache = assert_hook_shapes(model, inputs)
    vision = hf.config.vision_config
    n_tiles, width, heads = sum(model.adapter.tiles_per_image(inputs)), vision.hidden_size, vision.num_attention_heads
    assert cache["vision.hook_tile_embeds"].shape[::2] == (n_tiles, model.cfg.d_model)
    assert cache["vision.hook_image_newline"].shape == (model.cfg.d_model,)
    for block in range(vision.num_hidden_layers):
        assert cache[f"vision.blocks.{block}.hook_resid_post"].shape[::2] == (n_tiles, width)
        assert cache[f"vision.blocks.{block}.attn.hook_z"].shape[2:] == (heads, width // heads)
    assert_head_decomposition(model, inputs)
    assert_hook_z_edit_matches_hf(model, hf, inputs, layer=1, head=1)
    assert_scores_edit_matches_scaling_q(model, hf, inputs, layer=0, head=1)
