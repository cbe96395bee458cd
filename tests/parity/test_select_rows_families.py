"""`VLMInputs.select_rows` on batches whose rows hold different numbers of images (0, 1, 2), every family:
the selected rows run as those rows prepared alone, and inputs whose layout is unknown are refused."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.helpers.models import FAMILIES, tiny_vlm
from vlens.testing.common import random_image
from vlens.utils.errors import UserInputError

PROMPTS = ["red", "blue green ?", "red blue"]
IMAGES = [[random_image(28, 28, 1)], [], [random_image(28, 28, 2), random_image(28, 28, 3)]]
# reordered, a single row with two images, a row without an image first, a single row of one image
ORDERS = ([1, 2, 0], [2], [1, 0], [0])
# Llama 4's chunked attention counts chunks from the padded start (HF's too): a row's logits depend on its left
# padding, which a selection keeps from the whole batch. Its orders keep the longest row (row 2), so the padding
# agrees with the rows prepared alone.
SAME_PADDING_ONLY = {"llama4"}


@pytest.mark.parametrize("family", FAMILIES)
def test_selected_rows_run_as_those_rows_prepared_alone(family):
    model = tiny_vlm(family)
    batch = model.prepare(images=IMAGES, prompts=PROMPTS)
    assert batch.token_regions.still_image_counts() == [1, 0, 2]
    for rows in [r for r in ORDERS if 2 in r] if family in SAME_PADDING_ONLY else ORDERS:
        chosen = batch.select_rows(rows)
        alone = model.prepare(images=[IMAGES[r] for r in rows], prompts=[PROMPTS[r] for r in rows])
        with torch.no_grad():
            got, want = model(chosen).float(), model(alone).float()
        for i in range(len(rows)):  # left padding differs between the two batches: compare the real positions
            real_got, real_want = chosen.attention_mask[i].bool(), alone.attention_mask[i].bool()
            assert torch.equal(chosen.input_ids[i][real_got], alone.input_ids[i][real_want])
            torch.testing.assert_close(got[i][real_got], want[i][real_want], atol=1e-5, rtol=0,
                                       msg=lambda m, rows=rows, i=i: f"{family} rows {rows}, row {i}: {m}")


def test_inputs_without_a_pixel_layout_are_refused():
    batch = tiny_vlm("llava").prepare(images=IMAGES, prompts=PROMPTS)
    with pytest.raises(UserInputError, match="laid out"):
        dataclasses.replace(batch, pixel_entries=None).select_rows([0])
    with pytest.raises(UserInputError, match="names 2 images but the prompts hold 3"):
        dataclasses.replace(batch, pixel_entries=[1, 2]).select_rows([0])


def test_an_extra_of_no_known_axis_is_refused_not_dropped():
    batch = tiny_vlm("llava_next").prepare(images=IMAGES, prompts=PROMPTS)
    odd = dataclasses.replace(batch, extra={**batch.extra, "mystery": torch.zeros(7, 2)})
    with pytest.raises(UserInputError, match="'mystery'"):
        odd.select_rows([0])
