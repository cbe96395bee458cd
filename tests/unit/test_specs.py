"""Model specs (`vlens.load_model`), and the user errors of device, dtype and resolution settings."""

from __future__ import annotations

import logging

import pytest
import torch

from vlens.core.devices import configure_resolution, resolve_device, resolve_dtype
from vlens.testing import (
    random_image,
    tiny_hf_model,
    tiny_qwen3_vl_processor,
    tiny_qwen_processor,
)
from vlens.utils.errors import UserInputError
from vlens.zoo.specs import load_model, looks_like_path, resolve_spec


def test_spec_kinds(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_spec("tiny") == ("embedded", "tiny")
    assert resolve_spec("random-tiny") == ("random", "random-tiny")
    assert resolve_spec("Qwen/Qwen2.5-VL-7B-Instruct") == ("hub", "Qwen/Qwen2.5-VL-7B-Instruct")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"model_type": "qwen2_5_vl"}')
    assert resolve_spec("model") == ("folder", "model")
    assert resolve_spec("./model")[0] == "folder"


@pytest.mark.parametrize("spec, message", [
    ("./nope", "no such folder"), ("~/surely/not/here", "no such folder"), ("a/b/c", "no such folder"),
    ("runs/ckpt", "no such folder"),  # ./runs exists: a path, never the hub user "runs"
    ("tyni", "nor a hub id"), ("org/", "nor a hub id"), ("", "empty"),
    ("model.txt", "is a file"), ("empty", "holds no config.json"),
    ("notes", "config.json names no model_type"), ("broken", "config.json is not valid JSON"),
])
def test_bad_specs_fail_before_anything_is_loaded(tmp_path, monkeypatch, spec, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    (tmp_path / "empty").mkdir()
    (tmp_path / "model.txt").write_text("x")
    for name, config in (("notes", b'{"hidden_size": 8}'), ("broken", b"\xff{")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_bytes(config)
    with pytest.raises(UserInputError, match=message):
        resolve_spec(spec)


def test_looks_like_path():
    assert looks_like_path("./x") and looks_like_path("/x") and looks_like_path("~/x") and looks_like_path("a/b/c")
    assert not looks_like_path("Qwen/Qwen2.5-VL-7B-Instruct") and not looks_like_path("tiny")


def test_bare_tiny_is_the_embedded_model_even_beside_a_tiny_folder(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny").mkdir()
    with caplog.at_level(logging.WARNING, logger="vlens.zoo.specs"):
        assert resolve_spec("tiny") == ("embedded", "tiny")
    assert "pass ./tiny" in caplog.text
    with pytest.raises(UserInputError, match="holds no config.json"):
        resolve_spec("./tiny")  # the folder, explicitly


def test_random_tiny_is_the_test_suites_tiny_model_in_the_asked_dtype():
    model = load_model("random-tiny", device="cpu", dtype="bf16", progress=False)
    reference = tiny_hf_model("qwen2_5_vl").state_dict()
    state = model.hf_model.state_dict()
    assert state.keys() == reference.keys()
    assert all(state[k].dtype == torch.bfloat16 for k in state if state[k].is_floating_point())
    key = "model.language_model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(state[key], reference[key].to(torch.bfloat16))
    assert model.cfg.dtype == torch.bfloat16 and not model.training


def _grid(processor, width, height):
    return processor.image_processor(images=[random_image(width, height)], return_tensors="pt")["image_grid_thw"][0]


def test_image_size_must_be_a_whole_number_of_merged_patches():
    processor = tiny_qwen_processor()
    configure_resolution(processor, image_size=112)
    assert _grid(processor, 112, 112).tolist() == [1, 8, 8]  # 112 px / 14 px patches
    assert _grid(processor, 56, 56).tolist() == [1, 8, 8]  # small images are scaled up to the budget
    with pytest.raises(UserInputError, match="not a multiple of 28.*use e.g. 112"):
        configure_resolution(processor, image_size=110)  # Qwen would silently feed 84 px
    qwen3 = tiny_qwen3_vl_processor()
    with pytest.raises(UserInputError, match="multiple of 32"):
        configure_resolution(qwen3, image_size=112)
    configure_resolution(qwen3, image_size=128)
    assert _grid(qwen3, 128, 128).tolist() == [1, 8, 8]  # 16 px patches


def test_bad_devices_and_dtypes_are_user_errors():
    with pytest.raises(UserInputError, match="not a torch device"):
        resolve_device("gpu0")
    with pytest.raises(UserInputError, match="unknown dtype"):
        resolve_dtype("float8")
