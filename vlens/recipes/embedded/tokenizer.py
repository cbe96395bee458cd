"""An offline word-level tokenizer with Qwen's special tokens and chat template.

Every word of the task suites (and every number 0-20) is one token, so a count answer
is exactly one generated token. Built with the `tokenizers` library only: nothing is
downloaded.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from vlens.utils.errors import UserInputError

# Qwen2.5-VL's special tokens, in Qwen's order. They get the first ids of our vocabulary.
QWEN_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
UNKNOWN_TOKEN = "<unk>"

# Words are split on spaces (dropped) and on newlines / punctuation (kept as tokens): "\n"
# must survive because the chat format uses it.
_SPACES = Regex(r"[ \t\r]+")
_NEWLINE_OR_PUNCTUATION = Regex(r"\n|[^\w\s]")

# Qwen2-VL's chat template without the default system prompt. An image part becomes
# <|vision_start|><|image_pad|><|vision_end|>; the processor expands <|image_pad|> to one
# token per merged patch.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or 'image' in part or 'image_url' in part %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'video' or 'video' in part %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in part %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def split_words(text: str) -> list[str]:
    """The words the tokenizer sees in `text` (lowercased; spaces dropped; "\\n" and
    punctuation kept as their own words)."""
    pieces = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(_SPACES, behavior="removed"),
            pre_tokenizers.Split(_NEWLINE_OR_PUNCTUATION, behavior="isolated"),
        ]
    ).pre_tokenize_str(text.lower())
    return [piece for piece, _ in pieces]


def build_tokenizer(words: Iterable[str]) -> PreTrainedTokenizerFast:
    """A word-level `PreTrainedTokenizerFast` over `words` plus Qwen's special tokens.

    `words` may hold sentences: each is split with `split_words`. Ids: special tokens
    0..13, then "<unk>", "\\n", then the words in sorted order (deterministic).
    """
    vocabulary_words = sorted({word for text in words for word in split_words(text)} - {"\n"})
    if not vocabulary_words:
        raise UserInputError("build_tokenizer needs at least one word")
    ordered = [*QWEN_SPECIAL_TOKENS, UNKNOWN_TOKEN, "\n", *vocabulary_words]
    vocab = {token: index for index, token in enumerate(ordered)}

    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNKNOWN_TOKEN))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(_SPACES, behavior="removed"),
            pre_tokenizers.Split(_NEWLINE_OR_PUNCTUATION, behavior="isolated"),
        ]
    )
    # WordPiece's decoder joins words with spaces and removes the space before punctuation.
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=True)

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token=UNKNOWN_TOKEN,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=list(QWEN_SPECIAL_TOKENS),
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
        padding_side="left",
    )
    tokenizer.add_special_tokens({"additional_special_tokens": list(QWEN_SPECIAL_TOKENS)})
    return tokenizer
