"""vlens: mechanistic interpretability for vision-language models.

Quick start::

    import vlens
    model = vlens.load()                       # the embedded tiny Qwen2.5-VL
    inputs = model.prepare(images=[img], prompts=["How many dots are there?"])
    logits, cache = model.run_with_cache(inputs)
"""

from vlens.config import VLMConfig
from vlens.hooks import act_name
from vlens.inputs import TokenRegions, VLMInputs
from vlens.model import HookedVisionLanguageModel, HookedVLM

__version__ = "0.1.0"

__all__ = [
    "HookedVLM",
    "HookedVisionLanguageModel",
    "TokenRegions",
    "VLMConfig",
    "VLMInputs",
    "act_name",
    "load",
]


def load(*args, **kwargs) -> HookedVLM:
    """The embedded default model (a tiny trained Qwen2.5-VL) as a `HookedVLM`; see `vlens.zoo`."""
    from vlens.zoo import load as zoo_load

    return zoo_load(*args, **kwargs)
