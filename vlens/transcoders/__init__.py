"""Transcoders: sparse replacements of a VLM's MLPs (docs/transcoders.md).

- ``config``, ``model``: `TranscoderConfig`, `Transcoders` (per-layer "plt", with a skip connection
  "skip", cross-layer "clt"; ReLU / TopK / JumpReLU).
- ``activations``: `PairSource` streams (MLP input, MLP output) pairs at image and text positions.
- ``settings``, ``trainer``: `train_transcoders(source, TranscoderTraining(...), TrainRun(...))`, resumable.
- ``formats``: vlens's folder, SAELens's transcoder folders (both ways), circuit-tracer's YAML set (read).
- ``splice``: `splice_transcoders` (``blocks.{l}.hook_tc_acts`` / ``hook_tc_error``).
- ``evaluation``: `evaluate_transcoders` (explained variance, L0, dead features, loss / KL recovered).
"""

from vlens.transcoders.activations import PairSource, join_pairs, mlp_pairs, split_pairs
from vlens.transcoders.config import TranscoderConfig
from vlens.transcoders.evaluation import TranscoderEvaluation, evaluate_transcoders
from vlens.transcoders.formats import (
    load_circuit_tracer,
    load_saelens_transcoders,
    load_transcoders,
    save_saelens_transcoders,
    save_transcoders,
)
from vlens.transcoders.model import Transcoders
from vlens.transcoders.settings import TranscoderTraining
from vlens.transcoders.splice import splice_transcoders
from vlens.transcoders.trainer import TrainedTranscoders, TranscoderTrainer, train_transcoders

__all__ = ["PairSource", "TrainedTranscoders", "TranscoderConfig", "TranscoderEvaluation", "TranscoderTrainer",
           "TranscoderTraining", "Transcoders", "evaluate_transcoders", "join_pairs", "load_circuit_tracer",
           "load_saelens_transcoders", "load_transcoders", "mlp_pairs", "save_saelens_transcoders",
           "save_transcoders", "splice_transcoders", "split_pairs", "train_transcoders"]
