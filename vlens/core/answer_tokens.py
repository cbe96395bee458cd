"""Answer text -> token ids, and teacher forcing: the token side of vlens's answer rule.

`vlens.core.answers` states the rule (its docstring) and builds contrasts on top of these; the
model's `prepare(..., answers=...)` and `answer_logit_diff` use them directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float
from torch import Tensor

from vlens.core.processing import chat_prompt
from vlens.core.token_labels import str_tokens
from vlens.utils.errors import UserInputError

if TYPE_CHECKING:
    from vlens.core.inputs import VLMInputs


def tokenizer_of(model_or_tokenizer: Any):
    """The tokenizer of a model (or of a processor; a tokenizer itself)."""
    processor = getattr(model_or_tokenizer, "processor", None)
    if processor is not None or hasattr(model_or_tokenizer, "cfg"):
        return model_or_tokenizer.tokenizer
    return getattr(model_or_tokenizer, "tokenizer", model_or_tokenizer)


def generation_context(model: Any, chat: bool = True) -> str:
    """The text an answer follows: the chat format's generation prompt (for a one-word question)."""
    if not chat:
        return ""

    return chat_prompt(model, "?", 0)


def describe_ids(tokenizer: Any, ids: Sequence[int]) -> str:
    """Token ids with their strings, for error messages: ``[16, 17] ['1', '2']``."""
    return f"{list(ids)} {str_tokens(tokenizer, list(ids))}"


def answer_ids(model: Any, answer: str, context: str | None = None, example: str = "?",
               chat: bool = True) -> list[int]:
    """The answer's token ids as they continue `context` (default: the model's generation prompt).

    Raises:
        ValueError: naming `example`, when the answer is empty, contains the unknown token, or
            merges with the end of the context (its tokens would not be the model's).
    """
    tokenizer = tokenizer_of(model)
    answer = str(answer)
    if not answer.strip():
        raise UserInputError(f"example {example!r}: the answer is empty; every scored example needs an answer")
    if context is None:
        context = generation_context(model, chat) if hasattr(model, "cfg") else ""
    context_ids = tokenizer(context, add_special_tokens=False)["input_ids"] if context else []
    full = tokenizer(context + answer, add_special_tokens=False)["input_ids"]
    if full[: len(context_ids)] != context_ids:
        raise UserInputError(f"example {example!r}: the answer {answer!r} merges with the end of the prompt when "
                         f"tokenised ({describe_ids(tokenizer, full[-len(context_ids) or None:][-6:])}); start it with "
                         "a separator the tokenizer keeps apart")
    ids = [int(i) for i in full[len(context_ids):]]
    if not ids:
        raise UserInputError(f"example {example!r}: the answer {answer!r} tokenises to nothing")
    unknown = getattr(tokenizer, "unk_token_id", None)
    if unknown is not None and unknown in ids:
        raise UserInputError(f"example {example!r}: the answer {answer!r} is not in the model's vocabulary (the tokenizer cannot express it): "
                         f"it tokenises to {describe_ids(tokenizer, ids)} with the unknown token "
                         f"{tokenizer.unk_token!r}. Use answers the tokenizer covers (e.g. counts the embedded "
                         "model knows, 0-10) or a model with a byte-level vocabulary.")
    return ids


def end_token_id(model: Any) -> int:
    """The end-of-turn token that closes an answer (`tokenizer.eos_token_id`)."""
    tokenizer = tokenizer_of(model)
    if tokenizer.eos_token_id is None:
        raise UserInputError("the tokenizer has no eos_token: set one so answers can be closed")
    return int(tokenizer.eos_token_id)


def first_difference(model: Any, a: Sequence[int], b: Sequence[int], example: str = "?") -> tuple[list[int], int, int]:
    """(shared prefix, a's token, b's token) at the first token where two answers' ids differ; when
    one is a prefix of the other both are closed by the end-of-turn token first (`vlens.core.answers`,
    rule 2)."""
    a, b = list(a), list(b)
    if a == b:
        raise UserInputError(f"example {example!r}: the two answers have the same tokens {describe_ids(tokenizer_of(model), a)}, "
                             "so nothing tells them apart; contrast answers that differ.")
    if a[: len(b)] == b or b[: len(a)] == a:  # one answer is a prefix of the other: close both
        end = end_token_id(model)
        a, b = a + [end], b + [end]
    i = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    return a[:i], a[i], b[i]


def append_tokens(model: Any, inputs: VLMInputs, suffixes: Sequence[Sequence[int]]) -> VLMInputs:
    """Append token ids after each row's prompt, keeping the batch left-padded (teacher forcing)."""
    if len(suffixes) != inputs.batch_size:
        raise UserInputError(f"got {len(suffixes)} token suffixes for a batch of {inputs.batch_size}")
    if not any(len(s) for s in suffixes):
        return inputs
    pad_id = model.tokenizer.pad_token_id or 0
    rows = []
    for row, suffix in enumerate(suffixes):
        keep = inputs.attention_mask[row].bool()
        rows.append(torch.cat([inputs.input_ids[row][keep].cpu(), torch.tensor(list(suffix), dtype=torch.long)]))
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = r
        mask[i, width - len(r):] = 1
    hf = {"input_ids": ids, "attention_mask": mask}
    for key in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts"):
        if getattr(inputs, key) is not None:
            hf[key] = getattr(inputs, key).cpu()
    hf.update(inputs.extra)
    out = model.coerce_inputs(hf)
    if inputs.video_fps is not None and out.regions is not None and inputs.regions is not None:
        out.video_fps = list(inputs.video_fps)  # the frames' times are the prompt's (the fps is not in the tensors)
        out.regions.frame_times = inputs.regions.frame_times
    return out


def teacher_force(model: Any, inputs: VLMInputs, answers: Sequence[Sequence[int]]) -> VLMInputs:
    """`inputs` with each row's answer appended but its last token: the last len(answer) positions
    then predict the answer's tokens (read them with `answer_logprobs`)."""
    return append_tokens(model, inputs, [list(a)[:-1] for a in answers])


def answer_logprobs(logits: Float[Tensor, "batch pos d_vocab"], answers: Sequence[Sequence[int]]
                    ) -> tuple[Float[Tensor, "batch"], Tensor]:
    """(whole-answer log-probability, exact) per row from teacher-forced logits.

    logits: [batch, pos, d_vocab] of a `teacher_force`d batch (or only its last K positions,
        K >= the longest answer); position pos - n + j predicts token j of an n-token answer.
    exact: bool [batch], every answer token is the argmax at its position.
    """
    if logits.ndim != 3 or logits.shape[0] != len(answers):
        raise UserInputError(f"answer_logprobs needs logits [batch={len(answers)}, pos, d_vocab], got {tuple(logits.shape)}")
    longest = max(len(a) for a in answers)
    if longest > logits.shape[1]:
        raise UserInputError(f"an answer has {longest} tokens but only {logits.shape[1]} positions of logits were given")
    tail = logits[:, -longest:].detach().float()
    log_probs = tail.log_softmax(-1)
    best = tail.argmax(-1)
    total, exact = torch.zeros(len(answers)), torch.zeros(len(answers), dtype=torch.bool)
    for row, ids in enumerate(answers):
        n = len(ids)
        target = torch.tensor(list(ids), device=tail.device)
        cols = torch.arange(longest - n, longest, device=tail.device)
        total[row] = log_probs[row, cols, target].sum().cpu()
        exact[row] = bool((best[row, cols] == target).all())
    return total, exact


