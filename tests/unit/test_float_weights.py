"""Integer or boolean weights are refused when a model folder, an SAE, transcoders or a lens is read, naming
the tensor (before: copied into float modules, cast without a word)."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from vlens.core.model_folder import ModelFolderError, validate_model_folder
from vlens.lens.translators import Translators
from vlens.sae.registry import build_sae, make_config
from vlens.sae.saelens_format import load_sae, save_sae
from vlens.testing import tiny_hf_model, tiny_qwen_processor
from vlens.transcoders import TranscoderConfig, Transcoders, load_transcoders, save_transcoders
from vlens.utils.errors import UserInputError
from vlens.utils.fileio import check_float_tensors


def _to_integers(file, name: str | None = None, dtype=torch.int32) -> str:
    """Rewrite one tensor of a safetensors file (the first by default) as integers; returns its name."""
    tensors = load_file(str(file))
    name = name or sorted(tensors)[0]
    tensors[name] = tensors[name].round().to(dtype)
    save_file(tensors, str(file))
    return name


def test_a_model_folder_with_an_integer_weight_is_refused(tmp_path):
    folder = tmp_path / "model"
    tiny_hf_model("qwen2_5_vl").save_pretrained(folder)
    tiny_qwen_processor().save_pretrained(folder)
    validate_model_folder(folder)
    broken = tmp_path / "int"
    shutil.copytree(folder, broken)
    layer0 = next(n for n in load_file(str(folder / "model.safetensors")) if n.endswith("layers.0.mlp.down_proj.weight"))
    name = _to_integers(broken / "model.safetensors", layer0)
    with pytest.raises(ModelFolderError, match=rf"not floating point, e\.g\. {name.replace('.', '[.]')} is stored "
                                               "as I32 in model.safetensors"):
        validate_model_folder(broken)


def test_an_sae_with_integer_weights_is_refused(tmp_path):
    sae = build_sae(make_config("standard", d_in=8, d_sae=4, hook_name="blocks.0.hook_resid_post"))
    save_sae(sae, tmp_path / "sae")
    load_sae(tmp_path / "sae")
    _to_integers(tmp_path / "sae" / "sae_weights.safetensors", "W_dec", torch.int64)
    with pytest.raises(UserInputError, match="the SAE weights .*sae_weights.safetensors: W_dec is stored as int64, "
                                             "not floating point"):
        load_sae(tmp_path / "sae")


def test_transcoders_with_boolean_weights_are_refused(tmp_path):
    tc = Transcoders(TranscoderConfig(kind="plt", activation="relu", d_model=8, d_tc=4, layers=(0,)))
    save_transcoders(tc, tmp_path / "tc")
    load_transcoders(tmp_path / "tc")
    weights = next((tmp_path / "tc").glob("*.safetensors"))
    name = _to_integers(weights, dtype=torch.bool)
    with pytest.raises(UserInputError, match=f"the transcoder weights .*: {name} is stored as bool"):
        load_transcoders(tmp_path / "tc")


def test_a_lens_with_integer_weights_is_refused(tmp_path):
    Translators(2, 8, {"model_name": "x"}).save(tmp_path / "lens")
    Translators.load(tmp_path / "lens")
    _to_integers(tmp_path / "lens" / "translators.safetensors", "A", torch.int8)
    with pytest.raises(UserInputError, match="the lens weights .*: A is stored as int8, not floating point"):
        Translators.load(tmp_path / "lens")


def test_float_tensors_of_every_precision_pass():
    tensors = {str(d): torch.zeros(2, dtype=d) for d in (torch.float16, torch.bfloat16, torch.float32, torch.float64)}
    assert check_float_tensors(tensors, "x") is tensors
