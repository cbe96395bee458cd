"""Training memory: answer-only logits give the full-logits loss, and gradient checkpointing gives
the same gradients (with L_focus's pattern capture inside the checkpointed blocks)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.models import tiny_vlm
from vlens.data import render_syndot, render_synpoly
from vlens.interventions.focus import capture_patterns, focus_loss
from vlens.training.data import answer_loss, collate, example_from_sample
from vlens.training.lora import add_lora, lora_parameters
from vlens.training.memory import answer_only_loss, gradient_checkpointing, use_checkpointing
from vlens.training.sft import SFTConfig, query_positions


@pytest.fixture(scope="module")
def setup():
    model = tiny_vlm("qwen2_5_vl", fresh=True)
    torch.manual_seed(0)
    add_lora(model, rank=4)
    for p in lora_parameters(model).values():  # LoRA B starts at 0: make the adapters matter
        torch.nn.init.normal_(p, std=0.05)
    examples = [example_from_sample(*render_syndot(2, seed=0, size=84)),
                example_from_sample(*render_synpoly(3, seed=1, size=56))]
    examples[1].answer = "3 3"  # a longer answer: rows with different answer lengths
    return model, collate(model, examples)


def test_answer_only_logits_equal_the_full_logits_loss(setup):
    model, batch = setup
    with torch.no_grad():
        full = answer_loss(model(batch.inputs), batch.labels)
        only = answer_only_loss(model, model(batch.inputs, stop_at_layer=model.cfg.n_layers), batch.labels)
    torch.testing.assert_close(only, full, atol=1e-6, rtol=1e-6)


def _gradients(model, batch, checkpointing: bool):
    """(loss, LoRA gradients, bytes autograd kept for the backward outside checkpointed blocks)."""
    model.train()
    model.zero_grad(set_to_none=True)
    config = SFTConfig(focus_query="answer")
    saved = []

    def pack(tensor):
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    with gradient_checkpointing(model, checkpointing), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            capture_patterns(model, [0, 1], query_positions(batch, config.focus_query)) as captured:
        sft = answer_only_loss(model, model(batch.inputs, stop_at_layer=model.cfg.n_layers), batch.labels)
        loss = sft + focus_loss(captured, batch.prior)
        loss.backward()  # inside: recomputed blocks take the same attention path
    model.eval()
    return loss.detach(), {k: p.grad.clone() for k, p in lora_parameters(model).items()}, sum(saved)


def test_checkpointing_on_and_off_give_equal_gradients(setup):
    model, batch = setup
    loss_off, off, kept_off = _gradients(model, batch, checkpointing=False)
    loss_on, on, kept_on = _gradients(model, batch, checkpointing=True)
    assert kept_on < kept_off / 3  # the blocks' activations are recomputed, not kept
    torch.testing.assert_close(loss_on, loss_off, atol=0, rtol=0)
    assert set(on) == set(off) and any(g.abs().sum() > 0 for g in off.values())
    for name in off:
        torch.testing.assert_close(on[name], off[name], atol=1e-7, rtol=1e-6)
    assert "forward" not in vars(model.blocks[0])  # the plain forward is back


def test_checkpointing_is_on_by_default_for_real_widths(setup):
    model, _ = setup
    assert use_checkpointing("auto", model) is False and use_checkpointing(True, model) is True

    class Wide:
        class cfg:
            d_model = 3584

    assert use_checkpointing("auto", Wide()) is True
    with pytest.raises(ValueError, match="'auto', True or False"):
        use_checkpointing("yes", model)


def test_training_with_checkpointing_equals_training_without(tmp_path):
    from vlens.training.sft import train_sft

    examples = [example_from_sample(*render_syndot(1 + i, seed=i, size=84)) for i in range(4)]
    weights = {}
    for on in (False, True):
        model = tiny_vlm("qwen2_5_vl", fresh=True)
        config = SFTConfig(lora_rank=4, learning_rate=1e-2, epochs=1, batch_size=2, grad_accum=2,
                           focus_layers=[0, 1], focus_query="answer", gradient_checkpointing=on)
        result = train_sft(model, examples, config, tmp_path / str(on), progress=False)
        assert result.steps == 1
        weights[on] = {k: p.detach().clone() for k, p in lora_parameters(model).items()}
    for name in weights[False]:
        torch.testing.assert_close(weights[True][name], weights[False][name], atol=1e-6, rtol=1e-5)
