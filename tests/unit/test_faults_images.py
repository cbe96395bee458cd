"""Fault family "images": 16-bit, float, palette and alpha images are scaled or composited to the
8-bit RGB they mean (PIL's convert would give white / black), anything ambiguous is refused,
URLs are not fetched unless asked, and only regular image files are read."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from PIL import Image

from vlens.utils.errors import UserInputError
from vlens.utils.images import open_image_file, to_rgb

GREY = 128  # the 8-bit value every test image below means


def pixel(image: Image.Image) -> tuple[int, int, int]:
    assert image.mode == "RGB"
    return image.getpixel((1, 1))


def test_sixteen_bit_is_scaled_not_clipped(tmp_path):
    image = Image.fromarray(np.full((4, 4), GREY * 257, dtype=np.uint16))
    assert image.mode == "I;16" and image.convert("RGB").getpixel((1, 1)) == (255, 255, 255)  # PIL's bug
    assert pixel(to_rgb(image)) == (GREY,) * 3
    image.save(tmp_path / "grey16.png")
    assert pixel(open_image_file(tmp_path / "grey16.png")) == (GREY,) * 3
    assert pixel(to_rgb(image.convert("I"))) == (GREY,) * 3  # 32-bit int holding 16-bit values
    with pytest.raises(UserInputError, match="mode 'I'.*span"):
        to_rgb(Image.fromarray(np.full((4, 4), -5, dtype=np.int32)))


def test_float_images_in_unit_range_are_scaled():
    image = Image.fromarray(np.full((4, 4), GREY / 255, dtype=np.float32), mode="F")
    assert image.convert("RGB").getpixel((1, 1)) == (0, 0, 0)  # PIL's bug
    assert pixel(to_rgb(image)) == (GREY,) * 3
    with pytest.raises(UserInputError, match=r"values in \[0, 1\].*got \[0, 200\]"):
        to_rgb(Image.fromarray(np.linspace(0, 200, 16, dtype=np.float32).reshape(4, 4), mode="F"))
    assert pixel(to_rgb(np.full((4, 4, 3), GREY / 255, dtype=np.float32))) == (GREY,) * 3
    assert pixel(to_rgb(torch.full((3, 8, 8), GREY / 255))) == (GREY,) * 3  # CHW tensor
    with pytest.raises(UserInputError, match="ambiguous"):
        to_rgb(np.full((4, 4), 3, dtype=np.int64))


def test_alpha_and_palette_transparency_composite_over_white():
    rgba = Image.new("RGBA", (4, 4), (0, 0, 0, 0))  # fully transparent black
    assert rgba.convert("RGB").getpixel((1, 1)) == (0, 0, 0)  # PIL drops alpha
    assert pixel(to_rgb(rgba)) == (255, 255, 255)
    assert pixel(to_rgb(Image.new("LA", (4, 4), (0, 0)))) == (255, 255, 255)
    palette = Image.new("P", (4, 4), 0)
    palette.putpalette([0, 0, 0] * 256)
    palette.info["transparency"] = 0
    assert pixel(to_rgb(palette)) == (255, 255, 255)
    assert pixel(to_rgb(Image.new("CMYK", (4, 4), (0, 0, 0, 0)))) == (255, 255, 255)


def test_urls_fifos_and_folders_are_refused(tmp_path):
    with pytest.raises(UserInputError, match="is a URL.*allow_urls=True"):
        to_rgb("http://example.com/x.png")
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    with pytest.raises(UserInputError, match="not a regular file"):
        to_rgb(str(fifo))  # would block forever if opened
    with pytest.raises(UserInputError, match="not a regular file"):
        to_rgb(tmp_path)
    (tmp_path / "bad.png").write_bytes(b"not a png")
    with pytest.raises(UserInputError, match=r"bad\.png: cannot decode"):
        to_rgb(tmp_path / "bad.png")


def test_prepare_uses_the_conversion(qwen_pair):
    _, model = qwen_pair("qwen2_5_vl")
    grey8 = Image.new("RGB", (56, 56), (GREY,) * 3)
    grey16 = Image.fromarray(np.full((56, 56), GREY * 257, dtype=np.uint16))
    prompt = ["How many dots are there?"]
    assert torch.equal(model.prepare(images=[grey16], prompts=prompt).pixel_values,
                       model.prepare(images=[grey8], prompts=prompt).pixel_values)
    with pytest.raises(UserInputError, match="image 0 of prompt 0.*URL"):
        model.prepare(images=["https://example.com/cat.png"], prompts=prompt)
