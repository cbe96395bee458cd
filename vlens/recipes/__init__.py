"""Recipes that build vlens's shipped artefacts; not part of the library proper.

Nothing in `vlens` imports these packages: the library loads what they produced (e.g.
`vlens.zoo.load()` reads the embedded model's folder). The CLI dispatcher registers their
commands (`vlens zoo train`, `vlens zoo evaluate`).
"""
