"""`vlens.load_result`: every command's --out folder reads back as its typed result, whose `to_dict()`
equals what was saved (the family tests check the other commands: tests/helpers/family_commands.py)."""

from __future__ import annotations

import importlib
import json

import pytest

import vlens
from tests.helpers.family_commands import check_loads_back, counting_folder, run
from vlens.utils.results import BUILTIN_KINDS, RESULT_KINDS, Result


def _subclasses(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def test_every_result_type_has_a_kind_and_reads_back():
    import pkgutil

    for module in pkgutil.walk_packages(vlens.__path__, "vlens."):  # every Result subclass in the package
        importlib.import_module(module.name)
    # one class per name (a test that reloads a module leaves the old class behind)
    types = list({(cls.__module__, cls.__qualname__): cls for cls in _subclasses(Result)
                  if cls.__module__.startswith("vlens.")}.values())
    assert len(types) >= 20
    kinds = [cls.kind for cls in types]
    assert all(kinds) and len(set(kinds)) == len(kinds), kinds  # one kind per type
    for cls in types:
        assert BUILTIN_KINDS[cls.kind] == cls.__module__, cls  # load_result finds it without importing everything
        assert RESULT_KINDS[cls.kind].__qualname__ == cls.__qualname__
        readers = {"from_dict", "from_saved"} & set(cls.__dict__)  # from_saved: parts in other files of the folder
        assert readers, f"{cls.__qualname__} cannot be read back"
    lens = BUILTIN_KINDS["lens"].split(":")
    assert getattr(importlib.import_module(lens[0]), lens[1]).kind == "lens"


def test_patch_modes_headlens_lens_and_study_load_back(tmp_path):
    model = "tiny"
    for mode, expected in (("layer-region", "PatchingResult"), ("layer-pos", "PatchingResult"),
                           ("atp", "AttributionResult")):
        extra = ["--compare-exact"] if mode == "atp" else []
        run(["patch", "--model", model, "--make-pairs", "2", "--mode", mode, *extra, "--out", str(tmp_path / mode)])
        loaded = check_loads_back(tmp_path / mode, expected)
        assert loaded.extras["model"] == model and loaded.extras["world_size"] == 1  # the command's own keys
        assert check_loads_back(tmp_path / mode / "results.json", expected).to_dict() == loaded.to_dict()
    atp = vlens.load_result(tmp_path / "atp")
    assert atp.exact_z is not None and atp.per_pair_z.shape == (2, *atp.z.shape)
    # headlens training its own lens: the taxonomy, the lens folder and its training report
    run(["headlens", "--model", model, "--make", "2", "--lens-make", "2", "--lens-steps", "1", "--k", "3",
         "--out", str(tmp_path / "headlens")])
    taxonomy = check_loads_back(tmp_path / "headlens", "HeadTaxonomy")
    assert taxonomy.stability is not None and taxonomy.counts() == json.loads(
        (tmp_path / "headlens" / "results.json").read_text())["counts"]
    lens = check_loads_back(tmp_path / "headlens" / "lens", "Translators")
    assert lens.n_layers == taxonomy.shape[0]
    check_loads_back(tmp_path / "headlens" / "lens_kl.json", "TrainingReport")
    run(["study", "--model", "random-tiny", "--seeds", "0", "--n-train", "1", "--n-eval", "1", "--lora-rank", "2",
         "--top-k-heads", "1", "--out", str(tmp_path / "study")])
    check_loads_back(tmp_path / "study", "StudyResult")


def test_load_result_says_what_is_wrong(tmp_path):
    with pytest.raises(vlens.UserInputError, match="does not exist"):
        vlens.load_result(tmp_path / "missing")
    data = counting_folder(tmp_path, n=1)
    with pytest.raises(vlens.UserInputError, match="holds no result but a dataset"):
        vlens.load_result(data)  # a dataset folder is no result
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "model" / "model.safetensors").write_bytes(b"")
    with pytest.raises(vlens.UserInputError, match="holds no result but a model"):
        vlens.load_result(tmp_path / "model")
    (tmp_path / "empty").mkdir()
    with pytest.raises(vlens.UserInputError, match="holds no result"):
        vlens.load_result(tmp_path / "empty")
    (tmp_path / "old.json").write_text(json.dumps({"mode": "layer-head"}))
    with pytest.raises(vlens.UserInputError, match="records no result \"kind\""):
        vlens.load_result(tmp_path / "old.json")
    (tmp_path / "other.json").write_text(json.dumps({"kind": "no_such_kind"}))
    with pytest.raises(vlens.UserInputError, match="unknown result kind 'no_such_kind'"):
        vlens.load_result(tmp_path / "other.json")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(vlens.UserInputError, match="not a JSON result file"):
        vlens.load_result(tmp_path / "broken.json")
    from vlens.patching import PatchingResult
    (tmp_path / "taxonomy.json").write_text(json.dumps({"kind": "head_taxonomy"}))
    with pytest.raises(vlens.UserInputError, match="holds a 'head_taxonomy' result, not a 'patching' one"):
        PatchingResult.load(tmp_path / "taxonomy.json")


def test_a_trained_sae_loads_back_with_its_weights(tmp_path):
    import torch

    from vlens.sae.activations import TensorSource
    from vlens.sae.settings import SAETraining
    from vlens.sae.trainer import train_sae

    x = torch.randn(512, 8, generator=torch.Generator().manual_seed(0))
    result = train_sae(TensorSource(x, 256), SAETraining(architecture="topk", k=2, d_sae=16, total_tokens=512,
                                                          batch_size=64, buffer_size=256, warmup_steps=1))
    result.save(tmp_path / "sae")
    loaded = check_loads_back(tmp_path / "sae", "TrainedSAE")
    for name, value in result.sae.state_dict().items():
        assert torch.equal(loaded.sae.state_dict()[name].to(value.dtype), value), name


def test_sae_feature_views_load_back(tmp_path):
    import torch

    from tests.helpers.models import tiny_vlm
    from vlens.sae import build_sae, make_config
    from vlens.sae.features import FeatureViewOptions, feature_views
    from vlens.testing import random_image

    model = tiny_vlm("qwen2_5_vl")
    sae = build_sae(make_config("standard", d_in=model.cfg.d_model, d_sae=4, hook_name="blocks.1.hook_resid_post"))
    sae.initialize(torch.Generator().manual_seed(0), decoder_norm=1.0)
    with torch.no_grad():
        sae.b_enc.fill_(0.5)
    views = feature_views(model, sae, [(random_image(seed=i), "how many a") for i in range(3)],
                          FeatureViewOptions(features=(0, 1), top_k=2))
    views.save(tmp_path / "features")
    loaded = check_loads_back(tmp_path / "features", "FeatureViews")
    assert loaded.views[0].top_images and loaded.views[0].top_images[0].grid == views.views[0].top_images[0].grid


def test_sae_commands_load_back(tmp_path):
    common = ["--model", "random-tiny", "--image-size", "56", "--prompts-per-forward", "4"]
    run(["sae", "train", "--hook", "blocks.1.hook_resid_post", "--positions", "all", "--make", "4", "--d-sae", "16",
         "--k", "2", "--tokens", "256", "--batch-tokens", "64", "--buffer", "128", "--evaluate", "2",
         "--out", str(tmp_path / "sae"), *common])
    trained = check_loads_back(tmp_path / "sae", "TrainedSAE")
    assert trained.extras["evaluation"]["kind"] == "sae_splice_evaluation"  # what the command adds beside it
    run(["sae", "dashboard", "--sae", str(tmp_path / "sae"), "--make", "3", "--features", "0,1", "--top-k", "2",
         "--out", str(tmp_path / "dash"), *common])
    assert [v.feature for v in check_loads_back(tmp_path / "dash", "FeatureViews").views] == [0, 1]
