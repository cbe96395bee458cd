"""How vlens turns an answer text into tokens and scores it: one rule for every method.

Real tokenizers split answers: Qwen writes "12" as "1", "2"; Llama as "▁", "1", "2".
Every method that scores an answer (patching, attribution patching, logit lens, ablation,
evaluation, SFT labels, the demo) goes through this module:

1. **Tokens.** An answer's tokens are those it gets *as it continues the prompt*: tokenise
   ``context + answer`` and keep what follows the context's own tokens (`answer_ids`). The
   context is the model's chat generation prompt (ending ``<|im_start|>assistant\\n`` for Qwen,
   ``ASSISTANT:`` for LLaVA) unless a method passes its own prompt text; without the chat
   format (``chat=False``) the answer is tokenised on its own, as the start of a text. An answer that is
   empty, holds the tokenizer's unknown token (a word-level vocabulary without "37"), or
   merges with the end of the context is an error naming the example and its tokens.
2. **Contrasts** (clean vs corrupt answer: patching, attribution patching, logit difference):
   the shared prefix of the two token lists is teacher-forced (appended to the prompt) and the
   metric reads the *first token where they differ* at the last position (`contrast`). When one
   answer is a prefix of the other ("1" vs "12"), the end-of-turn token (`tokenizer.eos_token`,
   ``<|im_end|>`` for Qwen) closes the shorter one, so "1" vs "12" compares ``<|im_end|>``
   with "2".
3. **Single answers** (ablation damage, logit lens, evaluation's answer scores): the whole
   answer's teacher-forced log-probability, ``sum_j log p(a_j | prompt, a_<j)``, read from a
   forward over the prompt with all but the last answer token appended (`teacher_force`,
   `answer_logprobs`); "exact" means every answer token is the argmax at its position. No
   end-of-turn token is scored, so single-token answers score exactly as before.
4. Where a method can use only one token, `single_token` raises an error naming the answer
   and its tokens instead of silently taking the first.

Results record each answer's tokens as a list (``answer_tokens: [[16, 17], ...]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float
from torch import Tensor

from vlens.core.processing import chat_prompt
from vlens.core.token_labels import str_tokens
from vlens.utils.errors import UserInputError

if TYPE_CHECKING:
    from vlens.core.inputs import VLMInputs
    from vlens.core.model import HookedVLM


def _tokenizer(model_or_tokenizer: Any):
    processor = getattr(model_or_tokenizer, "processor", None)
    if processor is not None or hasattr(model_or_tokenizer, "cfg"):
        return model_or_tokenizer.tokenizer
    return getattr(model_or_tokenizer, "tokenizer", model_or_tokenizer)


def generation_context(model: HookedVLM, chat: bool = True) -> str:
    """The text an answer follows: the chat format's generation prompt (for a one-word question)."""
    if not chat:
        return ""

    return chat_prompt(model, "?", 0)


def _describe(tokenizer, ids: Sequence[int]) -> str:
    return f"{list(ids)} {str_tokens(tokenizer, list(ids))}"


def answer_ids(model: Any, answer: str, context: str | None = None, example: str = "?",
               chat: bool = True) -> list[int]:
    """The answer's token ids as they continue `context` (default: the model's generation prompt).

    Raises:
        ValueError: naming `example`, when the answer is empty, contains the unknown token, or
            merges with the end of the context (its tokens would not be the model's).
    """
    tokenizer = _tokenizer(model)
    answer = str(answer)
    if not answer.strip():
        raise UserInputError(f"example {example!r}: the answer is empty; every scored example needs an answer")
    if context is None:
        context = generation_context(model, chat) if hasattr(model, "cfg") else ""
    context_ids = tokenizer(context, add_special_tokens=False)["input_ids"] if context else []
    full = tokenizer(context + answer, add_special_tokens=False)["input_ids"]
    if full[: len(context_ids)] != context_ids:
        raise UserInputError(f"example {example!r}: the answer {answer!r} merges with the end of the prompt when "
                         f"tokenised ({_describe(tokenizer, full[-len(context_ids) or None:][-6:])}); start it with "
                         "a separator the tokenizer keeps apart")
    ids = [int(i) for i in full[len(context_ids):]]
    if not ids:
        raise UserInputError(f"example {example!r}: the answer {answer!r} tokenises to nothing")
    unknown = getattr(tokenizer, "unk_token_id", None)
    if unknown is not None and unknown in ids:
        raise UserInputError(f"example {example!r}: the answer {answer!r} is not in the model's vocabulary (the tokenizer cannot express it): "
                         f"it tokenises to {_describe(tokenizer, ids)} with the unknown token "
                         f"{tokenizer.unk_token!r}. Use answers the tokenizer covers (e.g. counts the embedded "
                         "model knows, 0-10) or a model with a byte-level vocabulary.")
    return ids


def end_token_id(model: Any) -> int:
    """The end-of-turn token that closes an answer (`tokenizer.eos_token_id`)."""
    tokenizer = _tokenizer(model)
    if tokenizer.eos_token_id is None:
        raise UserInputError("the tokenizer has no eos_token: set one so answers can be closed")
    return int(tokenizer.eos_token_id)


@dataclass(frozen=True)
class Contrast:
    """Two answers as the contrast metrics read them.

    prefix: the shared answer tokens, teacher-forced after the prompt.
    clean_id / corrupt_id: the first tokens where they differ (read at the last position).
    clean_ids / corrupt_ids: the answers' full tokens (recorded in results).
    """

    prefix: list[int]
    clean_id: int
    corrupt_id: int
    clean_ids: list[int]
    corrupt_ids: list[int]


def contrast(model: Any, clean: str, corrupt: str, context: str | None = None, example: str = "?",
             chat: bool = True) -> Contrast:
    """The shared prefix and the first differing token of two answers (module docstring, rule 2)."""
    clean_ids = answer_ids(model, clean, context, example, chat)
    corrupt_ids = answer_ids(model, corrupt, context, example, chat)
    if clean_ids == corrupt_ids:
        raise UserInputError(f"example {example!r}: the clean answer {clean!r} and the corrupt answer {corrupt!r} have "
                         "no differing token, so nothing can flip. Contrast metrics need pairs whose answers differ.")
    a, b = clean_ids, corrupt_ids
    if a[: len(b)] == b or b[: len(a)] == a:  # one answer is a prefix of the other: close both
        end = end_token_id(model)
        a, b = a + [end], b + [end]
    i = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    return Contrast(prefix=a[:i], clean_id=a[i], corrupt_id=b[i], clean_ids=clean_ids, corrupt_ids=corrupt_ids)


def single_token(model: Any, answer: str, method: str, context: str | None = None, example: str = "?") -> int:
    """The answer's only token, or an error naming the answer and its tokens (for one-token methods)."""
    ids = answer_ids(model, answer, context, example)
    if len(ids) != 1:
        raise UserInputError(f"{method} needs single-token answers, but the answer {answer!r} of example {example!r} is "
                         f"{len(ids)} tokens: {_describe(_tokenizer(model), ids)}")
    return ids[0]


def append_tokens(model: HookedVLM, inputs: VLMInputs, suffixes: Sequence[Sequence[int]]) -> VLMInputs:
    """Append token ids after each row's prompt, keeping the batch left-padded (teacher forcing)."""
    if len(suffixes) != inputs.batch_size:
        raise ValueError(f"got {len(suffixes)} token suffixes for a batch of {inputs.batch_size}")
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
    for key in ("pixel_values", "image_grid_thw"):
        if getattr(inputs, key) is not None:
            hf[key] = getattr(inputs, key).cpu()
    hf.update(inputs.extra)
    return model.coerce_inputs(hf)


def teacher_force(model: HookedVLM, inputs: VLMInputs, answers: Sequence[Sequence[int]]) -> VLMInputs:
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
        raise ValueError(f"answer_logprobs needs logits [batch={len(answers)}, pos, d_vocab], got {tuple(logits.shape)}")
    longest = max(len(a) for a in answers)
    if longest > logits.shape[1]:
        raise ValueError(f"an answer has {longest} tokens but only {logits.shape[1]} positions of logits were given")
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


