"""Perception LM (`PerceptionLMForConditionalGeneration`): refused, with the reason.

Its vision tower is a timm model (HF's `TimmWrapperModel` over timm's Perception Encoder, `vit_pe_*`):
the HF model cannot be built without timm, and timm requires torchvision (a declared dependency of every
timm release that has the Perception Encoder; timm 1.0.31 imports `torchvision.ops` when `timm.layers` is
imported), which vlens never installs. Loading one stops here, before any weight is read.
"""

from __future__ import annotations

from vlens.core.architectures.base import HFModule
from vlens.core.architectures.llava import LlavaAdapter
from vlens.core.architectures.registry import register_adapter
from vlens.core.config import VLMConfig
from vlens.utils.errors import UserInputError

REFUSAL = ("Perception LM is not supported: its vision tower is a timm model (HF's TimmWrapperModel over the "
           "Perception Encoder), and timm requires torchvision, which vlens does not install (it would replace "
           "the torch build). Use a family from vlens's supported-models table.")


@register_adapter
class PerceptionLMAdapter(LlavaAdapter):
    """Registered so that loading a Perception LM checkpoint says why it is refused (`REFUSAL`)."""

    hf_class_names = ("PerceptionLMForConditionalGeneration",)
    family = "perception_lm"
    refusal = REFUSAL

    def hf_model_class(self, class_name: str) -> type:
        raise UserInputError(REFUSAL)

    def build_config(self, hf_model: HFModule) -> VLMConfig:
        raise UserInputError(REFUSAL)
