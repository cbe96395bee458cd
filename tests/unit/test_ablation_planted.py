"""Known-answer tests of head ablation on a hand-planted model.

The model is a tiny random Qwen2.5-VL whose layer-1 head 1 is the only route of the
"counting" answer and layer-1 head 3 the only route of the "colour" answer:
- digit tokens d embed a private direction e_{40+d}, colour tokens c a direction e_{50+c};
  nothing else (no embedding, no other head, no MLP) touches dims 40..63;
- the planted heads attend uniformly (zero queries), read their task's directions with
  W_V and write them back with a large W_O;
- the unembedding reads only those dims: answer token d <- e_{40+d}, colour c <- e_{50+c}.
So at the final position the answer is decodable only through the planted head's output.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.models import tiny_pair
from vlens import HookedVLM, SweepOptions
from vlens.ablation import (
    AblationSettings,
    TaskBatch,
    ablation_hooks,
    answer_token_ids,
    collect_reference,
    cross_task_ablation,
    head_ablation_sweep,
)
from vlens.testing import word_level_tokenizer

torch.set_num_threads(1)

DIGITS = [str(d) for d in range(10)]
COLOURS = ["red", "blue", "green"]
COUNT_HEAD, COLOUR_HEAD, PLANTED_LAYER = (1, 1), (1, 3), 1
D_HEAD = 16


def _plant_copy_head(attn, head: int, in_dims: list[int], gain: float) -> None:
    """Head `head` (its own kv head: n_kv_heads == n_heads) attends uniformly and copies dims."""
    rows = slice(head * D_HEAD, (head + 1) * D_HEAD)
    attn.q_proj.weight[rows] = 0
    attn.q_proj.bias[rows] = 0
    attn.v_proj.weight[rows] = 0
    attn.v_proj.bias[rows] = 0
    attn.o_proj.weight[:, rows] = 0
    for j, dim in enumerate(in_dims):
        attn.v_proj.weight[head * D_HEAD + j, dim] = 1.0
        attn.o_proj.weight[dim, head * D_HEAD + j] = gain


def planted_model() -> HookedVLM:
    tokenizer = word_level_tokenizer()
    hf, model = tiny_pair("qwen2_5_vl", tokenizer=tokenizer, n_layers=2, d_model=64, n_heads=4, n_kv_heads=4)
    lm = hf.model.language_model
    digit_ids = [tokenizer.convert_tokens_to_ids(d) for d in DIGITS]
    colour_ids = [tokenizer.convert_tokens_to_ids(c) for c in COLOURS]
    with torch.no_grad():
        lm.embed_tokens.weight[:, 40:] = 0
        for d, tok in enumerate(digit_ids):
            lm.embed_tokens.weight[tok, 40 + d] = 4.0
        for c, tok in enumerate(colour_ids):
            lm.embed_tokens.weight[tok, 50 + c] = 4.0
        for layer in lm.layers:  # keep random heads / MLPs out of the answer dims
            layer.self_attn.o_proj.weight[40:] = 0
            layer.mlp.down_proj.weight[40:] = 0
        attn = lm.layers[PLANTED_LAYER].self_attn
        _plant_copy_head(attn, COUNT_HEAD[1], [40 + d for d in range(10)], gain=40.0)
        _plant_copy_head(attn, COLOUR_HEAD[1], [50 + c for c in range(3)], gain=40.0)
        hf.lm_head.weight.zero_()
        for d, tok in enumerate(digit_ids):
            hf.lm_head.weight[tok, 40 + d] = 2.0
        for c, tok in enumerate(colour_ids):
            hf.lm_head.weight[tok, 50 + c] = 2.0
    return model


def counting_batch(model, digits: list[int], name: str = "counting") -> TaskBatch:
    answers = [str(d) for d in digits]
    prompts = [f"{d} dots . How many dots are there ?" for d in digits]
    return TaskBatch(name, prompts, [None] * len(prompts), answers, answer_token_ids(model, answers))


def colour_batch(model, colours: list[str], name: str = "colour") -> TaskBatch:
    prompts = [f"the {c} shape . what colour is the shape ?" for c in colours]
    return TaskBatch(name, prompts, [None] * len(prompts), colours, answer_token_ids(model, colours))


@pytest.fixture(scope="module")
def model():
    return planted_model()


def test_planted_model_answers_through_its_heads(model):
    task = counting_batch(model, [2, 7, 4])
    sweep = head_ablation_sweep(model, task, method="zero", options=SweepOptions(progress=False))
    assert sweep.clean_accuracy == 1.0 and sweep.clean_logprob > -0.05
    # zeroing the counting head leaves no route to the digit: accuracy collapses
    assert sweep.ablated_accuracy[COUNT_HEAD] == 0.0


@pytest.mark.parametrize(("method", "alignment"), [("mean", "all"), ("mean", "position"), ("mean", "region"),
                                                   ("zero", "region"), ("resample", "region")])
def test_planted_head_ranks_first_for_its_task_only(model, method, alignment):
    tasks = {
        # reference digits differ from the evaluation digits: resampling never restores an answer
        "counting": (counting_batch(model, [1, 4, 6, 9, 2, 7]), counting_batch(model, [0, 3, 5, 8, 3, 5])),
        "colour": (colour_batch(model, ["red", "blue", "green", "blue"]),
                   colour_batch(model, ["green", "red", "blue"])),
    }
    report = cross_task_ablation(model, tasks, AblationSettings(method=method, alignment=alignment, top_k=2),
                                 options=SweepOptions(batch_size=4, heads_per_pass=2, progress=False))
    counting, colour = report.results["counting"], report.results["colour"]
    assert counting.ranking()[0] == COUNT_HEAD
    assert colour.ranking()[0] == COLOUR_HEAD
    assert counting.accuracy_drop[COUNT_HEAD] == 1.0  # every counting answer destroyed
    # each planted head is inert on the other task: its output there is exactly zero, so is its mean
    assert abs(float(colour.logprob_drop[COUNT_HEAD])) < 1e-6
    assert abs(float(counting.logprob_drop[COLOUR_HEAD])) < 1e-6
    assert counting.logprob_drop[COUNT_HEAD] > 1.0
    assert COUNT_HEAD not in report.head_sets()["colour"][:1]


def test_mean_comes_from_the_reference_set_not_the_evaluation_set(model):
    # Reference: only "3". Mean-ablating the counting head writes in "3"'s output, so the
    # model answers "3" everywhere: right on the "3" examples, wrong on the "5" examples. A
    # mean over the evaluation set (3s and 5s mixed) would not give this split.
    evaluation = counting_batch(model, [3, 5, 3, 5])
    reference = collect_reference(model, counting_batch(model, [3, 3]), alignment="position",
                                  options=SweepOptions(progress=False))
    inputs = evaluation.inputs(model, range(4))
    hooks = ablation_hooks(model, inputs, [COUNT_HEAD], "mean", reference)
    logits = model.run_with_hooks(inputs, fwd_hooks=hooks)[:, -1]
    three = model.to_single_token("3")
    assert logits.argmax(-1).tolist() == [three] * 4
    sweep = head_ablation_sweep(model, evaluation, "mean", reference, options=SweepOptions(progress=False))
    assert sweep.ablated_accuracy[COUNT_HEAD] == 0.5
    assert sweep.clean_accuracy == 1.0


def test_ablating_several_heads_together(model):
    counting, colour = counting_batch(model, [2, 8]), colour_batch(model, ["red", "green"])
    mixed = TaskBatch.concat("mixed", [counting, colour])
    inputs = mixed.inputs(model, range(4))

    def predictions(heads):
        hooks = ablation_hooks(model, inputs, heads, "zero")
        with torch.no_grad():
            return model.run_with_hooks(inputs, fwd_hooks=hooks)[:, -1].argmax(-1)

    answers = mixed.answer_ids
    assert torch.equal(predictions([]), answers)
    only_count = predictions([COUNT_HEAD]) == answers
    assert only_count.tolist() == [False, False, True, True]  # colour still answered
    assert not (predictions([COUNT_HEAD, COLOUR_HEAD]) == answers).any()
    with pytest.raises(ValueError, match="outside the model"):
        ablation_hooks(model, inputs, [(2, 0)], "zero")
