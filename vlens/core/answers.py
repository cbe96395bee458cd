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

from dataclasses import dataclass
from typing import Any

from vlens.core.answer_tokens import (
    answer_ids,
    answer_logprobs,
    append_tokens,
    describe_ids,
    end_token_id,
    first_difference,
    generation_context,
    teacher_force,
    tokenizer_of,
)
from vlens.utils.errors import UserInputError


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
    prefix, clean_id, corrupt_id = first_difference(model, clean_ids, corrupt_ids, example)
    return Contrast(prefix=prefix, clean_id=clean_id, corrupt_id=corrupt_id, clean_ids=clean_ids, corrupt_ids=corrupt_ids)


def single_token(model: Any, answer: str, method: str, context: str | None = None, example: str = "?") -> int:
    """The answer's only token, or an error naming the answer and its tokens (for one-token methods)."""
    ids = answer_ids(model, answer, context, example)
    if len(ids) != 1:
        raise UserInputError(f"{method} needs single-token answers, but the answer {answer!r} of example {example!r} is "
                         f"{len(ids)} tokens: {describe_ids(tokenizer_of(model), ids)}")
    return ids[0]


__all__ = ["Contrast", "answer_ids", "answer_logprobs", "append_tokens", "contrast", "end_token_id",
           "generation_context", "single_token", "teacher_force"]
