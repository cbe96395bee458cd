"""Known-answer objects for the ablation tests: a model whose tokenizer knows every task-suite
answer, and a report with hand-set head sets."""

from __future__ import annotations

import torch

from tests.helpers.models import tiny_vlm
from vlens import HookedVLM
from vlens.ablation import AblationReport, HeadAblation
from vlens.data.templates import all_template_words
from vlens.testing import TEST_WORDS, word_level_tokenizer

SIZE = 56  # 2 x 2 merged grid: 4 image tokens


def task_vocab_model() -> HookedVLM:
    """A random tiny Qwen2.5-VL whose tokenizer knows every task-suite answer."""
    tokenizer = word_level_tokenizer(words=list(TEST_WORDS) + sorted(all_template_words()))
    return tiny_vlm("qwen2_5_vl", tokenizer=tokenizer, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_mlp=48)


def report_with_known_sets() -> AblationReport:
    """Two tasks with known top-2 head sets: a {(0, 0), (0, 1)}, b {(1, 0), (0, 1)} (Jaccard 1/3)."""
    def result(task, drops):
        drops = torch.tensor(drops, dtype=torch.float64)
        return HeadAblation(task, "mean", "region", 4, 0.0, 1.0, -drops, 1.0 - drops.clamp(0, 1))

    return AblationReport({"a": result("a", [[3.0, 2.0], [1.0, 0.0]]),
                           "b": result("b", [[0.0, 2.0], [3.0, 1.0]])}, top_k=2)
