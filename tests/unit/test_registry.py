"""The open architecture registry: a family registered from a module outside vlens (by decorator and
through the `vlens.adapters` entry-point group) converts its model with logits equal to HF's."""

from __future__ import annotations

import importlib
import logging
import sys
import textwrap

import pytest
import torch

import vlens
from tests.helpers.arch_parity import assert_logits_match, input_matrix
from vlens.core.architectures import registry
from vlens.core.model import HookedVLM
from vlens.testing import tiny_hf_model, tiny_qwen_processor
from vlens.utils.errors import UserInputError

# a third-party package: its own HF class (a Qwen2.5-VL under another name) and its adapter
PLUGIN = textwrap.dedent('''
    import vlens
    from transformers import Qwen2_5_VLForConditionalGeneration
    from vlens.core.architectures.qwen2_vl import Qwen2_5_VLAdapter


    class ExternalVLMForConditionalGeneration(Qwen2_5_VLForConditionalGeneration):
        pass


    @vlens.register_adapter
    class ExternalVLMAdapter(Qwen2_5_VLAdapter):
        hf_class_names = ("ExternalVLMForConditionalGeneration",)
        family = "external_vlm"

        def hf_model_class(self, class_name):
            return ExternalVLMForConditionalGeneration
''')


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    """A folder on sys.path holding the plugin module; every family it registers is removed after."""
    (tmp_path / "vlens_external_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(vlens.registered_adapters())
    yield tmp_path
    for family in set(registry.registered_adapters()) - before:
        registry.unregister_adapter(family)
    for name in [m for m in sys.modules if m.startswith("vlens_external_plugin") or m.startswith("broken_plugin")]:
        del sys.modules[name]


def external_model(module, seed: int = 3):
    """A random model of the plugin's HF class, from the tiny Qwen2.5-VL config at unusual sizes."""
    source = tiny_hf_model("qwen2_5_vl", seed=seed, n_layers=3, d_model=48, n_heads=6, n_kv_heads=2, d_mlp=80)
    model = module.ExternalVLMForConditionalGeneration(source.config).eval()
    model.load_state_dict(source.state_dict())
    return model


def test_a_family_registered_from_outside_the_package_matches_hf(plugin_dir):
    module = importlib.import_module("vlens_external_plugin")
    hf = external_model(module)
    model = HookedVLM.from_hf(hf, processor=tiny_qwen_processor())
    assert type(model.adapter).__name__ == "ExternalVLMAdapter" and model.adapter.family == "external_vlm"
    assert "ExternalVLMForConditionalGeneration" in vlens.supported_architectures()
    assert vlens.adapter_for("external_vlm").family == "external_vlm"
    assert_logits_match(model, hf, input_matrix(model, [(56, 56), (84, 56), (56, 112), (56, 56), (112, 84), (84, 84)]))


def test_entry_point_group_registers_a_plugin_and_its_folder_loads(plugin_dir, tmp_path):
    # an installed distribution advertising the plugin in the vlens.adapters group
    dist = plugin_dir / "vlens_external_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vlens-external-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[vlens.adapters]\nexternal = vlens_external_plugin\n")
    importlib.invalidate_caches()
    assert "external_vlm" not in vlens.registered_adapters()
    registry.discover_adapters(reload=True)
    assert "external_vlm" in vlens.registered_adapters()

    module = sys.modules["vlens_external_plugin"]
    hf = external_model(module, seed=5)
    hf.config.architectures = ["ExternalVLMForConditionalGeneration"]
    folder = tmp_path / "external"
    hf.save_pretrained(folder)
    tiny_qwen_processor().save_pretrained(folder)
    loaded = HookedVLM.from_pretrained(str(folder), device="cpu")
    assert loaded.adapter.family == "external_vlm" and type(loaded.hf_model) is module.ExternalVLMForConditionalGeneration
    inputs = loaded.prepare(prompts=["How many dots are there?"])
    with torch.no_grad():
        torch.testing.assert_close(loaded(inputs), hf(**inputs.to_hf_kwargs()).logits, atol=1e-4, rtol=0)


def test_a_broken_plugin_is_skipped_with_a_warning(plugin_dir, caplog):
    (plugin_dir / "broken_plugin.py").write_text("raise RuntimeError('plugin bug')\n")
    dist = plugin_dir / "broken_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[vlens.adapters]\nbroken = broken_plugin\n")
    importlib.invalidate_caches()
    with caplog.at_level(logging.WARNING, logger="vlens.core.architectures.registry"):
        registry.discover_adapters(reload=True)
    assert "'broken'" in caplog.text and "plugin bug" in caplog.text
    assert "qwen2_5_vl" in vlens.registered_adapters()


def test_a_taken_name_is_refused_unless_replaced(plugin_dir):
    from vlens.core.architectures.qwen2_vl import Qwen2_5_VLAdapter

    class Impostor(Qwen2_5_VLAdapter):
        family = "impostor"

    with pytest.raises(UserInputError, match="already registered.*replace=True"):
        vlens.register_adapter(Impostor)
    assert "impostor" not in vlens.registered_adapters()  # nothing half-registered

    class Nameless(vlens.ArchitectureAdapter):
        pass

    with pytest.raises(UserInputError, match="hf_class_names"):
        vlens.register_adapter(Nameless)
    with pytest.raises(UserInputError, match="ArchitectureAdapter subclass"):
        vlens.register_adapter(object)


def test_replace_overrides_a_built_in_family_and_from_hf_takes_an_adapter(plugin_dir):
    from vlens.core.architectures.qwen2_vl import Qwen2_5_VLAdapter

    original = registry.adapter_class_for("Qwen2_5_VLForConditionalGeneration")

    class Mine(Qwen2_5_VLAdapter):
        family = "qwen2_5_vl"

    try:
        vlens.register_adapter(Mine, replace=True)
        hf = tiny_hf_model("qwen2_5_vl")
        assert type(HookedVLM.from_hf(hf).adapter) is Mine
    finally:
        vlens.register_adapter(original, replace=True)
    hf = tiny_hf_model("qwen2_5_vl")
    assert type(HookedVLM.from_hf(hf).adapter) is original
    assert type(HookedVLM.from_hf(hf, adapter=Mine).adapter) is Mine  # a class
    assert type(HookedVLM.from_hf(hf, adapter=Mine()).adapter) is Mine  # an instance
    assert HookedVLM.from_hf(hf, adapter="qwen2_5_vl").adapter.family == "qwen2_5_vl"  # a family name
    with pytest.raises(UserInputError, match="second argument is the adapter"):
        HookedVLM.from_hf(hf, tiny_qwen_processor())  # the old positional processor


def test_unsupported_architecture_names_the_families_and_the_way_to_add_one():
    with pytest.raises(UserInputError, match="register_adapter") as error:
        vlens.adapter_for("GPT2LMHeadModel")
    assert "qwen2_5_vl" in str(error.value) and "Qwen2_5_VLForConditionalGeneration" in str(error.value)


def test_built_in_families_are_advertised_as_entry_points():
    tomllib = pytest.importorskip("tomllib")
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    advertised = set(pyproject["project"]["entry-points"][registry.ENTRY_POINT_GROUP].values())
    built_in = {a.__module__ for a in vlens.registered_adapters().values() if a.__module__.startswith("vlens.")}
    assert built_in == advertised, "list every built-in family module under [project.entry-points.\"vlens.adapters\"]"


def test_vlens_info_lists_the_families_without_loading_a_model(capsys):
    from vlens.cli import main

    assert main(["info", "--families", "--model", "no-such-model"]) == 0
    out = capsys.readouterr().out
    for family, adapter in vlens.registered_adapters().items():
        assert f"  {family}: {', '.join(adapter.hf_class_names)}" in out
    assert "LlavaNextForConditionalGeneration" in out and "LlavaOnevisionForConditionalGeneration" in out
    for name in ("InternVLForConditionalGeneration", "Idefics3ForConditionalGeneration",
                 "SmolVLMForConditionalGeneration", "Gemma3ForConditionalGeneration"):
        assert name in out
