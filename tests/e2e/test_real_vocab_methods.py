"""Counts 9-13 on the real Qwen vocabulary ("12" is "1", "2") through patching, the logit lens,
ablation and evaluation, each compared with a hand computation on HF's own model
(teacher-forced log-probabilities from `hf_model` logits, token ids written out by hand)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.real_vocab import real_model
from vlens import SweepOptions
from vlens.data import make_pair

QUESTION = "How many dots are there?"
COUNTS = [9, 10, 11, 12, 13]
IM_END = 151645


def digits(count: int) -> list[int]:
    """Qwen's ids for a count by hand: "0" is 15 .. "9" is 24, one token per digit."""
    return [15 + int(d) for d in str(count)]


@pytest.fixture(scope="module")
def model():
    return real_model()


def hf_logits(model, image, prefix: list[int]) -> torch.Tensor:
    """HF logits [pos, d_vocab] of the chat prompt (processor only) with `prefix` ids appended."""
    processor = model.processor
    text = processor.apply_chat_template([{"role": "user", "content": [{"type": "image"},
                                                                       {"type": "text", "text": QUESTION}]}],
                                         add_generation_prompt=True, tokenize=False)
    enc = processor(text=[text], images=[image], return_tensors="pt")
    ids = torch.cat([enc["input_ids"], torch.tensor([prefix], dtype=torch.long)], 1)
    token_types = torch.cat([enc["mm_token_type_ids"], torch.zeros(1, len(prefix), dtype=torch.long)], 1)
    with torch.no_grad():  # HF needs mm_token_type_ids for M-RoPE positions
        out = model.hf_model(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=enc["pixel_values"],
                             image_grid_thw=enc["image_grid_thw"], mm_token_type_ids=token_types)
    return out.logits[0].float()


def hand_logprob(model, image, answer: list[int]) -> float:
    logp = hf_logits(model, image, answer[:-1]).log_softmax(-1)
    n = len(answer)
    return sum(float(logp[-n + j, t]) for j, t in enumerate(answer))


def images(n: int):
    return [make_pair(c, None, seed=i, size=56, kind="move").clean_image for i, c in enumerate(COUNTS[:n])]


def test_patching_contrast_tokens_and_logit_diff(model):
    from vlens.patching import build_pair_batch, make_count_pairs, patch_layer_region

    pairs = make_count_pairs(6, seed=3, size=56, counts=COUNTS)
    batch = build_pair_batch(model, pairs)
    result = patch_layer_region(model, batch, layers=[0])
    answers = result.to_dict()["answers"]
    for i, example in enumerate(pairs):
        clean, corrupt = digits(int(example.clean_answer)), digits(int(example.corrupt_answer))
        assert answers["clean_answer_tokens"][i] == clean and answers["corrupt_answer_tokens"][i] == corrupt
        shared = 0
        while shared < min(len(clean), len(corrupt)) and clean[shared] == corrupt[shared]:
            shared += 1
        a, b = (clean + [IM_END])[shared], (corrupt + [IM_END])[shared]
        assert (int(batch.clean_tokens[i]), int(batch.corrupt_tokens[i])) == (a, b)
        logits = hf_logits(model, example.clean_image, clean[:shared])[-1]
        expected = float(logits[b] - logits[a])
        assert float(result.baseline.clean_logit_diff[i]) == pytest.approx(expected, abs=1e-4)


def test_logit_lens_scores_the_whole_answer(model):
    from vlens.lens.logit_lens import logit_lens_records

    pictures = images(5)
    records = [{"question": QUESTION, "answer": str(c), "image": img} for c, img in zip(COUNTS, pictures, strict=True)]
    result = logit_lens_records(model, records, options=SweepOptions(batch_size=3))
    data = result.to_dict()
    assert data["answer_tokens"] == [digits(c) for c in COUNTS]
    # labels in the JSON are decoded text (' many', '\n'), never byte-level pieces ('Ġmany', 'Ċ')
    assert data["top_tokens"] == [[model.to_str_tokens(int(t))[0] for t in row] for row in result.top_tokens]
    for i, (count, image) in enumerate(zip(COUNTS, pictures, strict=True)):
        expected = hand_logprob(model, image, digits(count))
        assert float(result.probabilities[-1, i].double().log()) == pytest.approx(expected, abs=1e-4)
        logits = hf_logits(model, image, digits(count)[:-1])
        n = len(digits(count))
        worst = max(int((logits[-n + j] > logits[-n + j, t]).sum()) + 1 for j, t in enumerate(digits(count)))
        assert float(result.ranks[-1, i]) == worst


def test_ablation_whole_answer_logprob_clean_and_ablated(model):
    from vlens.ablation import TaskBatch, answer_token_ids, head_ablation_sweep

    pictures = images(5)
    answers = [str(c) for c in COUNTS]
    task = TaskBatch("counting", [QUESTION] * 5, pictures, answers, answer_token_ids(model, answers))
    sweep = head_ablation_sweep(model, task, "zero", layers=[1], options=SweepOptions(batch_size=2, progress=False))
    assert sweep.to_dict()["answer_tokens"] == [digits(c) for c in COUNTS]
    clean = [hand_logprob(model, img, digits(c)) for c, img in zip(COUNTS, pictures, strict=True)]
    assert sweep.clean_logprob == pytest.approx(sum(clean) / 5, abs=1e-4)
    head, d_head = 2, model.cfg.d_head
    o_proj = model.hf_model.model.language_model.layers[1].self_attn.o_proj

    def zero_head(module, args):
        x = args[0].clone()
        x[..., head * d_head:(head + 1) * d_head] = 0
        return (x,)

    handle = o_proj.register_forward_pre_hook(zero_head)
    try:
        ablated = [hand_logprob(model, img, digits(c)) for c, img in zip(COUNTS, pictures, strict=True)]
    finally:
        handle.remove()
    assert float(sweep.ablated_logprob[1, head]) == pytest.approx(sum(ablated) / 5, abs=1e-4)


def test_eval_records_the_target_tokens_and_logprob(model, tmp_path):
    from vlens.evaluation import EvalDataset, EvalExample, EvalSettings, HookedVLMBackend, evaluate

    pictures = images(5)
    paths = []
    for i, img in enumerate(pictures):
        paths.append(tmp_path / f"{i}.png")
        img.save(paths[-1])
    dataset = EvalDataset(format="imagefolder", source="test", examples=[
        EvalExample(id=f"ex-{c}", images=[str(p)], question=QUESTION, target=c)
        for c, p in zip(COUNTS, paths, strict=True)])
    result = evaluate(HookedVLMBackend(model), dataset, EvalSettings(max_new_tokens=3, post_prompt=""),
                      options=SweepOptions(batch_size=3, progress=False))
    for prediction, count, img in zip(result.predictions, COUNTS, pictures, strict=True):
        assert prediction.target_tokens == digits(count)
        assert prediction.target_logprob == pytest.approx(hand_logprob(model, img, digits(count)), abs=1e-4)
    assert result.metrics.mean_target_logprob == pytest.approx(
        sum(p.target_logprob for p in result.predictions) / 5)
