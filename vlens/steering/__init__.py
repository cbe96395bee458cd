"""Steering generation with a direction (docs/generation.md, "Steering").

- ``directions``: where a direction comes from: `mean_difference` (of cached activations at chosen
  regions of two prompt sets), `sae_direction` (an SAE feature's decoder row), `transcoder_direction` (a per-layer
  transcoder feature's decoder row),
  `probe_direction` (a linear probe's weight).
- ``steer``: `SteeringSettings`, `steering_hooks` (one hook per layer that adds ``strength * direction``
  at the chosen prompt regions and / or every generated token from a step on) and `steer` (a strength
  sweep of greedy generations).
- ``results``: `SteeringResult`, the generated texts side by side (table, HTML), loads back.
"""

from vlens.steering.directions import mean_difference, probe_direction, sae_direction, transcoder_direction
from vlens.steering.results import SteeringResult
from vlens.steering.steer import SteeringSettings, steer, steering_hooks

__all__ = ["SteeringResult", "SteeringSettings", "mean_difference", "probe_direction", "sae_direction", "steer",
           "steering_hooks", "transcoder_direction"]
