"""Tiny colormaps for PIL overlays (no matplotlib): piecewise-linear through published stops."""

from __future__ import annotations

import numpy as np

from vlens.utils.errors import UserInputError

# Nine evenly spaced stops of matplotlib's perceptually uniform maps, and ColorBrewer RdBu
# (reversed: negative blue, zero white, positive red) for signed effects.
_STOPS: dict[str, list[str]] = {
    "inferno": [
        "#000004",
        "#1f0c48",
        "#550f6d",
        "#88226a",
        "#ba3655",
        "#e35933",
        "#f98e09",
        "#f9cb35",
        "#fcffa4",
    ],
    "viridis": [
        "#440154",
        "#472d7b",
        "#3b528b",
        "#2c728e",
        "#21918c",
        "#28ae80",
        "#5ec962",
        "#addc30",
        "#fde725",
    ],
    "rdbu": ["#2166ac", "#67a9cf", "#d1e5f0", "#f7f7f7", "#fddbc7", "#ef8a62", "#b2182b"],
}

# The matching plotly colorscale names, so PNG and interactive views agree.
PLOTLY_NAMES = {"inferno": "Inferno", "viridis": "Viridis", "rdbu": "RdBu_r"}


def _hex_to_rgb(color: str) -> tuple[int, int, int]:
    color = color.lstrip("#")
    return int(color[0:2], 16), int(color[2:4], 16), int(color[4:6], 16)


def colormap_names() -> list[str]:
    """Names accepted by `apply_colormap`."""
    return sorted(_STOPS)


def apply_colormap(values: np.ndarray, name: str = "inferno") -> np.ndarray:
    """Map values in [0, 1] (any shape `S`) to RGB uint8 colours of shape `S + (3,)`.

    Values outside [0, 1] are clipped; NaN is drawn as the lowest colour.
    """
    if name not in _STOPS:
        raise UserInputError(f"unknown colormap {name!r}; choose one of {colormap_names()}")
    stops = np.array([_hex_to_rgb(c) for c in _STOPS[name]], dtype=np.float64)
    positions = np.linspace(0.0, 1.0, len(stops))
    flat = np.nan_to_num(np.clip(np.asarray(values, dtype=np.float64), 0.0, 1.0), nan=0.0).ravel()
    channels = [np.interp(flat, positions, stops[:, c]) for c in range(3)]
    rgb = np.stack(channels, axis=-1).round().astype(np.uint8)
    return rgb.reshape(*np.shape(values), 3)


def sample_colors(name: str, n: int) -> list[str]:
    """`n` evenly spaced colours of a colormap as CSS `rgb(r,g,b)` strings (for ordered classes)."""
    if n < 1:
        raise UserInputError("n must be at least 1: ask for one colour or more")
    points = np.linspace(0.1, 0.9, n) if n > 1 else np.array([0.5])
    return [f"rgb({r},{g},{b})" for r, g, b in apply_colormap(points, name).tolist()]
