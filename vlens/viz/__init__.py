"""Visualisation for vlens: attention over the image, circuitsvis views, plotly figures,
representation geometry and a self-contained HTML report.

Nothing here imports plotly or circuitsvis until a function needs it
(install them with `pip install "vlens[viz]"`).
"""

from vlens.viz.attention_page import attention_patterns, image_token_labels
from vlens.viz.circuits import attention_heads_view, attention_patterns_view, circuitsvis_html, token_labels
from vlens.viz.colormaps import apply_colormap, colormap_names
from vlens.viz.figures import (
    confusion_matrix_figure,
    count_accuracy_figure,
    image_grid_heatmap,
    jaccard_matrix_figure,
    layer_head_heatmap,
    layer_region_figure,
    logit_lens_figure,
)
from vlens.viz.geometry import PCAResult, pca, project, representation_geometry_figure, tsne
from vlens.viz.html import figure_page, write_figure_html
from vlens.viz.image_attention import (
    attention_grid_image,
    attention_overlay_figure,
    attention_tiles_figure,
    attention_to_image,
    image_to_data_uri,
    overlay_attention,
)
from vlens.viz.notebook import show_figures_in_notebook
from vlens.viz.report import Report

__all__ = [
    "PCAResult",
    "Report",
    "apply_colormap",
    "attention_grid_image",
    "attention_heads_view",
    "attention_overlay_figure",
    "attention_patterns",
    "attention_patterns_view",
    "attention_tiles_figure",
    "attention_to_image",
    "circuitsvis_html",
    "colormap_names",
    "confusion_matrix_figure",
    "count_accuracy_figure",
    "figure_page",
    "image_grid_heatmap",
    "image_to_data_uri",
    "image_token_labels",
    "jaccard_matrix_figure",
    "layer_head_heatmap",
    "layer_region_figure",
    "logit_lens_figure",
    "overlay_attention",
    "pca",
    "project",
    "representation_geometry_figure",
    "show_figures_in_notebook",
    "token_labels",
    "tsne",
    "write_figure_html",
]
