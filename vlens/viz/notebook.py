"""plotly figures in notebooks that also show after nbconvert and on a code host.

`show_figures_in_notebook()` sets plotly's default renderer to "plotly_mimetype+png": each figure
is stored twice in the cell output, as plotly JSON (interactive in JupyterLab / VS Code) and as a
static PNG made by kaleido (the only form GitHub or `jupyter nbconvert --to html` can draw).
kaleido drives a Chrome / Chromium already on the machine (the system one is found on PATH or
via BROWSER_PATH); one browser is kept for the kernel, so each figure costs ~0.1-1 s.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import warnings

from vlens.viz.optional import require_plotly

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def static_images_available() -> bool:
    """kaleido is installed and a Chrome / Chromium it can drive is on this machine."""
    if importlib.util.find_spec("kaleido") is None:
        return False
    path = os.environ.get("BROWSER_PATH")
    return bool(path and os.path.exists(path)) or any(shutil.which(name) for name in BROWSERS)


def show_figures_in_notebook(static: bool | None = None, width: int = 900, height: int = 520) -> str:
    """Make every plotly figure a notebook displays interactive + a static PNG; returns the renderer.

    Args:
        static: add the PNG copy. Default: yes when `static_images_available()`, unless the
            environment sets VLENS_STATIC_FIGURES=0 (tests that only check the notebooks run).
        width, height: the PNG's size in CSS pixels.

    Without kaleido or a browser the figures stay interactive only (no error, no warning).
    """
    require_plotly()
    import plotly.io as pio

    if static is None:
        static = os.environ.get("VLENS_STATIC_FIGURES", "1") != "0" and static_images_available()
    if static:
        import kaleido

        kaleido.start_sync_server(silence_warnings=True)  # one browser for the whole kernel
        # plotly passes its default kaleido options on every image; with a running server they are
        # not needed, and plotly says so in a UserWarning per figure.
        warnings.filterwarnings("ignore", message="The kopts argument is ignored if using a server")
        png = pio.renderers["png"]
        png.width, png.height = width, height
        pio.renderers.default = "plotly_mimetype+png"
    else:
        pio.renderers.default = "plotly_mimetype"
    return pio.renderers.default


__all__ = ["show_figures_in_notebook", "static_images_available"]
