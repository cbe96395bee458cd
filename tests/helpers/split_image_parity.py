"""Checks the split-image families (InternVL's tiles + thumbnail, Idefics3 / SmolVLM's sub-images + global
image) share, against the HF model they wrap.

- `assert_regions_follow_hf_features`: every tile record read back from what HF's own forward puts at
  the placeholders: the projector output is replaced by markers (channel 0: the sub-image's index
  among the tower's frames, 1: the token's index within it), and the embeddings HF's text model
  receives say which frame and token each placeholder holds.
- `assert_layout_follows_pixels`: on an image whose colour ramps with x (red) and y (green), each
  tile's pixels (from the processor) have the colour of the middle of the box its layout cell covers.
- `assert_split_image_edits_match_hf`: edits on a vision block, a vision head, the projector input
  (`vision.hook_image_features`), its output (`vision.hook_tile_embeds`) and `vision.hook_image_embeds`
  equal the same edits made on the HF model.
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from tests.helpers.arch_parity import hf_logits
from vlens.core.architectures.base import layout_box


def _hf_text_inputs(hf, language_model, inputs, projector, markers) -> torch.Tensor:
    """The inputs_embeds HF's text model gets when the projector's output is replaced by `markers(out)`."""
    seen = {}

    def grab(module, args, kwargs):
        seen["embeds"] = kwargs["inputs_embeds"].detach().clone()

    handles = [projector.register_forward_hook(lambda mod, args, out: markers(out)),
               language_model.register_forward_pre_hook(grab, with_kwargs=True)]
    try:
        with torch.no_grad():
            hf(**inputs.to_hf_kwargs())
    finally:
        for handle in handles:
            handle.remove()
    return seen["embeds"]


def assert_regions_follow_hf_features(model, hf, inputs, projector) -> None:
    """Each record of inputs.regions.tiles holds the tokens of the frame (sub-image) its `index` names, in
    row-major order, as HF's forward places them; regions.image is exactly the placeholder tokens."""
    regions = inputs.regions

    def markers(out):  # out: [n_frames, tokens..., d] (Aya Vision's projector keeps the token grid: rows, cols)
        marked = torch.zeros(out.shape[0], out[0, ..., 0].numel(), out.shape[-1], dtype=out.dtype)
        marked[:, :, 0] = torch.arange(marked.shape[0], dtype=out.dtype)[:, None]
        marked[:, :, 1] = torch.arange(marked.shape[1], dtype=out.dtype)[None, :]
        return marked.reshape(out.shape)

    embeds = _hf_text_inputs(hf, model.adapter.language_model(hf), inputs, projector, markers)
    placeholders = (inputs.input_ids == model.cfg.image_token_id) & inputs.attention_mask.bool()
    first_frame = 0
    for row in range(inputs.batch_size):
        assert regions.image[row].tolist() == placeholders[row].nonzero().flatten().tolist()
        for records in regions.tiles[row]:
            seen = sorted(int(p) for r in records for p in r.positions)
            assert len(seen) == len(set(seen)), "a token sits in two records"
            for record in records:
                got = embeds[row, record.positions]
                torch.testing.assert_close(got[:, 0], torch.full((len(got),), float(first_frame + record.index)))
                torch.testing.assert_close(got[:, 1], torch.arange(len(got), dtype=got.dtype))
                assert len(got) == record.grid[0] * record.grid[1]
            first_frame += len(records)
        assert sorted(int(p) for rs in regions.tiles[row] for r in rs for p in r.positions) == regions.image[row].tolist()


def ramp_image(width: int, height: int) -> Image.Image:
    """Red ramps 0 -> 255 left to right, green top to bottom, blue constant."""
    x = np.linspace(0, 255, width)[None, :].repeat(height, 0)
    y = np.linspace(0, 255, height)[:, None].repeat(width, 1)
    return Image.fromarray(np.stack([x, y, np.full_like(x, 128)], axis=-1).astype(np.uint8))


def assert_layout_follows_pixels(model, width: int, height: int, frames_of) -> None:
    """On a ramp image, each tile's mean red / green (the processor's pixels, unnormalised) is the ramp's
    value at the middle of the box `layout_box` gives its layout cell (within 6%).

    frames_of(inputs): the image's tiles as pixel arrays [n_tiles, C, H, W], in the records' `index` order.
    """
    inputs = model.prepare(images=[ramp_image(width, height)], prompts=["red"])
    processor = model.processor.image_processor
    mean = torch.tensor(processor.image_mean)[:, None, None]
    std = torch.tensor(processor.image_std)[:, None, None]
    frames = frames_of(inputs) * std + mean  # [n, 3, H, W] in 0..1
    records = [r for r in inputs.regions.tiles[0][0] if r.kind == "tile"]
    assert records, "the ramp image should be split"
    for record in records:
        assert record.layout is not None and record.layout_grid is not None, record
        x0, y0, x1, y1 = layout_box((width, height), record.layout, record.layout_grid)
        red, green = frames[record.index, 0].mean(), frames[record.index, 1].mean()
        assert abs(float(red) - (x0 + x1) / 2 / width) < 0.06, (record, float(red))
        assert abs(float(green) - (y0 + y1) / 2 / height) < 0.06, (record, float(green))


def assert_split_image_edits_match_hf(model, hf, inputs, vision_layers, out_projection, projector, block: int = 0,
                                      head: int = 1) -> None:
    """Edits on the vision hooks equal the same edits on the HF model.

    vision_layers: the HF tower's blocks; out_projection(layer): a block's attention output projection;
    projector: the HF module whose input is `vision.hook_image_features` and output `vision.hook_tile_embeds`.
    """
    def ours(hooks):
        with torch.no_grad():
            return model.run_with_hooks(inputs, fwd_hooks=hooks)

    with torch.no_grad():
        plain = model(inputs)
    width = out_projection(vision_layers[block]).out_features
    shift = torch.linspace(-1, 1, width)
    got = ours([(f"vision.blocks.{block}.hook_resid_post", lambda x, hook: x + shift)])
    # prepended, so that HF's own hidden-state capture (a hook on the same block) records the edited output
    handle = vision_layers[block].register_forward_hook(  # a block may return (hidden, ...) (Llama 4's)
        lambda mod, args, out: (out[0] + shift, *out[1:]) if isinstance(out, tuple) else out + shift, prepend=True)
    try:
        expected = hf_logits(hf, inputs)
    finally:
        handle.remove()
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    assert (got - plain).abs().max() > 1e-4

    n_heads = hf.config.vision_config.num_attention_heads
    d_head = width // n_heads

    def drop_head(z, hook):
        z = z.clone()
        z[..., head, :] = 0
        return z

    def drop_head_hf(module, args):
        x = args[0].clone()
        x[..., head * d_head:(head + 1) * d_head] = 0
        return (x,)

    got = ours([(f"vision.blocks.{block}.attn.hook_z", drop_head)])
    expected = hf_logits(hf, inputs, pre_hooks=[(out_projection(vision_layers[block]), drop_head_hf)])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    assert (got - plain).abs().max() > 1e-4

    # features reversed, not only scaled: a projector that starts with a LayerNorm (Aya Vision's) ignores a scale
    got = ours([("vision.hook_image_features", lambda x, hook: x.flip(-1) * 0.25)])
    expected = hf_logits(hf, inputs, pre_hooks=[(projector, lambda mod, args: (args[0].flip(-1) * 0.25,))])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    assert (got - plain).abs().max() > 1e-4

    delta = torch.linspace(-1, 1, model.cfg.d_model)
    got = ours([("vision.hook_tile_embeds", lambda x, hook: x * 0.5 + delta)])
    expected = hf_logits(hf, inputs, forward_hooks=[(projector, lambda mod, args, out: out * 0.5 + delta)])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    assert (got - plain).abs().max() > 1e-4

    got = ours([("vision.hook_image_embeds", lambda x, hook: x * 0)])
    expected = hf_logits(hf, inputs, forward_hooks=[(projector, lambda mod, args, out: out * 0)])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
