"""A tiny random model folder for any family (`vlens.testing.write_tiny_folder`, `vlens tiny`): it loads with
`HookedVLM.from_pretrained` and with the family's HF class, logits equal; every family the adapter
registry runs has one (a new family's builders are found by their names)."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from vlens import HookedVLM
from vlens.cli import main
from vlens.core.architectures.registry import registered_adapters
from vlens.testing import write_tiny_folder
from vlens.testing.families import tiny_families
from vlens.utils.errors import UserInputError
from vlens.verify.cases import cases

# the default suite writes three kinds of family (M-RoPE, anyres tiles, perceiver latents); -m slow every one
QUICK = ("qwen2_5_vl", "llava_next", "idefics2")


def assert_folder_loads_both_ways(folder) -> HookedVLM:
    model = HookedVLM.from_pretrained(str(folder), device="cpu", dtype=torch.float32)
    config = json.loads((folder / "config.json").read_text())
    hf = getattr(transformers, config["architectures"][0]).from_pretrained(str(folder), dtype=torch.float32,
                                                                           attn_implementation="eager").eval()
    inputs = cases(model)["one_image"]()
    with torch.no_grad():
        ours = model(inputs)
        theirs = hf(**inputs.to_hf_kwargs()).logits
    assert ours.shape == theirs.shape
    assert torch.allclose(ours, theirs, atol=1e-4, rtol=0), float((ours - theirs).abs().max())
    return model


@pytest.mark.parametrize("family", QUICK)
def test_a_tiny_folder_loads_with_vlens_and_hf_logits_equal(tmp_path, family):
    assert_folder_loads_both_ways(write_tiny_folder(family, tmp_path / family))


@pytest.mark.slow
@pytest.mark.parametrize("family", [f for f in tiny_families() if f not in QUICK])
def test_every_family_tiny_folder_loads_with_vlens_and_hf(tmp_path, family):
    assert_folder_loads_both_ways(write_tiny_folder(family, tmp_path / family))


def test_every_family_the_registry_runs_has_a_tiny_model():
    runnable = {name for name, adapter in registered_adapters().items() if getattr(adapter, "refusal", None) is None}
    assert runnable <= set(tiny_families()), sorted(runnable - set(tiny_families()))


def test_sizes_unlike_the_defaults_reach_the_config(tmp_path):
    folder = write_tiny_folder("qwen2_5_vl", tmp_path / "m", seed=3, n_layers=3, d_model=48, n_heads=6, d_mlp=40)
    model = assert_folder_loads_both_ways(folder)
    assert (model.cfg.n_layers, model.cfg.d_model, model.cfg.n_heads) == (3, 48, 6)
    assert json.loads((folder / "tiny.json").read_text())["sizes"]["d_model"] == 48


def test_bad_requests_are_user_errors(tmp_path):
    with pytest.raises(UserInputError, match="no tiny model of the family 'nope'.*llava"):
        write_tiny_folder("nope", tmp_path / "a")
    with pytest.raises(UserInputError, match="takes no such size"):
        write_tiny_folder("llava", tmp_path / "b", n_wings=2)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "keep.txt").write_text("mine")
    with pytest.raises(UserInputError, match="not an empty folder"):
        write_tiny_folder("llava", tmp_path / "c")


def test_the_command_writes_a_folder_that_loads(tmp_path, capsys):
    out = tmp_path / "tiny-llava"
    assert main(["tiny", "--family", "llava", "--config", "n_layers=3", "--out", str(out), "--quiet"]) == 0
    model = assert_folder_loads_both_ways(out)
    assert model.cfg.n_layers == 3
    assert main(["tiny", "--family", "llava", "--out", str(out), "--quiet"]) == 2  # not without --overwrite
    assert main(["tiny", "--family", "gemma3", "--out", str(out), "--overwrite", "--quiet"]) == 0
    assert json.loads((out / "tiny.json").read_text())["family"] == "gemma3"
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "config.json").write_text("{}")
    assert main(["tiny", "--family", "llava", "--out", str(foreign), "--overwrite", "--quiet"]) == 2
    assert (foreign / "config.json").read_text() == "{}"  # a folder vlens tiny did not write is never replaced
    capsys.readouterr()
    assert main(["tiny", "--list"]) == 0
    assert set(capsys.readouterr().out.split()) == set(tiny_families())
