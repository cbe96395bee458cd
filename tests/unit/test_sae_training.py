"""The SAE trainer on known answers: a planted dictionary is recovered, dead features come back,
a resumed run ends on the same bits as an uninterrupted one."""

from __future__ import annotations

import pytest
import torch

from vlens.sae.activations import TensorSource
from vlens.sae.buffer import ShuffleBuffer
from vlens.sae.schedule import lr_at
from vlens.sae.settings import SAETraining, TrainRun
from vlens.sae.trainer import SAETrainer, new_sae, train_sae
from vlens.utils.errors import UserInputError


def planted(n: int = 40_000, d: int = 32, n_true: int = 48, seed: int = 0):
    """Activations that are sparse non-negative combinations (about 3 per token) of known unit directions."""
    g = torch.Generator().manual_seed(seed)
    directions = torch.randn(n_true, d, generator=g)
    directions = directions / directions.norm(dim=-1, keepdim=True)
    active = torch.rand(n, n_true, generator=g) < 3 / n_true
    return (active * (0.5 + torch.rand(n, n_true, generator=g))) @ directions, directions


def recovered(sae, directions) -> torch.Tensor:
    w = sae.W_dec.detach()
    return ((directions @ (w / w.norm(dim=-1, keepdim=True)).T).max(dim=1).values > 0.9).float().mean()


@pytest.mark.parametrize("arch,extra", [("topk", {"k": 4}), ("standard", {"l1_coefficient": 0.3}),
                                        ("jumprelu", {"l0_coefficient": 0.05, "jumprelu_init_threshold": 0.1})])
def test_planted_dictionary_is_recovered(arch, extra):
    x, directions = planted(n=60_000)
    training = SAETraining(architecture=arch, d_sae=64, total_tokens=60_000, batch_size=256, buffer_size=4096,
                           lr=3e-3, warmup_steps=20, dead_window=4000, resample_every=50, **extra)
    result = train_sae(TensorSource(x, 2048), training)
    assert float(recovered(result.sae, directions)) >= 0.95
    assert result.metrics["explained_variance"] > 0.8 and result.metrics["finished"]
    assert 1 <= result.metrics["l0"] < 32  # sparse: fewer than half of the 64 features per token


@pytest.mark.parametrize("arch", ["standard", "jumprelu"])
def test_resampling_brings_dead_features_back(arch):
    x, _ = planted(n=20_000)
    dead_at_start = torch.arange(32, 64)

    def run(dead_features: str) -> float:
        training = SAETraining(architecture=arch, d_sae=64, l1_coefficient=0.3, l0_coefficient=0.05,
                               total_tokens=20_000, batch_size=256, buffer_size=4096, lr=3e-3, warmup_steps=10,
                               dead_window=2048, resample_every=20, dead_features=dead_features)
        sae = new_sae(training, 32, None, x[:256])
        with torch.no_grad():
            sae.b_enc[dead_at_start] = -20.0  # these never fire
        trainer = SAETrainer(TensorSource(x, 2048), training, sae=sae)
        trainer.run()
        with torch.no_grad():
            fires = (trainer.sae.encode(x[:4000]) != 0).any(0)
        return float(fires[dead_at_start].float().mean())

    assert run("none") == 0.0
    assert run("resample") >= 0.5


def test_aux_loss_is_the_dead_features_reconstruction_of_the_residual():
    """AuxK on a hand-made case: the top-k_aux dead features' ReLU pre-activations decode the residual."""
    x, _ = planted(n=4096)
    training = SAETraining(architecture="topk", d_sae=8, k=2, total_tokens=4096, batch_size=256, buffer_size=1024,
                           dead_window=256, aux_k=2, aux_coefficient=0.5, dead_features="aux")
    trainer = SAETrainer(TensorSource(x[:, :4].contiguous(), 512), training)
    trainer.tokens_seen = 1000
    trainer.last_fired = torch.tensor([1000, 1000, 1000, 1000, 0, 0, 0, 1000])  # 4, 5, 6 dead
    batch = x[:16, :4]
    _, parts, acts, x_hat = trainer.losses(batch)
    sae = trainer.sae
    pre = torch.relu(sae.pre_acts(batch))[:, 4:7]
    top = pre.topk(2, dim=-1)
    aux_acts = torch.zeros(16, 3).scatter(-1, top.indices, top.values)
    expected = 0.5 * (aux_acts @ sae.W_dec[4:7] - (batch - x_hat).detach()).pow(2).sum(-1).mean()
    assert torch.allclose(parts["aux_loss"], expected)
    assert int((acts != 0).sum(-1).max()) <= 2


def test_resume_equals_an_uninterrupted_run_bitwise(tmp_path):
    x, _ = planted(n=6_000)
    training = SAETraining(architecture="jumprelu", d_sae=48, total_tokens=6_000, batch_size=128, buffer_size=1024,
                           lr=3e-3, warmup_steps=5, dead_window=1024, resample_every=7, dead_features="resample")
    whole = train_sae(TensorSource(x, 500), training, TrainRun(log_every=5))
    first = train_sae(TensorSource(x, 500), training, TrainRun(checkpoint_dir=tmp_path, stop_after=17, log_every=5))
    assert first.metrics["steps"] == 17 and not first.metrics["finished"]
    resumed = train_sae(TensorSource(x, 500), training, TrainRun(checkpoint_dir=tmp_path, resume=True, log_every=5))
    assert resumed.metrics["finished"]
    for name, value in whole.sae.state_dict().items():
        assert torch.equal(resumed.sae.state_dict()[name], value), name
    assert resumed.log == whole.log
    other = SAETraining(**{**training.__dict__, "lr": 1e-3})
    with pytest.raises(UserInputError, match="lr"):
        train_sae(TensorSource(x, 500), other, TrainRun(checkpoint_dir=tmp_path, resume=True))


def test_buffer_shuffles_without_losing_or_repeating_rows():
    x = torch.arange(40, dtype=torch.float32)[:, None].repeat(1, 2)
    buffer = ShuffleBuffer(TensorSource(x, 7), capacity=16, seed=0)
    seen = torch.cat([buffer.next_batch(4) for _ in range(15)])[:, 0]
    assert not torch.equal(seen, seen.sort().values)
    # nothing lost or repeated: drawn + held is exactly what was read, in stream order with wrap-around
    assert buffer.held is not None
    everything = torch.cat([seen, buffer.held[:, 0]]).sort().values
    read = (torch.arange(buffer.tokens_read) % 40).float().sort().values
    assert torch.equal(everything, read) and buffer.epoch >= 1


def test_schedule_warms_up_then_decays():
    assert lr_at(0, 100, 1.0, 10) == pytest.approx(0.1)
    assert lr_at(9, 100, 1.0, 10) == pytest.approx(1.0)
    assert lr_at(100, 100, 1.0, 10, "cosine", 0.1) == pytest.approx(0.1)
    assert lr_at(55, 100, 1.0, 10, "linear") == pytest.approx(0.5)
    with pytest.raises(UserInputError):
        SAETraining(batch_size=512, buffer_size=600)
