"""The model and what it is made of: `HookedVLM` (`model`), its config, inputs and token regions,
hook points, cache, generation, processing and prompt formats, answers, devices, loading, the
TransformerLens surface, the family adapters (`architectures/`, an open registry) and the hooked
modules (`components/`). Methods build on this package's public names.

Nothing is imported here: `vlens.core.model` and friends are imported by name, so that light
modules of this package (e.g. `vlens.core.hooks`) do not load the whole model.
"""
