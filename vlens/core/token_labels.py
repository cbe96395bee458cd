"""Readable token labels: each token decoded on its own, as TransformerLens's `to_str_tokens` does.

Byte-level BPE vocabularies store pieces with byte markers ('Ġmany', 'Ċ'); labels in figures,
circuitsvis views and JSON show the decoded text instead (' many', '\\n'). A piece that is
only part of a multi-byte character decodes to the replacement character, as in TransformerLens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast, overload

from torch import Tensor

from vlens.utils.errors import UserInputError


@overload
def str_tokens(tokenizer: Any, tokens: str | int) -> list[str]: ...
@overload
def str_tokens(tokenizer: Any, tokens: str | int | Sequence | Tensor) -> list[str] | list[list[str]]: ...
def str_tokens(tokenizer: Any, tokens: str | int | Sequence | Tensor) -> list[str] | list[list[str]]:
    """Decoded tokens: a string is tokenised first (no special tokens added); an int, a list of ints
    or a 1-D tensor gives a list of strings; a 2-D tensor or a list of lists gives one list per row."""
    if isinstance(tokens, str):
        ids = tokenizer(tokens, add_special_tokens=False)["input_ids"]
        return _decode_each(tokenizer, ids)
    if isinstance(tokens, Tensor):
        if tokens.ndim > 2:
            raise UserInputError(f"to_str_tokens takes a 0-, 1- or 2-D tensor of token ids, got shape {tuple(tokens.shape)}")
        if tokens.ndim == 2:
            return [_decode_each(tokenizer, row) for row in tokens.tolist()]
        return _decode_each(tokenizer, tokens.reshape(-1).tolist())
    if isinstance(tokens, int) or (hasattr(tokens, "__index__") and not isinstance(tokens, Sequence)):
        return _decode_each(tokenizer, [int(tokens)])
    items = list(tokens)
    if items and all(isinstance(item, (list, tuple, Tensor, str)) for item in items):
        return cast(list[list[str]], [str_tokens(tokenizer, item) for item in items])  # one list per row
    return _decode_each(tokenizer, items)


def _decode_each(tokenizer: Any, ids: Sequence) -> list[str]:
    ids = [int(i) for i in (ids.tolist() if isinstance(ids, Tensor) else ids)]
    return tokenizer.batch_decode([[i] for i in ids], clean_up_tokenization_spaces=False)


def token_label(tokenizer: Any, token: int | Tensor) -> str:
    """One token's readable label."""
    return str_tokens(tokenizer, int(token))[0]


__all__ = ["str_tokens", "token_label"]
