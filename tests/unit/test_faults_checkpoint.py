"""Fault family "missing checkpoint tensors": a checkpoint lacking a tensor is an error naming it
(HF would silently initialise it at random), unless allow_missing=True."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file, save_file

from vlens import HookedVLM
from vlens.core.loading import MissingWeightsError
from vlens.testing import tiny_hf_model, tiny_qwen_processor


def test_missing_tensor_is_an_error_unless_allowed(tmp_path):
    hf = tiny_hf_model("qwen2_5_vl")
    hf.save_pretrained(tmp_path)
    tiny_qwen_processor().save_pretrained(tmp_path)
    assert HookedVLM.from_pretrained(str(tmp_path)).cfg.n_layers == hf.config.text_config.num_hidden_layers
    weights = load_file(tmp_path / "model.safetensors")
    del weights["model.layers.1.mlp.down_proj.weight"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(MissingWeightsError, match=r"no weights for 1 tensor.*layers\.1\.mlp\.down_proj\.weight"):
        HookedVLM.from_pretrained(str(tmp_path))
    assert HookedVLM.from_pretrained(str(tmp_path), allow_missing=True) is not None
