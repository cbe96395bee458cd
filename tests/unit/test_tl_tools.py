"""TransformerLens 4.3's analysis tools, called as TransformerLens ships them, on a tiny HookedVLM.

`utilities.test_prompt`, `evals.sanity_check`, `SVDInterpreter`, `head_detector.detect_head` and
`all_composition_scores`; each result is checked against the computation it stands for, done
here by hand from the model's weights or its logits (and HF's loss for the sanity check).
"""

from __future__ import annotations

import functools
import re

import pytest
import torch
import torch.nn.functional as F
from transformer_lens import SVDInterpreter, evals
from transformer_lens.head_detector import detect_head
from transformer_lens.utilities import test_prompt as tl_test_prompt

from vlens import HookedVLM
from vlens.testing import (
    tiny_gemma3_model,
    tiny_gemma3_processor,
    tiny_hf_model,
    tiny_qwen3_5_model,
    tiny_qwen3_vl_processor,
    tiny_qwen_processor,
)
from vlens.utils.errors import UserInputError

TEXT = "How many red dots are there in the picture"


@functools.lru_cache(maxsize=4)
def _model(family: str = "qwen2_5_vl") -> HookedVLM:
    if family == "gemma3":
        return HookedVLM.from_hf(tiny_gemma3_model(), processor=tiny_gemma3_processor())
    if family == "qwen3_5":
        return HookedVLM.from_hf(tiny_qwen3_5_model(n_layers=4), processor=tiny_qwen3_vl_processor())
    return HookedVLM.from_hf(tiny_hf_model(family), processor=tiny_qwen_processor())


# ---------------------------------------------------------------------- tokens
def test_to_str_tokens_and_to_tokens_follow_prepend_bos():
    gemma = _model("gemma3")  # cfg.default_prepend_bos is True, as for Gemma checkpoints
    bos = gemma.tokenizer.bos_token
    assert gemma.to_str_tokens("red green") == [bos, "red", "green"]
    assert gemma.to_str_tokens("red green", prepend_bos=True) == [bos, "red", "green"]
    assert gemma.to_str_tokens("red green", prepend_bos=False) == ["red", "green"]
    assert gemma.to_str_tokens(["red", "red green"], prepend_bos=False) == [["red"], ["red", "green"]]
    assert gemma.to_tokens("red green")[0, 0].item() == gemma.tokenizer.bos_token_id
    ids = gemma.to_tokens("red green", prepend_bos=False)
    assert gemma.to_str_tokens(ids[0], prepend_bos=True) == ["red", "green"]  # ids: prepend_bos is ignored
    qwen = _model()  # Qwen: no BOS, default False
    assert qwen.to_str_tokens("red green") == ["red", "green"]
    with pytest.raises(UserInputError, match="no BOS"):
        qwen.to_str_tokens("red green", prepend_bos=True)


def test_text_input_runs_the_text_alone_and_masks_padding():
    model = _model()
    tokens = model.to_tokens(TEXT)
    assert torch.equal(model(TEXT), model(tokens))
    short = "red dots"
    batch = model([TEXT, short])  # the short row is padded on the tokenizer's side, padding masked
    n_short = model.to_tokens(short).shape[1]
    rows = model.to_tokens([TEXT, short])
    assert rows.shape[1] == tokens.shape[1]
    side = model.tokenizer.padding_side
    kept = slice(0, n_short) if side == "right" else slice(rows.shape[1] - n_short, None)
    torch.testing.assert_close(batch[1, kept], model(short)[0], atol=1e-5, rtol=0)


# ---------------------------------------------------------------------- test_prompt
def _ranks_printed(text: str) -> list[int]:
    return [int(rank) for rank in re.findall(r"Rank: (\d+)", text)]


def test_test_prompt_prints_the_ranks_of_the_answer_tokens(capsys):
    model = _model()
    answer = "red green"  # two tokens: each is ranked after the prompt and the answer's earlier tokens
    tl_test_prompt(TEXT, answer, model, prepend_space_to_answer=False, top_k=3)
    printed = capsys.readouterr().out
    prompt = model.to_tokens(TEXT)[0].tolist()
    answer_ids = model.to_tokens(answer)[0].tolist()
    logits = model(torch.tensor([prompt + answer_ids]))[0]
    expected = []
    for j, token in enumerate(answer_ids):
        row = logits[len(prompt) + j - 1]
        expected.append(int((row > row[token]).sum()))  # how many tokens score above the answer
    assert len(answer_ids) == 2
    assert _ranks_printed(printed) == expected
    assert f"Tokenized prompt: {model.to_str_tokens(TEXT)}" in printed

    tl_test_prompt(TEXT, ["red", "green", "dots"], model, prepend_space_to_answer=False, print_details=True)
    printed = capsys.readouterr().out
    row = logits[len(prompt) - 1]
    ids = [model.to_single_token(word) for word in ("red", "green", "dots")]
    assert _ranks_printed(printed) == [int((row > row[i]).sum()) for i in ids]


# ---------------------------------------------------------------------- evals.sanity_check
@pytest.mark.parametrize("family", ["qwen2_5_vl", "gemma3"])
def test_sanity_check_is_the_next_token_loss_of_its_text(family):
    model = _model(family)
    loss = evals.sanity_check(model)
    text = ("Many important transition points in the history of science have been moments when science 'zoomed "
            "in.' At these points, we develop a visualization or tool that allows us to see the world in a new "
            "level of detail, and a new field of science develops to study the world through this lens.")
    tokens = model.to_tokens(text)
    logits = model(tokens)
    by_hand = F.cross_entropy(logits[0, :-1].float(), tokens[0, 1:])
    torch.testing.assert_close(loss, by_hand, atol=1e-5, rtol=0)
    hf = model.hf_model(input_ids=tokens, attention_mask=torch.ones_like(tokens), labels=tokens).loss
    torch.testing.assert_close(loss, hf, atol=1e-4, rtol=0)


# ---------------------------------------------------------------------- SVDInterpreter
def _same_up_to_sign(a: torch.Tensor, b: torch.Tensor) -> None:
    """Columns of a and b [d_vocab, k] equal up to each column's sign (singular vectors have no sign)."""
    signs = torch.sign((a * b).sum(0))
    torch.testing.assert_close(a, b * signs, atol=1e-4, rtol=1e-4)


def test_svd_interpreter_reads_the_ov_and_mlp_singular_vectors():
    model = _model()
    svd = SVDInterpreter(model)
    layer, head, k = 1, 2, 3
    W_U = model.W_U
    U, S, Vh = torch.linalg.svd(model.blocks[layer].attn.W_V[head] @ model.blocks[layer].attn.W_O[head])
    ov = svd.get_singular_vectors("OV", layer_index=layer, head_index=head, num_vectors=k)
    assert ov.shape == (model.cfg.d_vocab, 1, k)
    _same_up_to_sign(ov[:, 0], W_U.T @ Vh[:k].T)
    # W_in reads ln2(x), whose weight is not folded: TransformerLens multiplies it in
    w_in = model.blocks[layer].mlp.W_in.T * model.blocks[layer].ln2.w
    _, _, Vh_in = torch.linalg.svd(w_in)
    _same_up_to_sign(svd.get_singular_vectors("w_in", layer_index=layer, num_vectors=k)[:, 0], W_U.T @ Vh_in[:k].T)
    _, _, Vh_out = torch.linalg.svd(model.blocks[layer].mlp.W_out)
    _same_up_to_sign(svd.get_singular_vectors("w_out", layer_index=layer, num_vectors=k)[:, 0], W_U.T @ Vh_out[:k].T)


def test_tl_parameters_name_every_dense_weight_and_the_norm_factor():
    gemma = _model("gemma3")  # zero-centred norms: the factor is 1 + w
    params = gemma.tl_parameters()
    block = gemma.blocks[0]
    torch.testing.assert_close(params["blocks.0.ln2.w"], 1.0 + block.ln2.w)
    assert torch.equal(params["blocks.0.attn.W_V"], block.attn.W_V)
    assert params["blocks.0.attn.W_V"].shape == (gemma.cfg.n_heads, gemma.cfg.d_model, gemma.cfg.d_head)
    assert torch.equal(params["unembed.W_U"], gemma.W_U)
    hybrid = _model("qwen3_5")  # Gated DeltaNet layers have no W_Q
    names = hybrid.tl_parameters()
    for block in hybrid.blocks:
        assert (f"blocks.{block.layer}.attn.W_Q" in names) == hasattr(type(block.attn), "W_Q")


# ---------------------------------------------------------------------- detect_head
def _pattern_by_hand(cache, layer: int, n_heads: int) -> torch.Tensor:
    """softmax(q k^T / sqrt(d_head)) with the causal mask, from the cached rotated queries and keys."""
    q = cache[f"blocks.{layer}.attn.hook_rot_q"]  # [pos, n_heads, d_head] (batch dim removed)
    k = cache[f"blocks.{layer}.attn.hook_rot_k"]  # [pos, n_kv_heads, d_head]
    k = k.repeat_interleave(n_heads // k.shape[1], dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) / q.shape[-1] ** 0.5
    causal = torch.ones(q.shape[0], q.shape[0], dtype=torch.bool).tril()
    return scores.masked_fill(~causal, float("-inf")).softmax(-1)


def test_detect_head_scores_previous_token_attention_by_hand():
    model = _model()
    tokens = model.to_tokens(TEXT)
    scores = detect_head(model, TEXT, "previous_token_head")
    _, cache = model.run_with_cache(tokens, remove_batch_dim=True)
    n = tokens.shape[1]
    previous = torch.zeros(n, n)
    previous[1:, :-1] = torch.eye(n - 1)
    for layer in range(model.cfg.n_layers):
        pattern = _pattern_by_hand(cache, layer, model.cfg.n_heads)
        by_hand = (pattern * previous).sum((-1, -2)) / pattern.sum((-1, -2))
        torch.testing.assert_close(scores[layer].float(), by_hand, atol=1e-5, rtol=0)


def test_detect_head_finds_a_planted_previous_token_head():
    model = _model()
    tokens = model.to_tokens(TEXT)
    n = tokens.shape[1]
    planted = (1, 3)

    def previous_only(scores, hook):  # the planted head attends to the previous token only (itself at 0)
        keep = torch.eye(n, dtype=torch.bool).roll(-1, dims=1).tril()
        keep[0, 0] = True
        scores[:, planted[1]] = scores[:, planted[1]].masked_fill(~keep, float("-inf"))
        return scores

    with model.hooks(fwd_hooks=[(f"blocks.{planted[0]}.attn.hook_attn_scores", previous_only)]):
        _, cache = model.run_with_cache(tokens, remove_batch_dim=True)
    scores = detect_head(model, TEXT, "previous_token_head", cache=cache)
    assert scores[planted].item() == pytest.approx((n - 1) / n, abs=1e-6)  # row 0 has no previous token
    assert scores[planted].item() > scores.flatten().sort().values[-2].item()  # the best head by far
    assert scores.argmax().item() == planted[0] * model.cfg.n_heads + planted[1]


# ---------------------------------------------------------------------- composition scores
@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_5"])
@pytest.mark.parametrize("mode", ["Q", "K", "V"])
def test_all_composition_scores_by_hand(family, mode):
    model = _model(family)
    result = model.all_composition_scores(mode)
    layers = [block for block in model.blocks if hasattr(type(block.attn), "W_Q")]
    assert result.layer_indices == [block.layer for block in layers]
    H = model.cfg.n_heads
    assert result.shape == (len(layers), H, len(layers), H)

    def factor(block):  # what ln1 multiplies by: w, or 1 + w for a zero-centred norm (Qwen3.5)
        return block.ln1.effective_weight if hasattr(block.ln1, "effective_weight") else block.ln1.w

    def ov(block, h):  # d_model x d_model, reading ln1(x): the ln1 factor on the input side
        return torch.diag(factor(block)) @ block.attn.W_V[h] @ block.attn.W_O[h]

    def qk(block, h):
        w = torch.diag(factor(block))
        return (w @ block.attn.W_Q[h]) @ (w @ block.attn.W_K[h]).T

    for i, early in enumerate(layers):
        for j, late in enumerate(layers):
            for h1 in range(H):
                for h2 in range(H):
                    if i >= j:
                        assert result[i, h1, j, h2].item() == 0.0
                        continue
                    left = ov(early, h1)
                    right = qk(late, h2) if mode == "Q" else qk(late, h2).T if mode == "K" else ov(late, h2)
                    by_hand = (left @ right).norm() / (left.norm() * right.norm())
                    assert result[i, h1, j, h2].item() == pytest.approx(by_hand.item(), rel=1e-4, abs=1e-6)
    assert result.head_labels[H] == f"L{layers[1].layer}H0"
    with pytest.raises(UserInputError, match="mode"):
        model.all_composition_scores("X")  # type: ignore[arg-type]
