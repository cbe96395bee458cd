"""Comparing a loaded result with the one it was saved from."""

from __future__ import annotations


def without_provenance(data: dict) -> dict:
    """`data` (a `to_dict()`) less its "provenance" block: a loaded result's `to_dict()` is its file, which
    records how it was made; the result it was saved from (never saved itself) has no such block."""
    return {key: value for key, value in data.items() if key != "provenance"}
