"""`vlens verify`: is vlens exact on this checkpoint? (docs/verified-models.md)

- ``cases``: the built-in images and prompts (one image, two images, text only, a padded batch, video
  where the family takes it).
- ``checks``: logits, greedy generation, hook coverage, causality (hand-computed edits), memory and time,
  each against the plain HF model that shares the weights.
- ``run``: `verify_model` (a loaded model) and `verify_spec` (a hub id or folder; a broken folder fails
  the "load" check instead of raising), with `VerifySettings` and the tolerances per dtype.
- ``results``: `VerificationResult` (loads back with `vlens.load_result`) and its verified-models row.
"""

from vlens.verify.results import CheckRecord, VerificationResult
from vlens.verify.run import TOLERANCES, Tolerance, VerifySettings, verify_model, verify_spec

__all__ = ["TOLERANCES", "CheckRecord", "Tolerance", "VerificationResult", "VerifySettings", "verify_model",
           "verify_spec"]
