"""Every plotly figure builder returns a Figure whose data has the expected shape."""

import sys

import numpy as np
import plotly.graph_objects as go  # noqa: E402  (the viz extra; dev installs it)
import pytest
import torch

from vlens.evaluation.metrics import confusion_matrix
from vlens.lens.taxonomy import HEAD_CLASSES
from vlens.viz.figures import (
    confusion_matrix_figure,
    count_accuracy_figure,
    image_grid_heatmap,
    jaccard_matrix_figure,
    layer_head_heatmap,
    layer_region_figure,
    logit_lens_figure,
)


def z_of(figure) -> np.ndarray:
    heatmaps = [trace for trace in figure.data if trace.type == "heatmap"]
    assert len(heatmaps) == 1
    return np.asarray(heatmaps[0].z)


def test_layer_head_heatmap_values():
    values = torch.randn(4, 6, dtype=torch.bfloat16)
    figure = layer_head_heatmap(values, title="patch effect")
    assert isinstance(figure, go.Figure)
    assert z_of(figure).shape == (4, 6)
    assert list(figure.data[0].y) == ["L0", "L1", "L2", "L3"]


def test_layer_head_heatmap_taxonomy_has_class_grid_and_legend():
    taxonomy = {(0, 1): "visual grounding", (3, 5): "counting aggregation", (2, 0): "awareness"}
    figure = layer_head_heatmap(torch.rand(4, 6), classes=taxonomy, class_names=HEAD_CLASSES)
    z = z_of(figure)
    assert z.shape == (4, 6)
    assert z[0, 1] == HEAD_CLASSES.index("visual grounding")
    assert z[3, 5] == HEAD_CLASSES.index("counting aggregation")
    assert z[1, 1] == HEAD_CLASSES.index("other")
    legend = [trace.name for trace in figure.data if trace.type == "scatter"]
    # a legend entry per class some head has, in the taxonomy's order: no empty class is suggested
    assert legend == ["visual grounding", "counting aggregation", "awareness", "other"]
    # class indices as a tensor, no values
    only_classes = layer_head_heatmap(classes=torch.tensor([[0, 1], [4, 2]]), class_names=HEAD_CLASSES)
    assert z_of(only_classes).tolist() == [[0, 1], [4, 2]]
    with pytest.raises(ValueError, match="not in class_names"):
        layer_head_heatmap(torch.rand(2, 2), classes={(0, 0): "made up"}, class_names=HEAD_CLASSES)
    with pytest.raises(ValueError, match="n_layers and n_heads"):
        layer_head_heatmap(classes={(0, 0): "awareness"}, class_names=HEAD_CLASSES)
    with pytest.raises(ValueError, match="class_names"):
        layer_head_heatmap(classes={(0, 0): "awareness"}, n_layers=1, n_heads=1)


def test_layer_region_lines_and_heatmap():
    values = torch.rand(5, 3)
    lines = layer_region_figure(values, ["image", "text", "final"], value_label="overwrite rate")
    assert [trace.name for trace in lines.data] == ["image", "text", "final"]
    assert all(len(trace.y) == 5 for trace in lines.data)
    heatmap = layer_region_figure(values, ["image", "text", "final"], kind="heatmap")
    assert z_of(heatmap).shape == (3, 5)
    with pytest.raises(ValueError, match="region_names"):
        layer_region_figure(values, ["image"])


def test_image_grid_heatmap_reshapes_row_major():
    figure = image_grid_heatmap(torch.arange(6.0), grid=(2, 3))
    assert z_of(figure).tolist() == [[0, 1, 2], [3, 4, 5]]
    assert z_of(image_grid_heatmap(torch.zeros(2, 3))).shape == (2, 3)
    with pytest.raises(ValueError, match="grid"):
        image_grid_heatmap(torch.arange(6.0))


def test_confusion_matrix_counts_and_other_column():
    targets, predictions = [1, 2, 3, 3], [1, 3, 3, None]
    rows, columns, matrix = confusion_matrix(predictions, targets, labels=[1, 2, 3], other_label="other")
    assert (rows, columns) == ([1, 2, 3], [1, 2, 3, "other"])
    assert matrix == [[1, 0, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]
    figure = confusion_matrix_figure(rows, columns, matrix)
    assert z_of(figure).shape == (3, 4) and figure.data[0].x[-1] == "other"
    clean = confusion_matrix_figure(*confusion_matrix([1, 1], [1, 2], labels=[1, 2]), normalize=True)
    assert z_of(clean).tolist() == [[1.0, 0.0], [1.0, 0.0]]  # no "other" column when nothing falls outside


def test_count_accuracy_figure_one_line_per_method():
    figure = count_accuracy_figure([1, 2, 3], {"baseline": [1.0, 0.5, 0.2], "ours": [1.0, 0.9, 0.6]})
    assert [trace.name for trace in figure.data] == ["baseline", "ours"]
    assert list(figure.data[1].y) == [1.0, 0.9, 0.6]
    with pytest.raises(ValueError, match="expected 3"):
        count_accuracy_figure([1, 2, 3], [0.1, 0.2])


def test_logit_lens_figure_probability_and_rank_panels():
    figure = logit_lens_figure(
        {"3": [0.0, 0.1, 0.9], "4": [0.0, 0.2, 0.05]}, {"3": [900, 12, 1], "4": [500, 3, 2]}
    )
    assert len(figure.data) == 4 and all(len(trace.y) == 3 for trace in figure.data)
    assert figure.layout.yaxis2.type == "log"
    rank_only = logit_lens_figure(ranks=torch.tensor([40, 2, 1]))
    assert len(rank_only.data) == 1
    with pytest.raises(ValueError, match="same number of layers"):
        logit_lens_figure([0.1, 0.2], [3, 2, 1])


def test_jaccard_matrix_figure():
    matrix = torch.tensor([[1.0, 0.38, 0.18], [0.38, 1.0, 0.33], [0.18, 0.33, 1.0]])
    figure = jaccard_matrix_figure(matrix, ["counting", "math", "colour"])
    assert z_of(figure).shape == (3, 3)
    assert (figure.data[0].zmin, figure.data[0].zmax) == (0.0, 1.0)
    with pytest.raises(ValueError, match="square"):
        jaccard_matrix_figure(torch.rand(2, 3), ["a", "b"])


def test_missing_viz_extra_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "plotly.graph_objects", None)
    with pytest.raises(ImportError, match=r'pip install "vlens\[viz\]"'):
        jaccard_matrix_figure(torch.eye(2), ["a", "b"])
