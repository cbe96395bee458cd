"""SAE modules on hand-computed values and SAELens's on-disk format both ways (no sae-lens needed)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from vlens.sae import build_sae, load_sae, make_config, save_sae
from vlens.utils.errors import UserInputError


def _sae(arch: str, **extra):
    sae = build_sae(make_config(arch, d_in=3, d_sae=4, hook_name="blocks.0.hook_resid_post", **extra))
    with torch.no_grad():
        sae.W_enc.copy_(torch.tensor([[1.0, -1.0, 0.5, 0.0], [0.0, 2.0, 0.5, 1.0], [1.0, 0.0, -3.0, 1.0]]))
        sae.W_dec.copy_(torch.arange(12, dtype=torch.float32).reshape(4, 3) / 10)
        sae.b_enc.copy_(torch.tensor([0.1, -0.2, 0.0, 0.3]))
        sae.b_dec.copy_(torch.tensor([1.0, 0.0, -1.0]))
    return sae


X = torch.tensor([[2.0, 1.0, 0.0], [1.0, -1.0, 2.0]])


def _pre() -> torch.Tensor:  # (x - b_dec) @ W_enc + b_enc, by hand
    centred = torch.tensor([[1.0, 1.0, 1.0], [0.0, -1.0, 3.0]])
    return centred @ torch.tensor([[1.0, -1.0, 0.5, 0.0], [0.0, 2.0, 0.5, 1.0], [1.0, 0.0, -3.0, 1.0]]) \
        + torch.tensor([0.1, -0.2, 0.0, 0.3])


def test_activations_match_hand_computed_values():
    pre = _pre()  # [[2.1, 0.8, -2.0, 2.3], [3.1, -2.2, -9.5, 2.3]]
    assert torch.allclose(_sae("standard").encode(X), pre.clamp(min=0))
    topk = _sae("topk", k=1).encode(X)
    assert torch.allclose(topk, torch.tensor([[0, 0, 0, 2.3], [3.1, 0, 0, 0]]))
    jump = _sae("jumprelu")
    jump.threshold.data = torch.tensor([2.2, 0.5, 0.0, 2.2])
    assert torch.allclose(jump.encode(X), torch.tensor([[0, 0.8, 0, 2.3], [3.1, 0, 0, 2.3]]))
    sae = _sae("standard")
    assert torch.allclose(sae(X), sae.encode(X) @ sae.W_dec + sae.b_dec)


def test_topk_rescale_by_decoder_norm_selects_by_scaled_activation():
    sae = _sae("topk", k=1, rescale_acts_by_decoder_norm=True)
    norms = sae.W_dec.norm(dim=-1)
    scaled = _pre() * norms
    acts = sae.encode(X)
    expected = torch.zeros_like(scaled).scatter(-1, scaled.argmax(-1, keepdim=True), scaled.max(-1, keepdim=True).values)
    assert torch.allclose(acts, expected)
    assert torch.allclose(sae.decode(acts), (acts / norms) @ sae.W_dec + sae.b_dec)


@pytest.mark.parametrize("arch,extra", [("standard", {}), ("topk", {"k": 2}), ("jumprelu", {})])
def test_round_trip_keeps_weights_and_config(tmp_path, arch, extra):
    sae = _sae(arch, **extra)
    save_sae(sae, tmp_path)
    cfg = json.loads((tmp_path / "cfg.json").read_text())
    assert cfg["architecture"] == arch and cfg["d_in"] == 3 and cfg["d_sae"] == 4
    assert cfg["metadata"]["hook_name"] == "blocks.0.hook_resid_post"
    back = load_sae(tmp_path)
    assert type(back) is type(sae)
    assert {**back.cfg.to_dict(), "metadata": {}} == {**sae.cfg.to_dict(), "metadata": {}}
    assert back.cfg.metadata["sae_lens_version"] == "6.0.0"
    for name, value in sae.state_dict().items():
        assert torch.equal(back.state_dict()[name], value), name
    assert set(sae.state_dict()) == ({"W_enc", "W_dec", "b_enc", "b_dec"} | ({"threshold"} if arch == "jumprelu" else set()))


def test_old_saelens_layout_loads(tmp_path):
    """SAELens 5.x: hook_point at the top level, TopK as activation_fn + activation_fn_kwargs, bool normalization."""
    sae = _sae("topk", k=2)
    save_file({k: v.contiguous() for k, v in sae.state_dict().items()}, str(tmp_path / "sae_weights.safetensors"))
    old = {"architecture": "standard", "d_in": 3, "d_sae": 4, "dtype": "float32", "device": "cpu",
           "model_name": "tiny", "hook_point": "blocks.0.hook_resid_post", "hook_point_layer": 0,
           "activation_fn_str": "topk", "activation_fn_kwargs": {"k": 2}, "apply_b_dec_to_input": True,
           "normalize_activations": False, "context_size": 128, "sae_lens_training_version": "3.14.0"}
    (tmp_path / "cfg.json").write_text(json.dumps(old))
    back = load_sae(tmp_path)
    assert back.cfg.architecture == "topk" and back.cfg.k == 2  # type: ignore[attr-defined]
    assert back.cfg.hook_name == "blocks.0.hook_resid_post" and back.cfg.metadata["model_name"] == "tiny"
    assert back.cfg.normalize_activations == "none"
    assert torch.equal(back.encode(X), sae.encode(X))


def test_layer_norm_input_is_undone_by_decode():
    sae = _sae("standard", normalize_activations="layer_norm")
    mu, std = X.mean(-1, keepdim=True), X.std(-1, keepdim=True)
    acts = torch.relu(((X - mu) / (std + 1e-5) - sae.b_dec) @ sae.W_enc + sae.b_enc)
    assert torch.allclose(sae.encode(X), acts)
    assert torch.allclose(sae(X), (acts @ sae.W_dec + sae.b_dec) * std + mu)


def test_bad_folders_and_configs_are_one_clear_error(tmp_path):
    with pytest.raises(UserInputError, match="not an SAE folder"):
        load_sae(tmp_path)
    save_sae(_sae("standard"), tmp_path)
    cfg = json.loads((tmp_path / "cfg.json").read_text())
    (tmp_path / "cfg.json").write_text(json.dumps({**cfg, "architecture": "gated_sparse"}))
    with pytest.raises(UserInputError, match="Unknown SAE architecture"):
        load_sae(tmp_path)
    (tmp_path / "cfg.json").write_text(json.dumps({**cfg, "d_sae": 5}))
    with pytest.raises(UserInputError, match="shape"):
        load_sae(tmp_path)
    with pytest.raises(UserInputError, match="k must be"):
        make_config("topk", d_in=3, d_sae=4, k=9)
