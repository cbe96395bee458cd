"""Transcoders on known answers: planted MLPs are recovered (PLT, skip, CLT), a resumed run ends on the
same bits, every file format round-trips, a perfect transcoder recovers all the loss."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from tests.helpers.models import tiny_vlm
from tests.helpers.transcoders import PlantedMLP
from vlens.sae.activations import TensorSource
from vlens.sae.settings import TrainRun
from vlens.testing import random_image
from vlens.transcoders import (
    PairSource,
    TrainedTranscoders,
    TranscoderConfig,
    Transcoders,
    TranscoderTraining,
    evaluate_transcoders,
    join_pairs,
    load_transcoders,
    mlp_pairs,
    save_saelens_transcoders,
    save_transcoders,
    splice_transcoders,
    train_transcoders,
)
from vlens.utils.errors import UserInputError
from vlens.utils.results import load_result

torch.set_num_threads(1)


def planted_relu(d: int, n_feat: int, seed: int):
    """A ReLU MLP ``relu(x @ E + b) @ D`` whose features fire on about a fifth of the inputs."""
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(d, n_feat, generator=g) / d ** 0.5
    return e, -0.8 * torch.ones(n_feat), torch.randn(n_feat, d, generator=g) / n_feat ** 0.5


def test_skip_transcoder_recovers_a_planted_linear_mlp():
    g = torch.Generator().manual_seed(0)
    d = 12
    m = torch.randn(d, d, generator=g) / d ** 0.5
    x = torch.randn(20_000, d, generator=g)
    training = TranscoderTraining(kind="skip", activation="relu", d_tc=16, l1_coefficient=1e-2, total_tokens=40_000,
                                  batch_size=256, buffer_size=4096, lr=1e-2, warmup_steps=10)
    result = train_transcoders(TensorSource(join_pairs([x], [x @ m]), 4096), training, layers=(0,))
    w_skip = result.transcoders.W_skip
    assert w_skip is not None
    assert result.metrics["explained_variance"] > 0.999
    held_out = torch.randn(2000, d, generator=g)
    with torch.no_grad():
        y_hat = result.transcoders([held_out])[0][0]
        assert float((y_hat - held_out @ m).norm() / (held_out @ m).norm()) < 0.05  # the planted map, on new inputs
        assert float((w_skip[0] - m).norm() / m.norm()) < 0.5  # carried mostly by the skip connection


def test_plt_and_clt_recover_planted_relu_mlps():
    g = torch.Generator().manual_seed(1)
    d, n = 12, 16
    e0, b0, d00 = planted_relu(d, n, 2)
    e1, b1, d11 = planted_relu(d, n, 3)
    d01 = torch.randn(n, d, generator=g) / n ** 0.5
    x0, x1 = torch.randn(30_000, d, generator=g), torch.randn(30_000, d, generator=g)
    f0, f1 = torch.relu(x0 @ e0 + b0), torch.relu(x1 @ e1 + b1)
    # layer 1's output also carries layer 0's features: only a cross-layer transcoder can write it
    rows = join_pairs([x0, x1], [f0 @ d00, f0 @ d01 + f1 @ d11])
    settings = dict(activation="relu", d_tc=24, l1_coefficient=1e-3, total_tokens=60_000, batch_size=256,
                    buffer_size=8192, lr=1e-2, warmup_steps=10)
    clt = train_transcoders(TensorSource(rows, 4096), TranscoderTraining(kind="clt", **settings), layers=(0, 1))
    plt = train_transcoders(TensorSource(rows, 4096), TranscoderTraining(kind="plt", **settings), layers=(0, 1))
    assert clt.metrics["explained_variance"] > 0.97
    assert plt.metrics["explained_variance"] < clt.metrics["explained_variance"] - 0.1
    assert clt.metrics["l0"] < 12


def test_a_resumed_run_ends_on_the_same_bits(tmp_path):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(8_000, 8, generator=g)
    rows = join_pairs([x, x], [torch.relu(x), torch.tanh(x)])
    training = TranscoderTraining(kind="clt", activation="jumprelu", d_tc=16, total_tokens=6_400, batch_size=128,
                                  buffer_size=1024, warmup_steps=5)
    whole = train_transcoders(TensorSource(rows, 1000), training, layers=(0, 1))
    first = train_transcoders(TensorSource(rows, 1000), training, TrainRun(checkpoint_dir=tmp_path, stop_after=20),
                              layers=(0, 1))
    assert not first.metrics["finished"]
    assert not list(tmp_path.glob("*.pt"))  # safetensors + JSON, no pickle
    resumed = train_transcoders(TensorSource(rows, 1000), training, TrainRun(checkpoint_dir=tmp_path, resume=True),
                                layers=(0, 1))
    for name, value in whole.transcoders.state().items():
        assert torch.equal(value, resumed.transcoders.state()[name]), name
    assert resumed.log == whole.log
    with pytest.raises(UserInputError, match="other settings"):
        train_transcoders(TensorSource(rows, 1000), TranscoderTraining(**{**training.__dict__, "seed": 1}),
                          TrainRun(checkpoint_dir=tmp_path, resume=True), layers=(0, 1))


def random_set(kind: str, activation: str, layers=(0, 2), d=8, f=12, seed=0) -> Transcoders:
    tc = Transcoders(TranscoderConfig(kind=kind, activation=activation, layers=layers, d_model=d, d_tc=f,
                                      k=3 if activation == "topk" else 0))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in tc.parameters():
            param.copy_(torch.randn(param.shape, generator=g) * 0.5)
        if tc.threshold is not None:
            tc.threshold.copy_(torch.rand(tc.threshold.shape, generator=g) * 0.3)
    return tc


def outputs(tc: Transcoders, xs):
    return torch.cat(tc(xs)[0], -1)


@pytest.mark.parametrize("kind,activation", [("plt", "relu"), ("skip", "relu"), ("plt", "jumprelu"),
                                             ("clt", "topk"), ("clt", "jumprelu")])
def test_formats_round_trip(tmp_path, kind, activation):
    tc = random_set(kind, activation)
    xs = [torch.randn(5, 8), torch.randn(5, 8)]
    back = load_transcoders(save_transcoders(tc, tmp_path / "vlens"))
    assert back.cfg.to_dict() == tc.cfg.to_dict()
    assert torch.equal(outputs(back, xs), outputs(tc, xs))
    if kind == "clt" or activation == "topk":
        with pytest.raises(UserInputError, match="SAELens has no transcoder architecture"):
            save_saelens_transcoders(tc, tmp_path / "saelens")
        return
    folder = save_saelens_transcoders(tc, tmp_path / "saelens", model_name="tiny")
    config = json.loads((folder / "layer_2" / "cfg.json").read_text())
    assert config["architecture"] == {"plt": "transcoder", "skip": "skip_transcoder"}.get(kind, "jumprelu_transcoder") \
        if activation == "relu" else config["architecture"] == "jumprelu_transcoder"
    assert config["metadata"]["hook_name_out"] == "blocks.2.hook_mlp_out" and config["d_out"] == 8
    back = load_transcoders(folder)
    assert (back.cfg.kind, back.cfg.activation, back.cfg.layers) == (kind, activation, (0, 2))
    assert torch.equal(outputs(back, xs), outputs(tc, xs))


def test_circuit_tracer_sets_are_read(tmp_path):
    """Its ReLU safetensors files (W_enc [d_tc, d], W_dec [d, d_tc], W_skip applied as x @ W_skip.T) and
    Gemma Scope's npz files (W_enc [d, d_tc], threshold) through its YAML list."""
    xs = [torch.randn(5, 8), torch.randn(5, 8)]
    skip = random_set("skip", "relu")
    entries = []
    for i, layer in enumerate(skip.cfg.layers):
        save_file({"W_enc": skip.W_enc[i].T.contiguous(), "W_dec": skip.W_dec[i][:, 0].T.contiguous(),
                   "b_enc": skip.b_enc[i].detach().clone(), "b_dec": skip.b_dec[i].detach().clone(),
                   "W_skip": skip.W_skip[i].T.contiguous()}, str(tmp_path / f"layer_{layer}.safetensors"))
        entries.append(f"  - id: t{layer}\n    layer: {layer}\n    filepath: layer_{layer}.safetensors\n")
    (tmp_path / "set.yaml").write_text("model_name: tiny\nfeature_input_hook: hook_resid_mid\n"
                                       "feature_output_hook: mlp.hook_out\ntranscoders:\n" + "".join(entries))
    back = load_transcoders(tmp_path / "set.yaml")
    assert back.cfg.kind == "skip" and torch.allclose(outputs(back, xs), outputs(skip, xs), atol=1e-6)

    jump = random_set("plt", "jumprelu")
    for i, layer in enumerate(jump.cfg.layers):
        np.savez(tmp_path / f"g{layer}.npz", W_enc=jump.W_enc[i].detach().numpy(),
                 W_dec=jump.W_dec[i][:, 0].detach().numpy(), b_enc=jump.b_enc[i].detach().numpy(),
                 b_dec=jump.b_dec[i].detach().numpy(), threshold=jump.threshold[i].detach().numpy())
    (tmp_path / "gemma.yaml").write_text("model_name: tiny\ntranscoders:\n" + "".join(
        f"  - layer: {layer}\n    filepath: g{layer}.npz\n" for layer in jump.cfg.layers))
    back = load_transcoders(tmp_path / "gemma.yaml")
    assert back.cfg.activation == "jumprelu" and torch.allclose(outputs(back, xs), outputs(jump, xs), atol=1e-6)
    (tmp_path / "hub.yaml").write_text("transcoders:\n  - layer: 0\n    filepath: hf://org/repo/layer_0.safetensors\n")
    with pytest.raises(UserInputError, match="downloads nothing"):
        load_transcoders(tmp_path / "hub.yaml")


def test_a_perfect_transcoder_recovers_all_the_loss_and_kl():
    model = tiny_vlm("qwen2_5_vl", seed=1, fresh=True, n_layers=2, d_model=40, n_heads=4, n_kv_heads=2, d_mlp=56)
    d = model.cfg.d_model
    tc = Transcoders(TranscoderConfig(kind="plt", activation="relu", layers=(0, 1), d_model=d, d_tc=24))
    for layer in (0, 1):
        e, b, dec = planted_relu(d, 24, 10 + layer)
        model.blocks[layer].mlp = PlantedMLP(e * 3, b * 0.1, dec * 3)
        with torch.no_grad():
            tc.W_enc[layer].copy_(e * 3)
            tc.b_enc[layer].copy_(b * 0.1)
            tc.W_dec[layer][:, 0].copy_(dec * 3)
    examples = [(random_image(seed=i), "How many dots are there?") for i in range(3)]
    result = evaluate_transcoders(model, tc, examples, batch_size=2)
    assert abs(result.loss_recovered - 1) < 1e-5 and result.kl_transcoders < 1e-9 and result.kl_recovered > 1 - 1e-6
    assert result.loss_zero > result.loss_clean
    assert all(row["explained_variance"] > 1 - 1e-6 for row in result.layers)
    with torch.no_grad():
        tc.W_dec[1].mul_(0.5)  # half of layer 1's output: a part of the loss is lost
    worse = evaluate_transcoders(model, tc, examples, batch_size=2)
    assert worse.loss_recovered < 1 - 1e-3 and worse.layers[1]["explained_variance"] < 0.8
    assert worse.layers[0]["explained_variance"] > 1 - 1e-6


def test_pair_source_streams_mlp_inputs_and_outputs_and_trains(tmp_path):
    model = tiny_vlm("qwen2_5_vl")
    examples = [(random_image(seed=i), "How many dots are there?") for i in range(4)]
    source = PairSource(model, examples, layers=[0, 1], positions="all", prompts_per_chunk=2)
    chunk = source.chunk(0)
    inputs = source.inputs(source.prompts(0)[1])
    xs, ys = mlp_pairs(model, inputs, (0, 1))
    row, pos = int(chunk.sites.example[3]), int(chunk.sites.position[3])
    _, cache = model.run_with_cache(inputs, names_filter=lambda n: n.endswith(("mlp_out", "resid_mid")))
    expected = torch.cat([model.blocks[0].ln2(cache["blocks.0.hook_resid_mid"])[row, pos], cache["blocks.0.hook_mlp_out"][row, pos],
                          xs[1][row, pos], ys[1][row, pos]])
    assert torch.allclose(chunk.acts[3], expected, atol=1e-6)
    assert bool(chunk.sites.is_image.any()) and bool((~chunk.sites.is_image).any())
    result = train_transcoders(source, TranscoderTraining(d_tc=32, total_tokens=512, batch_size=64, buffer_size=256))
    assert result.transcoders.cfg.layers == (0, 1)
    result.save(tmp_path / "tc")
    back = load_result(tmp_path / "tc")
    assert isinstance(back, TrainedTranscoders) and back.to_dict()["metrics"] == result.to_dict()["metrics"]
    with splice_transcoders(model, result.transcoders, error="live"):
        spliced = model(inputs)
    assert torch.allclose(spliced, model(inputs), atol=1e-4)
    assert "blocks.0.hook_tc_acts" not in model.hook_dict
