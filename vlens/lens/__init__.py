"""Lenses: decode the residual stream and single heads into vocabulary space.

    from vlens.lens import logit_lens, HeadLens, Translators, train_translators, compute_head_scores
    result = logit_lens(model, inputs, answer_tokens)      # LogitLensResult: [n_layers, batch]
    taxonomy = classify_heads(compute_head_scores(model, samples, HeadLens(model, translators)))

The package exports its functions and classes like the other method packages (`import vlens`
itself stays light: it loads no method package). The submodules:

- ``logit_lens``: decode the residual stream layer by layer (``vlens logit-lens``).
- ``decomposition``: per-head contributions ``z_i @ W_O[i]`` (sum + b_O == hook_attn_out).
- ``base``: the `Lens` interface (``forward(resid, layer) -> logits``): `LogitLens`, `TunedLens`, `HeadLens`.
- ``translators``: per-layer affine translators (tuned-lens form), `TunedLens`, training, save/load.
- ``headlens``: per-head logits and top-k tokens through translator + final norm + unembedding.
- ``head_scores``: VGS, CTER, image attention, answer alignment, existence / difficulty response.
- ``taxonomy``: the paper's head classes from explicit thresholds, table and layer x head map.
- ``corpus``, ``readout``, ``vocabularies``: task-suite inputs, the frozen final norm + unembedding,
  word lists mapped through the tokenizer.
"""

from vlens.lens.base import Lens
from vlens.lens.corpus import Sample, collect_residuals, dataset_samples, task_samples
from vlens.lens.decomposition import head_contributions, reconstruct_attn_out
from vlens.lens.head_scores import SCORE_NAMES, HeadScores, compute_head_scores
from vlens.lens.headlens import HeadLens, HeadLensOutput
from vlens.lens.logit_lens import LogitLens, LogitLensResult, logit_lens, logit_lens_records
from vlens.lens.readout import LensReadout, unembedding_hash
from vlens.lens.taxonomy import HEAD_CLASSES, ClassStability, HeadTaxonomy, TaxonomyThresholds, classify_heads
from vlens.lens.translators import (
    LensMismatchError,
    LensTraining,
    TrainingReport,
    Translators,
    TunedLens,
    train_translators,
)
from vlens.lens.vocabularies import DEFAULT_VOCABULARIES, vocabulary_token_ids

__all__ = [
    "DEFAULT_VOCABULARIES",
    "HEAD_CLASSES",
    "SCORE_NAMES",
    "ClassStability",
    "HeadLens",
    "HeadLensOutput",
    "HeadScores",
    "HeadTaxonomy",
    "Lens",
    "LensMismatchError",
    "LensReadout",
    "LensTraining",
    "LogitLens",
    "LogitLensResult",
    "Sample",
    "TaxonomyThresholds",
    "TrainingReport",
    "Translators",
    "TunedLens",
    "classify_heads",
    "collect_residuals",
    "compute_head_scores",
    "dataset_samples",
    "head_contributions",
    "logit_lens",
    "logit_lens_records",
    "reconstruct_attn_out",
    "task_samples",
    "train_translators",
    "unembedding_hash",
    "vocabulary_token_ids",
]
