"""Per generated token, attribution over the image (docs/generation.md, "Which image tokens each
generated token used").

- ``settings``: `GenerationAttributionSettings` (metric, baseline, region size, exact patching, lens).
- ``attribute``: `attribute_generation`: gradient x activation and attribution patching of each image
  token for every generated token, exact patching of each region, the logit lens through depth.
- ``results``: `GenerationAttribution`, the maps as a strip under the generated text (HTML), loads back.
"""

from vlens.generation_attribution.attribute import attribute_generation
from vlens.generation_attribution.results import GenerationAttribution
from vlens.generation_attribution.settings import GenerationAttributionSettings

__all__ = ["GenerationAttribution", "GenerationAttributionSettings", "attribute_generation"]
