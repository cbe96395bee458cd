"""The embedded model's vocabulary, derived from the data module so it cannot drift."""

from __future__ import annotations

from vlens.data import PUNCTUATION, all_template_words

MAX_NUMBER = 20
# Chat roles, and words the lens analyses look for in decoded head outputs (the paper's
# awareness heads decode "difficult"/"impossible" on large counts).
CHAT_WORDS: tuple[str, ...] = ("system", "user", "assistant")
LENS_WORDS: tuple[str, ...] = ("difficult", "impossible", "none", "many", "few", "zero")


def vocabulary_words() -> list[str]:
    """Every word of the task-suite questions and answers, the numbers 0..MAX_NUMBER in
    digits, punctuation, chat roles and lens words; sorted."""
    words = set(all_template_words(MAX_NUMBER)) | set(PUNCTUATION) | set(CHAT_WORDS) | set(LENS_WORDS)
    words |= {str(number) for number in range(MAX_NUMBER + 1)}
    return sorted(words)
