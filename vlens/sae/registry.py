"""The open registry of SAE architectures (SAELens's names): ``architecture -> (SAE class, config class)``."""

from __future__ import annotations

from typing import Any

from vlens.sae.architectures import JumpReLUSAE, StandardSAE, TopKSAE
from vlens.sae.base import SAE
from vlens.sae.config import JumpReLUSAEConfig, SAEConfig, StandardSAEConfig, TopKSAEConfig
from vlens.utils.errors import UserInputError

SAE_ARCHITECTURES: dict[str, tuple[type[SAE], type[SAEConfig]]] = {}


def register_sae_architecture(sae_class: type[SAE], config_class: type[SAEConfig], replace: bool = False) -> None:
    """Make an architecture known by its config's ``architecture`` name (refuses a second one unless `replace`)."""
    name = config_class.architecture
    if not name:
        raise UserInputError(f"{config_class.__name__} names no architecture (set the class attribute).")
    if name in SAE_ARCHITECTURES and not replace:
        raise UserInputError(f"SAE architecture {name!r} is already registered (pass replace=True to replace it).")
    SAE_ARCHITECTURES[name] = (sae_class, config_class)


register_sae_architecture(StandardSAE, StandardSAEConfig)
register_sae_architecture(TopKSAE, TopKSAEConfig)
register_sae_architecture(JumpReLUSAE, JumpReLUSAEConfig)


def architecture_classes(name: str) -> tuple[type[SAE], type[SAEConfig]]:
    if name not in SAE_ARCHITECTURES:
        raise UserInputError(f"Unknown SAE architecture {name!r}: vlens knows {', '.join(sorted(SAE_ARCHITECTURES))}.")
    return SAE_ARCHITECTURES[name]


def make_config(architecture: str, **fields: Any) -> SAEConfig:
    """The config of an architecture from its fields (unknown fields are refused)."""
    config_class = architecture_classes(architecture)[1]
    unknown = set(fields) - config_class.field_names()
    if unknown:
        raise UserInputError(f"{architecture} SAE config has no field(s) {sorted(unknown)}; "
                             f"its fields: {sorted(config_class.field_names())}.")
    return config_class(**fields)


def build_sae(cfg: SAEConfig) -> SAE:
    """An SAE of the config's architecture (zero weights: `initialize` or load a state)."""
    return architecture_classes(cfg.architecture)[0](cfg)
