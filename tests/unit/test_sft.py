"""LoRA SFT with and without L_focus on a tiny model: a few steps of each path, resume after an
interruption == uninterrupted, a NaN loss stops with a clear error and keeps the last checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.sft import sft_config, sft_examples, sft_model
from vlens import HookedVLM
from vlens.data import render_syndot, render_synpoly
from vlens.training.checkpoint import latest_checkpoint
from vlens.training.data import IGNORE_INDEX, collate, example_from_sample
from vlens.training.lora import lora_parameters
from vlens.training.sft import NonFiniteLossError, SFTConfig, StepPlan, train_sft


def test_collate_labels_answers_and_finds_the_prompt_end():
    model = sft_model()
    examples = sft_examples(2)
    batch = collate(model, examples)
    eos = model.tokenizer.eos_token_id
    for row, example in enumerate(examples):
        labelled = batch.labels[row][batch.labels[row] != IGNORE_INDEX].tolist()
        assert labelled == [model.to_single_token(example.answer), eos]
        # the prompt ends with the assistant marker, right before the answer
        assert model.to_str_tokens(
            batch.inputs.input_ids[row, batch.prompt_final[row] : batch.prompt_final[row] + 1]
        ) == ["assistant"]
    assert batch.prior is not None and batch.prior.valid.all()


def test_schedule_warms_up_then_decays_linearly():
    plan = StepPlan(20, SFTConfig(learning_rate=1.0, warmup_ratio=0.1, batch_size=1, grad_accum=1, epochs=1))
    assert plan.total_steps == 20 and plan.warmup_steps == 2
    rates = [plan.rate_at(s) for s in range(20)]
    assert rates[:2] == [0.5, 1.0] and rates[-1] == pytest.approx(1 / 18)
    plan = StepPlan(7, SFTConfig(batch_size=2, grad_accum=2, epochs=2))
    assert plan.steps_per_epoch == 2 and plan.total_steps == 4
    assert sorted(i for mb in plan.micro_batches(0) + plan.micro_batches(1) for i in mb) == list(range(7))


@pytest.mark.parametrize("focus_weight", [0.0, 1.0])
def test_a_few_steps_train_and_write_adapters(tmp_path, focus_weight):
    model = sft_model()
    result = train_sft(
        model, sft_examples(), sft_config(focus_weight=focus_weight, grad_accum=2), tmp_path, progress=False
    )
    assert result.steps == result.total_steps == 2
    assert all(torch.isfinite(p).all() for p in lora_parameters(model).values())
    assert any(p.abs().sum() > 0 for n, p in lora_parameters(model).items() if "lora_B" in n)  # B moved off 0
    log = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    steps = [r for r in log if "sft_loss" in r]
    assert len(steps) == 2 and all(r["sft_loss"] > 0 for r in steps)
    assert all((r["focus_loss"] is None) == (focus_weight == 0) for r in steps)
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()


def test_resume_after_interruption_equals_uninterrupted(tmp_path):
    examples = sft_examples(8)
    whole = sft_model()
    train_sft(whole, examples, sft_config(), tmp_path / "whole", progress=False)

    first = sft_model()
    partial = train_sft(first, examples, sft_config(), tmp_path / "split", stop_after=2, progress=False)
    assert partial.steps == 2 and partial.total_steps == 4
    second = sft_model()  # a new process: fresh model, state from the checkpoint
    resumed = train_sft(second, examples, sft_config(), tmp_path / "split", progress=False)
    assert resumed.resumed_from == 2 and resumed.steps == 4
    for (name, a), (_, b) in zip(
        lora_parameters(whole).items(), lora_parameters(second).items(), strict=True
    ):
        assert torch.equal(a, b), name


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    examples = sft_examples(8)
    train_sft(sft_model(), examples, sft_config(), tmp_path, stop_after=1, progress=False)
    model = sft_model()

    def poison(resid, hook):
        return resid * float("nan")

    model.add_hook("blocks.0.hook_resid_post", poison)
    try:
        with pytest.raises(NonFiniteLossError, match="step 2 .*last good checkpoint is .*step-000001"):
            train_sft(model, examples, sft_config(), tmp_path, progress=False)
    finally:
        model.reset_hooks()
    latest = latest_checkpoint(tmp_path)
    assert latest.name == "step-000001"
    assert all(torch.isfinite(t).all() for t in load_file(str(latest / "lora.safetensors")).values())


def test_answer_queries_two_image_rows_and_bf16_autocast(tmp_path):
    from vlens.training.data import SFTExample

    a, b = render_syndot(2, seed=1, size=84), render_synpoly(3, seed=2, size=56)
    example = SFTExample(
        [a[0], b[0]],
        "How many dots are there?",
        "5",
        [example_from_sample(*a).objects[0], example_from_sample(*b).objects[0]],
    )
    model = sft_model()
    batch = collate(model, [example, sft_examples(1)[0]])
    regions = batch.inputs.regions
    assert len(regions.images[0]) == 2
    for positions in regions.images[0]:  # both images of the row carry part of g
        assert batch.prior.weights[0, positions].sum() > 0.1
    config = sft_config(focus_query="answer", bf16=True, max_steps=1)
    result = train_sft(model, [example] + sft_examples(3), config, tmp_path, progress=False)
    assert result.steps == 1 and result.final_focus_loss > 0


def test_one_focus_step_on_the_other_families(tmp_path):
    import vlens.testing as vt

    builders = {
        "qwen3_vl": ("tiny_qwen3_vl_model", "tiny_qwen3_vl_processor"),
        "llava": ("tiny_llava_model", "tiny_llava_processor"),
    }
    for family, (model_builder, processor_builder) in builders.items():
        model = HookedVLM.from_hf(getattr(vt, model_builder)(), processor=getattr(vt, processor_builder)())
        batch = collate(model, sft_examples(2))
        assert batch.prior.valid.all()
        labelled = batch.labels[0][batch.labels[0] != IGNORE_INDEX].tolist()
        assert labelled[-1] == model.tokenizer.eos_token_id and len(labelled) == 2
        result = train_sft(model, sft_examples(2), sft_config(max_steps=1), tmp_path / family, progress=False)
        assert result.steps == 1 and result.final_focus_loss > 0


def test_learning_rate_schedules_by_hand():
    from vlens.training.schedule import learning_rate_at

    # warm-up 2 of 10 steps to peak 1.0, then linear to 0 or half a cosine to the floor
    assert [learning_rate_at(s, 10, 1.0, 2) for s in (0, 1, 2, 6, 10)] == [0.5, 1.0, 1.0, 0.5, 0.0]
    cosine = [learning_rate_at(s, 10, 1.0, 2, "cosine", floor=0.05) for s in (2, 6, 10)]
    assert cosine == pytest.approx([1.0, 0.05 + 0.95 * 0.5, 0.05])
    with pytest.raises(ValueError, match="decay"):
        learning_rate_at(5, 10, 1.0, 2, "step")
