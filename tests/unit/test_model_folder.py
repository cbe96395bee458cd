"""`validate_model_folder`: a model folder is checked whole, from the safetensors headers, before any
weight is read; each broken folder is one `ModelFolderError` naming the file and the fix, and the
intact folders of every built-in family pass (no false alarm)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
from pathlib import Path

import pytest
import torch

from tests.helpers.models import FAMILIES, build_pair
from vlens.core.loading import HubUnreachableError, check_hub_reachable
from vlens.core.model import HookedVLM
from vlens.core.model_folder import MissingWeightsError, ModelFolderError, validate_model_folder
from vlens.testing import tiny_hf_model, tiny_qwen_processor


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("models") / "good"
    tiny_hf_model("qwen2_5_vl").save_pretrained(folder)
    tiny_qwen_processor().save_pretrained(folder)
    return folder


def _copy(good: Path, tmp_path: Path, name: str = "broken") -> Path:
    folder = tmp_path / name
    shutil.copytree(good, folder, symlinks=True)
    return folder


def _edit_config(folder: Path, edit) -> None:
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config, indent=1))


def _refused(folder: Path, *needles: str, error: type = ModelFolderError, **kwargs) -> str:
    with pytest.raises(error) as caught:
        validate_model_folder(folder, **kwargs)
    message = str(caught.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message
    return message


def test_the_folder_passes(good):
    found = validate_model_folder(good)
    assert found.class_name == "Qwen2_5_VLForConditionalGeneration" and found.processor is not None


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_folder_passes(family, tmp_path):
    """No false alarm: the saved folder of every built-in family (MoE experts, hybrid layers, anyres
    tiling, tied embeddings included) passes, its tokenizer and image token too."""
    hf_model, model = build_pair(family)
    hf_model.save_pretrained(tmp_path / family)
    model.processor.save_pretrained(tmp_path / family)
    found = validate_model_folder(tmp_path / family)
    assert found.tensors and found.processor is not None


def test_the_embedded_model_in_the_old_key_layout_passes():
    from vlens.zoo import WEIGHTS_FOLDER

    assert "model.embed_tokens.weight" in validate_model_folder(WEIGHTS_FOLDER).tensors


def test_truncated_and_garbage_weights(good, tmp_path):
    folder = _copy(good, tmp_path, "truncated")
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) - 1000])
    _refused(folder, "model.safetensors", "truncated")
    (folder / "model.safetensors").write_bytes(b"\x00" * 3)
    _refused(folder, "too short")
    (folder / "model.safetensors").write_bytes(os.urandom(4096))
    _refused(folder, "not a safetensors file")
    header = b'{"x": "not json'
    (folder / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    _refused(folder, "header is not JSON")


def test_architectures_missing_or_unknown(good, tmp_path):
    folder = _copy(good, tmp_path)
    _edit_config(folder, lambda c: c.pop("architectures"))
    _refused(folder, "config.json", "architectures", "Qwen2_5_VLForConditionalGeneration")  # the fix names the class
    _edit_config(folder, lambda c: c.__setitem__("architectures", ["FooForBar"]))
    _refused(folder, "FooForBar", "supports")
    _edit_config(folder, lambda c: c.pop("model_type"))
    _refused(folder, "model_type")


def test_config_widths_or_layers_that_do_not_match_the_weights(good, tmp_path):
    folder = _copy(good, tmp_path)
    _edit_config(folder, lambda c: c["text_config"].__setitem__("intermediate_size", 80))
    _refused(folder, "does not match the weights", "mlp", "intermediate_size=80")
    folder = _copy(good, tmp_path, "fewer")

    def one_layer(config):
        config["text_config"].update(num_hidden_layers=1, layer_types=["full_attention"])
    _edit_config(folder, one_layer)
    _refused(folder, "does not use", "layers.1.", "2 language layers", "num_hidden_layers is 1")


def test_missing_tensor(good, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = _copy(good, tmp_path)
    tensors = load_file(folder / "model.safetensors")
    name = next(k for k in tensors if k.endswith("layers.0.mlp.up_proj.weight"))
    tensors.pop(name)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    _refused(folder, "up_proj", "allow_missing", error=MissingWeightsError)
    assert validate_model_folder(folder, allow_missing=True).tensors


def test_pickle_only_and_no_weights(good, tmp_path):
    folder = _copy(good, tmp_path)
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    _refused(folder, "pytorch_model.bin", "pickle", "save_file")
    (folder / "pytorch_model.bin").unlink()
    _refused(folder, "no weights")


def test_sharded_index_naming_a_missing_shard(good, tmp_path):
    folder = _copy(good, tmp_path)
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    _refused(folder, "model-00002-of-00002.safetensors", "not in the folder")


def test_symlink_loop_and_permission_denied(good, tmp_path, monkeypatch):
    folder = _copy(good, tmp_path)
    (folder / "model.safetensors").unlink()
    os.symlink("model.safetensors", folder / "model.safetensors")
    _refused(folder, "symbolic link loop")
    folder = _copy(good, tmp_path, "unreadable")
    real_open = Path.open

    def deny(self, *args, **kwargs):  # as root a chmod 000 file stays readable: refuse the read itself
        if self.name == "model.safetensors":
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)
    monkeypatch.setattr(Path, "open", deny)
    message = _refused(folder, "permission denied", "chmod")
    assert "No such file" not in message


def test_config_json_broken(good, tmp_path):
    folder = _copy(good, tmp_path)
    text = (folder / "config.json").read_text()
    (folder / "config.json").write_text(text.replace('"model_type"', '"model_type": "llava", "model_type"', 1))
    _refused(folder, "config.json", "'model_type' appears twice")
    (folder / "config.json").write_text("{not json")
    _refused(folder, "config.json line 1", "not valid JSON")
    (folder / "config.json").unlink()
    _refused(folder, "holds no config.json")


def test_tokenizer_missing_ids_past_the_vocabulary_and_image_token(good, tmp_path):
    folder = _copy(good, tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()
    _refused(folder, "no tokenizer", "load_processor=False")
    assert validate_model_folder(folder, load_processor=False).processor is None

    folder = _copy(good, tmp_path, "vocab")
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    tokenizer["added_tokens"].append({"id": 200, "content": "<extra>", "single_word": False, "lstrip": False,
                                      "rstrip": False, "normalized": False, "special": True})
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    _refused(folder, "<extra>", "embeds only 48 tokens", "vocab_size")

    folder = _copy(good, tmp_path, "image_token")
    _edit_config(folder, lambda c: c.__setitem__("image_token_id", 7))
    _refused(folder, "image placeholder", "image_token_id is 7", "set image_token_id to 5")
    _edit_config(folder, lambda c: c.__setitem__("image_token_id", 4000))
    _refused(folder, "image_token_id 4000 is outside the vocabulary")


def test_broken_chat_template(good, tmp_path):
    folder = _copy(good, tmp_path)
    (folder / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }")
    _refused(folder, "chat template", "line 1")


def test_from_pretrained_validates_local_folders(good, tmp_path):
    model = HookedVLM.from_pretrained(str(good), device="cpu", dtype=torch.float32)
    assert model.processor is not None and model.cfg.n_layers == 2
    folder = _copy(good, tmp_path)
    _edit_config(folder, lambda c: c["text_config"].__setitem__("hidden_size", 32))
    with pytest.raises(ModelFolderError, match="does not match the weights"):
        HookedVLM.from_pretrained(str(folder), device="cpu")


def test_a_hub_id_without_network_fails_in_seconds(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    start = time.perf_counter()
    with pytest.raises(HubUnreachableError, match=r"cannot be reached.*hf download org/never-cached"):
        check_hub_reachable("org/never-cached")
    assert time.perf_counter() - start < 10
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubUnreachableError, match="HF_HUB_OFFLINE"):
        check_hub_reachable("org/never-cached")
