"""Batches of controlled clean/corrupt pairs, ready for patching.

A `PairBatch` holds the clean and the corrupt inputs of N pairs (row i of each is pair i),
the answer tokens that the metrics compare, and the pair ids. Building one validates that
every pair is aligned: the same sequence length and the same image / text / final
positions in both roles, so that "position p" means the same token slot in both runs.

Answer tokens: the clean answer is the clean record's ground-truth ``answer`` and the
corrupt answer the corrupt record's (e.g. "3" and "5"). They follow vlens's one answer rule
(`vlens.core.answers.contrast`): each is tokenised as it continues the chat prompt, their shared
prefix is teacher-forced (appended to the prompt: "12" vs "13" under Qwen's digit tokenizer
appends "1"), and the metric token is the first token where they differ, read at the final
position; "1" vs "12" compares the end-of-turn token with "2".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

from vlens.core.answers import append_tokens, contrast
from vlens.core.inputs import VLMInputs
from vlens.data import VideoPair, make_pair, make_video_pair, read_imagefolder, record_image
from vlens.datasets import DatasetError, record_dicts
from vlens.parallel.options import Readout
from vlens.utils.errors import UserInputError
from vlens.utils.validation import check_count
from vlens.zoo.image_sizes import render_size

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM


@dataclass
class PairExample:
    """One pair before tokenisation: two images and their prompts / ground-truth answers.

    video_fps: None for an image pair; for a video pair (`vlens.data.make_video_pair`) the frame rate,
    and `clean_image` / `corrupt_image` are the two videos (lists of frames).
    """

    pair_id: str
    clean_image: Any
    corrupt_image: Any
    clean_prompt: str
    corrupt_prompt: str
    clean_answer: str
    corrupt_answer: str
    video_fps: float | None = None


class PairAnswers(TypedDict):
    """The pairs' answers and their tokens as results files record them (`PairBatch.answers_json`; checked when a
    file is read)."""

    answer_rule: str
    clean_answers: list[str]
    corrupt_answers: list[str]
    clean_answer_tokens: list[list[int]] | None
    corrupt_answer_tokens: list[list[int]] | None
    answer_prefix_len: list[int]
    clean_metric_token: list[int]
    corrupt_metric_token: list[int]


@dataclass
class PairBatch:
    """N aligned pairs. Row i of `clean` and of `corrupt` is pair `pair_ids[i]`.

    clean_tokens / corrupt_tokens: [n_pairs] the answer token ids read at the final position.
    answer_prefix_len: per pair, how many shared answer tokens were appended to the prompt.
    clean_answer_ids / corrupt_answer_ids: per pair, every token of each answer.
    """

    pair_ids: list[str]
    clean: VLMInputs
    corrupt: VLMInputs
    clean_tokens: Int[Tensor, "n_pairs"]
    corrupt_tokens: Int[Tensor, "n_pairs"]
    clean_answers: list[str]
    corrupt_answers: list[str]
    answer_prefix_len: list[int]
    clean_answer_ids: list[list[int]] | None = None
    corrupt_answer_ids: list[list[int]] | None = None

    @property
    def n_pairs(self) -> int:
        return len(self.pair_ids)

    @property
    def seq_len(self) -> int:
        return self.clean.seq_len

    @property
    def final(self) -> Int[Tensor, "n_pairs"]:
        return self.clean.token_regions.final

    def region_mask(self, region: str) -> Tensor:
        """bool [n_pairs, seq_len]: where `region` ("image", "text", "final", "all") is, in both roles."""
        return self.clean.token_regions.mask(region, self.seq_len)

    def readout_positions(self, readout: Readout = "final") -> Int[Tensor, "n_pairs n_readout"]:
        """Where a patching metric reads the logits, per pair: "final" (each row's final prompt
        position) or column index / indices of the left-padded batch (negative from the end:
        -1 is the final column of every row)."""
        if isinstance(readout, str):
            if readout != "final":
                raise UserInputError(f"readout must be 'final' or column indices, got {readout!r}")
            return self.final.view(-1, 1).long().cpu()
        columns = [int(readout)] if isinstance(readout, int) else [int(c) for c in readout]
        if not columns:
            raise UserInputError("readout names no position: give 'final' or at least one column")
        bad = [c for c in columns if not -self.seq_len <= c < self.seq_len]
        if bad:
            raise UserInputError(f"readout columns {bad} lie outside the batch's {self.seq_len} positions")
        columns = [c % self.seq_len for c in columns]
        padded = [(self.pair_ids[row], c) for row in range(self.n_pairs) for c in columns
                  if not bool(self.clean.attention_mask[row, c])]
        if padded:
            raise UserInputError(f"readout columns fall on padding for (pair, column) {padded[:4]}: read at "
                                 "columns every pair fills (negative columns count from the final one)")
        return torch.tensor(columns, dtype=torch.long).expand(self.n_pairs, -1).clone()

    def select(self, rows: Sequence[int]) -> PairBatch:
        """A batch of only some pairs (e.g. those the model answers correctly)."""
        rows = [int(r) for r in rows]
        if not rows:
            raise UserInputError("select() needs at least one pair: pass the indices of the pairs to keep")
        return PairBatch(
            pair_ids=[self.pair_ids[r] for r in rows],
            clean=_select_rows(self.clean, rows),
            corrupt=_select_rows(self.corrupt, rows),
            clean_tokens=self.clean_tokens[rows],
            corrupt_tokens=self.corrupt_tokens[rows],
            clean_answers=[self.clean_answers[r] for r in rows],
            corrupt_answers=[self.corrupt_answers[r] for r in rows],
            answer_prefix_len=[self.answer_prefix_len[r] for r in rows],
            clean_answer_ids=None if self.clean_answer_ids is None else [self.clean_answer_ids[r] for r in rows],
            corrupt_answer_ids=None if self.corrupt_answer_ids is None else [self.corrupt_answer_ids[r] for r in rows],
        )

    def swapped(self) -> PairBatch:
        """The same pairs with the roles exchanged (the corrupt run becomes the one patched): what a
        denoising sweep runs, so that every metric reads base and source the same way."""
        return PairBatch(
            pair_ids=list(self.pair_ids), clean=self.corrupt, corrupt=self.clean,
            clean_tokens=self.corrupt_tokens, corrupt_tokens=self.clean_tokens,
            clean_answers=list(self.corrupt_answers), corrupt_answers=list(self.clean_answers),
            answer_prefix_len=list(self.answer_prefix_len),
            clean_answer_ids=self.corrupt_answer_ids, corrupt_answer_ids=self.clean_answer_ids,
        )

    def answers_json(self) -> PairAnswers:
        """The answers and their tokens (lists), as results.json records them."""
        return {
            "answer_rule": "vlens.core.answers.contrast: shared answer prefix teacher-forced, first differing token "
                           "(end-of-turn closes an answer that is a prefix of the other)",
            "clean_answers": list(self.clean_answers), "corrupt_answers": list(self.corrupt_answers),
            "clean_answer_tokens": self.clean_answer_ids, "corrupt_answer_tokens": self.corrupt_answer_ids,
            "answer_prefix_len": list(self.answer_prefix_len),
            "clean_metric_token": self.clean_tokens.tolist(), "corrupt_metric_token": self.corrupt_tokens.tolist(),
        }


# ---------------------------------------------------------------------- sources of pairs
def examples_from_pairs(pairs: Sequence[Any]) -> list[PairExample]:
    """`vlens.data.Pair` / `VideoPair` objects -> `PairExample`s (prompt = the record's question)."""
    return [
        PairExample(p.pair_id, p.clean_frames, p.corrupt_frames, p.clean_record["question"],
                    p.corrupt_record["question"], str(p.clean_record["answer"]), str(p.corrupt_record["answer"]),
                    video_fps=p.fps)
        if isinstance(p, VideoPair) else
        PairExample(p.pair_id, p.clean_image, p.corrupt_image, p.clean_record["question"],
                    p.corrupt_record["question"], str(p.clean_record["answer"]), str(p.corrupt_record["answer"]))
        for p in pairs
    ]


def count_draws(n: int, seed: int, counts: Sequence[int], what: str) -> list[tuple[int, int]]:
    """`n` (clean, corrupt) counts: clean drawn from `counts`, corrupt another of them at most 2 away."""
    if n < 1:
        raise UserInputError(f"{what} needs n >= 1, got {n}")
    rng = np.random.default_rng(seed)
    counts = [int(c) for c in counts]
    draws = []
    for _ in range(n):
        n_clean = int(rng.choice(counts))
        options = [c for c in counts if c != n_clean and abs(c - n_clean) <= 2]
        draws.append((n_clean, int(rng.choice(options))))
    return draws


def make_video_count_pairs(n: int, seed: int = 0, frames: int = 4, size: int = 112, style: str = "syndot",
                           counts: Sequence[int] = tuple(range(1, 7)), fps: float = 2.0) -> list[PairExample]:
    """`n` video counting pairs (`vlens.data.make_video_pair`: objects appear across `frames` frames; clean
    count c, corrupt c +- 1 or 2), deterministic in seed."""
    return examples_from_pairs([
        make_video_pair(n_clean, n_corrupt, frames, seed=seed * 100_003 + i, style=style, size=size, fps=fps,
                        pair_id=f"{style}-video-{seed}-{i}")
        for i, (n_clean, n_corrupt) in enumerate(count_draws(n, seed, counts, "make_video_count_pairs"))])


def make_count_pairs(n: int, seed: int = 0, size: int | None = None, style: str = "syndot",
                     counts: Sequence[int] = tuple(range(1, 10))) -> list[PairExample]:
    """`n` controlled counting pairs (clean count c, corrupt count c +- 1 or 2), deterministic in seed.

    size: image side in pixels; None: the embedded model's own size, so its processor keeps the
    drawn pixels (`vlens.zoo.image_sizes.render_size`; pass ``render_size(model)`` for another model's).
    """
    side = render_size(image_size=size)
    return examples_from_pairs([
        make_pair(n_clean, n_corrupt, seed=seed * 100_003 + i, style=style, size=side,
                  pair_id=f"{style}-count-{seed}-{i}")
        for i, (n_clean, n_corrupt) in enumerate(count_draws(n, seed, counts, "make_count_pairs"))])


def examples_from_records(records: Sequence[dict]) -> list[PairExample]:
    """Imagefolder records with `pair_id` and `role` ("clean"/"corrupt") columns -> pairs, in file order.

    Each record needs `question`, `answer` and either `image_path` (from `read_imagefolder`)
    or an `image`. Raises a ValueError naming the pair if a role is missing or repeated.
    """
    by_pair: dict[str, dict[str, dict]] = {}
    for index, record in enumerate(records):
        for key in ("pair_id", "role", "question", "answer"):
            if key not in record:
                raise UserInputError(f"record {index} ({record.get('file_name', '?')}) has no {key!r} column; a pair "
                                 "dataset needs pair_id, role, question and answer (write it with `vlens data pairs`)")
        role = record["role"]
        if role not in ("clean", "corrupt"):
            raise UserInputError(f"record {index} of pair {record['pair_id']!r} has role {role!r}; use 'clean' or 'corrupt'")
        roles = by_pair.setdefault(str(record["pair_id"]), {})
        if role in roles:
            raise UserInputError(f"pair {record['pair_id']!r} has two {role!r} records; each pair needs exactly one of each")
        roles[role] = record
    examples = []
    for pair_id, roles in by_pair.items():
        missing = {"clean", "corrupt"} - set(roles)
        if missing:
            raise UserInputError(f"pair {pair_id!r} has no {sorted(missing)[0]!r} record; each pair needs one clean "
                             "and one corrupt record")
        clean, corrupt = roles["clean"], roles["corrupt"]
        examples.append(PairExample(pair_id, record_image(clean), record_image(corrupt), clean["question"],
                                    corrupt["question"], str(clean["answer"]), str(corrupt["answer"])))
    if not examples:
        raise UserInputError("no pairs found (the dataset is empty): write pairs with `vlens data pairs` or check the path")
    return examples


def pairs_from_dataset(dataset, limit: int | None = None) -> list[PairExample]:
    """Pairs from any dataset of the shared layer whose rows carry ``pair_id`` and ``role``.

    Patching needs two images that differ only in what is counted; a real set rarely has them.
    Without those columns this raises a DatasetError saying so and what to do instead.
    """
    missing = [c for c in ("pair_id", "role") if not dataset.examples or c not in dataset.examples[0].extra]
    if missing:
        raise DatasetError(
            f"{dataset.source} has no {' / '.join(missing)} column, so it holds no pairs: patching compares two "
            "images that differ only in the count (a clean and a corrupt one, same size and question). Add "
            "pair_id and role ('clean' / 'corrupt') columns to rows that form such pairs, or generate controlled "
            "pairs with `vlens data pairs --out DIR` (or `vlens patch --make-pairs N`)"
        )
    examples = examples_from_records(record_dicts(dataset))
    return examples[:limit] if limit is not None else examples


def load_pair_examples(data_dir: str | Path, limit: int | None = None) -> list[PairExample]:
    """Pairs from an imagefolder written by `vlens data` (columns pair_id, role, question, answer)."""
    limit = check_count(limit, "limit", allow_none=True)  # a negative limit would slice from the end
    examples = examples_from_records(read_imagefolder(data_dir))
    return examples[:limit] if limit is not None else examples


# ---------------------------------------------------------------------- tokenisation + validation
def answer_tokens(model: HookedVLM, clean_answer: str, corrupt_answer: str, pair_id: str = "?") -> tuple[list[int], int, int]:
    """(shared prefix ids, clean token, corrupt token): see `vlens.core.answers.contrast`."""
    c = contrast(model, clean_answer, corrupt_answer, example=pair_id)
    return c.prefix, c.clean_id, c.corrupt_id


def build_pair_batch(model: HookedVLM, examples: Sequence[Any], chat: bool = True) -> PairBatch:
    """Tokenise pairs (clean and corrupt in one padded batch) and validate their alignment.

    examples: `PairExample`s or `vlens.data.Pair`s.

    Returns:
        a `PairBatch`: `clean` and `corrupt` inputs of the same shape ([n_pairs, pos] input ids),
        the answer tokens read at the final position (clean_tokens / corrupt_tokens: [n_pairs]).
    Raises:
        UserInputError: naming the first pair whose clean and corrupt inputs differ in length or in
            where the image / text / final tokens are (e.g. images of different sizes).
    """
    examples = [e if isinstance(e, PairExample) else examples_from_pairs([e])[0] for e in examples]
    if not examples:
        raise UserInputError("build_pair_batch got no pairs: pass PairExamples (e.g. make_count_pairs(8)) or vlens.data Pairs")
    rates = {e.video_fps for e in examples}
    if len(rates) > 1:
        raise UserInputError(f"build_pair_batch got image and video pairs or videos of different frame rates ({rates}): "
                             "build one batch per kind")
    fps = rates.pop()
    n = len(examples)
    contrasts = [contrast(model, e.clean_answer, e.corrupt_answer, example=e.pair_id, chat=chat) for e in examples]
    tokens = [(c.prefix, c.clean_id, c.corrupt_id) for c in contrasts]
    # Alignment is checked on each pair alone first, so the error names the pair.
    for e, (prefix, _, _) in zip(examples, tokens, strict=True):
        single = _prepare(model, [e.clean_image, e.corrupt_image], [e.clean_prompt, e.corrupt_prompt],
                          [prefix, prefix], chat, fps)
        _check_aligned(single, 0, 1, e.pair_id)
    images = [e.clean_image for e in examples] + [e.corrupt_image for e in examples]
    prompts = [e.clean_prompt for e in examples] + [e.corrupt_prompt for e in examples]
    prefixes = [t[0] for t in tokens] * 2
    both = _prepare(model, images, prompts, prefixes, chat, fps)
    clean, corrupt = _select_rows(both, list(range(n))), _select_rows(both, list(range(n, 2 * n)))
    for i, e in enumerate(examples):
        _check_aligned_pair(clean, corrupt, i, e.pair_id)
    return PairBatch(
        pair_ids=[e.pair_id for e in examples],
        clean=clean,
        corrupt=corrupt,
        clean_tokens=torch.tensor([t[1] for t in tokens], dtype=torch.long),
        corrupt_tokens=torch.tensor([t[2] for t in tokens], dtype=torch.long),
        clean_answers=[e.clean_answer for e in examples],
        corrupt_answers=[e.corrupt_answer for e in examples],
        answer_prefix_len=[len(t[0]) for t in tokens],
        clean_answer_ids=[c.clean_ids for c in contrasts],
        corrupt_answer_ids=[c.corrupt_ids for c in contrasts],
    )


def _prepare(model: HookedVLM, images: list, prompts: list[str], prefixes: list[list[int]], chat: bool,
             fps: float | None = None) -> VLMInputs:
    if fps is not None:  # video pairs: one video per prompt
        inputs = model.prepare(videos=images, prompts=prompts, chat=chat, fps=fps)
    else:
        inputs = model.prepare(images=images, prompts=prompts, chat=chat)
    if not any(prefixes):
        return inputs
    return append_tokens(model, inputs, prefixes)


def _check_aligned(inputs: VLMInputs, a: int, b: int, pair_id: str) -> None:
    _check_aligned_pair(inputs, inputs, a, pair_id, b)


def _check_aligned_pair(clean: VLMInputs, corrupt: VLMInputs, row: int, pair_id: str, corrupt_row: int | None = None) -> None:
    other = row if corrupt_row is None else corrupt_row
    lengths = (int(clean.attention_mask[row].sum()), int(corrupt.attention_mask[other].sum()))
    if lengths[0] != lengths[1]:
        raise UserInputError(
            f"pair {pair_id!r} is misaligned: the clean prompt is {lengths[0]} tokens, the corrupt one {lengths[1]}. "
            "Patching needs identical token layouts: use images of the same size and the same question in both roles."
        )
    for region in ("image", "text", "final"):
        a = clean.token_regions.region(region, row).cpu()
        b = corrupt.token_regions.region(region, other).cpu()
        if a.shape != b.shape or not torch.equal(a, b):
            raise UserInputError(
                f"pair {pair_id!r} is misaligned: its {region} tokens sit at different positions in the clean and "
                f"the corrupt input ({a.numel()} vs {b.numel()} positions). Use images of the same size and the same "
                "question in both roles."
            )
    grid_a, grid_b = clean.token_regions.image_grid[row], corrupt.token_regions.image_grid[other]
    if grid_a != grid_b:
        raise UserInputError(f"pair {pair_id!r} is misaligned: image grids {grid_a} (clean) vs {grid_b} (corrupt)")
    tiles_a, tiles_b = _tile_layout(clean, row), _tile_layout(corrupt, other)
    if tiles_a != tiles_b:
        raise UserInputError(f"pair {pair_id!r} is misaligned: the images are tiled differently ({tiles_a} (clean) vs "
                         f"{tiles_b} (corrupt)); use images of the same size in both roles")


def _tile_layout(inputs: VLMInputs, row: int) -> list:
    """Per image of a row, (kind, grid, layout) of each of its token records (anyres tiles)."""
    tiles = inputs.token_regions.tiles
    return [[(t.kind, t.grid, t.layout) for t in image] for image in tiles[row]] if tiles else []


def _select_rows(inputs: VLMInputs, rows: list[int]) -> VLMInputs:
    return inputs.select_rows(rows)
