"""Fault family "lost work": a long evaluation writes its predictions batch by batch, so a failure
late in the run keeps the answers already made (and says where they are)."""

from __future__ import annotations

import json

import pytest

from tests.helpers.eval_data import write_imagefolder
from vlens import SweepOptions
from vlens.evaluation import evaluate, read_counting_imagefolder


class FailsOnThirdBatch:
    name = "fake"

    def __init__(self):
        self.calls = 0

    def generate(self, images, prompts, max_new_tokens):
        self.calls += 1
        if self.calls == 3:
            raise RuntimeError("CUDA out of memory")
        return ["2"] * len(prompts)


def test_evaluation_streams_predictions_before_a_late_failure(tmp_path):
    data = read_counting_imagefolder(write_imagefolder(tmp_path / "data", [1, 2, 3, 4, 5, 6]))
    partial = tmp_path / "out" / "predictions.partial.jsonl"
    with pytest.raises(RuntimeError, match="out of memory"):
        evaluate(FailsOnThirdBatch(), data, stream_to=partial, options=SweepOptions(batch_size=2, progress=False))
    kept = [json.loads(line) for line in partial.read_text().splitlines()]
    assert [row["output"] for row in kept] == ["2"] * 4 and [row["target"] for row in kept] == [1, 2, 3, 4]
