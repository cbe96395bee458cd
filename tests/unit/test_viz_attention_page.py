"""`vlens.viz.attention_patterns`: one offline circuitsvis page per layer, image tokens labelled by cell."""

from __future__ import annotations

import functools
import json
import re
import subprocess

import pytest
import torch

from tests.helpers.browser import CHROMIUM
from vlens import HookedVLM
from vlens.testing import (
    random_image,
    tiny_hf_model,
    tiny_llava_next_model,
    tiny_llava_next_processor,
    tiny_qwen_processor,
)
from vlens.utils.errors import UserInputError
from vlens.viz import attention_patterns, image_token_labels
from vlens.viz.circuits import circuitsvis_bundle_js


@functools.lru_cache(maxsize=2)
def _model(family: str = "qwen2_5_vl") -> HookedVLM:
    if family == "llava_next":
        return HookedVLM.from_hf(tiny_llava_next_model(), processor=tiny_llava_next_processor())
    return HookedVLM.from_hf(tiny_hf_model(family), processor=tiny_qwen_processor())


def _inputs(model):
    return model.prepare(images=[random_image(56, 56, 1), random_image(84, 56, 2)],
                         prompts=["How many dots are there?", "red"])


def _outside_the_bundle(page: str) -> str:
    bundle = circuitsvis_bundle_js()
    assert page.count(bundle.replace("</script>", "<\\/script>")) == 1  # inlined once
    return page.replace(bundle, "")


def test_labels_name_every_image_token_by_its_grid_cell():
    model = _model()
    inputs = _inputs(model)
    for row in range(2):
        labels = image_token_labels(model, inputs, row)
        rows, cols = inputs.regions.image_grid[row][0]
        positions = inputs.regions.images[row][0].tolist()
        assert [labels[p] for p in positions] == [f"img0[r{r},c{c}]" for r in range(rows) for c in range(cols)]
        text = inputs.regions.text[row].tolist()
        assert [labels[p] for p in text] == [model.to_str_tokens(inputs.input_ids[row, p])[0].replace("\n", "\\n")
                                             for p in text]
    assert len(set(image_token_labels(model, inputs, 0))) > len(inputs.regions.images[0][0])  # no repeated pads


def test_page_is_self_contained_and_shows_the_labels(tmp_path):
    model = _model()
    inputs = _inputs(model)
    path = tmp_path / "attention.html"
    page = attention_patterns(model, inputs, layer=1, path=path, row=1)
    assert path.read_text(encoding="utf-8") == page
    rest = _outside_the_bundle(page)
    assert not re.search(r"https?://|//unpkg|cdn\.", rest)  # outside the inlined bundle: no address at all
    assert not re.search(r"<(script|img|link|iframe)[^>]*\b(src|href)\s*=", page)  # nothing is loaded
    props = json.loads(re.search(r"CircuitsVis\.AttentionHeads, (\{.*\})\);</script>", rest, re.S)[1])
    keep = inputs.attention_mask[1].bool()
    labels = [label for label, k in zip(image_token_labels(model, inputs, 1), keep.tolist(), strict=True) if k]
    assert props["tokens"] == labels and "img0[r1,c2]" in labels
    # the pattern drawn is the model's, padding dropped
    _, cache = model.run_with_cache(inputs, names_filter=["blocks.1.attn.hook_pattern"])
    expected = cache["blocks.1.attn.hook_pattern"][1][:, keep][:, :, keep]
    torch.testing.assert_close(torch.tensor(props["attention"]), expected, atol=1e-5, rtol=0)
    assert props["attentionHeadNames"] == [f"L1H{h}" for h in range(model.cfg.n_heads)]
    assert all(not hp.fwd_hooks for hp in model.hook_dict.values())


def test_patterns_view_positions_and_errors():
    model = _model()
    inputs = _inputs(model)
    image = inputs.regions.images[0][0].tolist()[:5]
    page = attention_patterns(model, inputs, layer=0, positions=image, view="patterns")
    props = json.loads(re.search(r"CircuitsVis\.AttentionPatterns, (\{.*\})\);</script>", page, re.S)[1])
    rows, cols = inputs.regions.image_grid[0][0]
    assert props["tokens"] == [f"img0[r{c // cols},c{c % cols}]" for c in range(len(image))]
    assert torch.tensor(props["attention"]).shape[-2:] == (len(image), len(image))

    with pytest.raises(UserInputError, match="layer 9"):
        attention_patterns(model, inputs, layer=9)
    with pytest.raises(UserInputError, match="positions"):
        attention_patterns(model, inputs, layer=0, positions=[10_000])


def test_tiled_images_label_their_tiles():
    model = _model("llava_next")
    inputs = model.prepare(images=[random_image(96, 64, 3)], prompts=["How many dots are there?"])
    labels = image_token_labels(model, inputs, 0)
    kinds = {record.kind for record in inputs.regions.tiles[0][0]}
    assert "tile" in kinds
    image_labels = [labels[p] for p in inputs.regions.image[0].tolist()]
    assert all(label.startswith("img0") for label in image_labels)
    assert any(label.startswith("img0.tile0[r0,c0]") for label in image_labels)
    assert len(set(image_labels)) == len(image_labels)  # every image token is told apart


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium (/usr/bin/chromium) is not installed")
def test_page_renders_the_labels_offline_in_chromium(tmp_path):
    model = _model()
    path = tmp_path / "attention.html"
    attention_patterns(model, _inputs(model), layer=1, path=path, row=1, view="patterns")
    result = subprocess.run([str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                             "--disable-background-networking", "--virtual-time-budget=10000", "--dump-dom",
                             path.as_uri()], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    body = result.stdout.split("<body", 1)[1]
    drawn = re.sub(r"<script.*?</script>", "", body, flags=re.S)
    assert "img0[r1,c2]" in drawn  # circuitsvis drew the token labels (from the inlined bundle, offline)


def test_the_page_shows_a_summary_not_its_html(tmp_path):
    model = _model()
    inputs = _inputs(model)
    page = attention_patterns(model, inputs, layer=1, path=tmp_path / "a.html")
    assert isinstance(page, str) and (tmp_path / "a.html").read_text(encoding="utf-8") == page
    n_positions = int(inputs.attention_mask[0].sum())
    assert repr(page) == (f"AttentionPage(layer 1, {model.cfg.n_heads} heads, {n_positions} positions, "
                          f"{len(page) / 1e6:.1f} MB of HTML, written to {tmp_path / 'a.html'})")
    assert page._repr_html_() == str.__str__(page)  # a notebook renders the page itself


def test_to_str_tokens_of_inputs_labels_image_tokens_by_cell():
    model = _model()
    inputs = _inputs(model)
    rows = model.to_str_tokens(inputs)
    assert len(rows) == 2
    for row, tokens in enumerate(rows):
        images = {int(p) for image in inputs.regions.images[row] for p in image}
        labels = image_token_labels(model, inputs, row)
        text = model.to_str_tokens(inputs.input_ids[row])
        assert tokens == [f"<{labels[p]}>" if p in images else text[p] for p in range(len(text))]
    first = inputs.regions.images[0][0][0]
    assert rows[0][first] == "<img0[r0,c0]>"
