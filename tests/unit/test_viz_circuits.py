"""circuitsvis views and the token labels they use."""

import json
import re

import pytest
import torch

from vlens.viz.circuits import (
    attention_heads_view,
    attention_patterns_view,
    circuitsvis_bundle_js,
    circuitsvis_html,
    token_labels,
)

# <s> [2x2 image] "How" [1x2 image] "\n"
TOKENS = ["<s>", "<img>", "<img>", "<img>", "<img>", "How", "<img>", "<img>", "\n"]
POSITIONS = [torch.tensor([1, 2, 3, 4]), [6, 7]]
GRIDS = [(2, 2), (1, 2)]


def test_token_labels_name_image_cells_and_keep_text():
    labels = token_labels(TOKENS, POSITIONS, GRIDS)
    assert labels == [
        "<s>",
        "img0[r0,c0]",
        "img0[r0,c1]",
        "img0[r1,c0]",
        "img0[r1,c1]",
        "How",
        "img1[r0,c0]",
        "img1[r0,c1]",
        "\\n",
    ]


def test_token_labels_make_unique_and_errors():
    assert token_labels(["a", "b", "a", "a"], make_unique=True) == ["a", "b", "a#1", "a#2"]
    with pytest.raises(ValueError, match="grid 2x2 has 4 cells"):
        token_labels(TOKENS, [torch.tensor([1, 2, 3])], [(2, 2)])
    with pytest.raises(ValueError, match="grids"):
        token_labels(TOKENS, POSITIONS, GRIDS[:1])
    with pytest.raises(IndexError, match="outside"):
        token_labels(TOKENS[:3], [[1, 2, 3, 4]], [(2, 2)])


def _props(view) -> dict:
    snippet = circuitsvis_html(view, div_id="view-1")
    match = re.search(
        r'CircuitsVis\.render\("view-1", CircuitsVis\.(\w+), (.*)\);</script>', snippet, re.DOTALL
    )
    assert match is not None
    return {"component": match[1], **json.loads(match[2].replace("<\\/", "</"))}


def test_attention_heads_view_names_heads_and_passes_labels():
    pattern = torch.softmax(torch.randn(3, len(TOKENS), len(TOKENS)), dim=-1).to(torch.bfloat16)
    labels = token_labels(TOKENS, POSITIONS, GRIDS)
    props = _props(attention_heads_view(pattern, labels, layer=19))
    assert props["component"] == "AttentionHeads"
    assert props["attentionHeadNames"] == ["L19H0", "L19H1", "L19H2"]
    assert props["tokens"] == labels
    assert len(props["attention"]) == 3 and len(props["attention"][0]) == len(TOKENS)


def test_attention_patterns_view_subset_of_positions():
    pattern = torch.rand(2, len(TOKENS), len(TOKENS))
    props = _props(attention_patterns_view(pattern, TOKENS, positions=[0, 5, 8]))
    assert props["component"] == "AttentionPatterns"
    assert props["tokens"] == ["<s>", "How", "\n"]
    assert torch.tensor(props["attention"]).shape == (2, 3, 3)


def test_views_reject_mismatched_shapes():
    with pytest.raises(ValueError, match="n_pos"):
        attention_heads_view(torch.rand(2, 4, 4), ["a", "b", "c"])
    with pytest.raises(ValueError, match="pattern"):
        attention_heads_view(torch.rand(1, 2, 3, 3), ["a", "b", "c"])
    with pytest.raises(ValueError, match="head names"):
        attention_heads_view(torch.rand(2, 3, 3), ["a", "b", "c"], head_names=["x"])


def test_snippet_is_offline_and_script_safe():
    view = attention_heads_view(torch.rand(1, 2, 2), ["</script>", "b"])
    snippet = circuitsvis_html(view)
    assert "unpkg" not in snippet and "http" not in snippet
    assert snippet.count("</script>") == 1  # only the real closing tag
    bundle = circuitsvis_bundle_js()
    assert "var CircuitsVis" in bundle and "</script>" not in bundle
