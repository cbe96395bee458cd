"""Sparse autoencoders on VLM activations (docs/sae.md).

- ``config``, ``base``, ``architectures``, ``registry``: standard (ReLU + L1), TopK and JumpReLU
  SAEs as config / module pairs, in an open registry (SAELens's architecture names).
- ``saelens_format``: `save_sae` / `load_sae`, SAELens's ``cfg.json`` + ``sae_weights.safetensors``.
- ``activations``, ``buffer``: `ActivationSource` (a hook's activations at image / text / final / all
  positions or chosen image-grid cells, over any dataset vlens reads, optional disk cache),
  `TensorSource`, the `ShuffleBuffer`.
- ``settings``, ``schedule``, ``trainer``, ``metrics``: `train_sae(stream, SAETraining(...), TrainRun(...))`.
- ``attribution``: `ablate_features`, `feature_attribution` (splicing itself: `model.run_with_saes`,
  `model.saes(...)`, `vlens.core.splicing`).
"""

from vlens.sae.architectures import JumpReLUSAE, StandardSAE, TopKSAE
from vlens.sae.base import SAE
from vlens.sae.config import JumpReLUSAEConfig, SAEConfig, StandardSAEConfig, TopKSAEConfig
from vlens.sae.registry import SAE_ARCHITECTURES, build_sae, make_config, register_sae_architecture
from vlens.sae.saelens_format import is_sae_folder, load_sae, save_sae

__all__ = ["SAE", "SAE_ARCHITECTURES", "JumpReLUSAE", "JumpReLUSAEConfig", "SAEConfig", "StandardSAE",
           "StandardSAEConfig", "TopKSAE", "TopKSAEConfig", "build_sae", "is_sae_folder", "load_sae", "make_config",
           "register_sae_architecture", "save_sae"]
