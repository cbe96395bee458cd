"""PCA and t-SNE of representation vectors, and the per-layer geometry figure."""

import pytest
import torch

from vlens.viz.geometry import pca, representation_geometry_figure, tsne


def planted_clusters(n_per_class: int = 30, d: int = 48, seed: int = 0):
    """Counts 1..4 placed along one hidden direction (plus a weaker second one) with small noise."""
    generator = torch.Generator().manual_seed(seed)
    basis, _ = torch.linalg.qr(torch.randn(d, 2, generator=generator))
    counts = torch.arange(1, 5).repeat_interleave(n_per_class)
    along = (counts.float() - 2.5) * 4.0
    across = torch.randn(len(counts), generator=generator)
    noise = 0.05 * torch.randn(len(counts), d, generator=generator)
    return along[:, None] * basis[:, 0] + across[:, None] * basis[:, 1] + noise, counts, basis


def test_pca_recovers_planted_direction_and_separates_counts():
    vectors, counts, basis = planted_clusters()
    result = pca(vectors, n_components=2)
    assert result.projected.shape == (len(counts), 2)
    assert abs(float(result.components[0] @ basis[:, 0])) > 0.99
    assert float(result.explained_variance_ratio.sum()) > 0.95
    first = result.projected[:, 0]
    means = torch.stack([first[counts == c].mean() for c in range(1, 5)])
    spread = max(float(first[counts == c].std()) for c in range(1, 5))
    gaps = (means[1:] - means[:-1]).abs()
    assert float(gaps.min()) > 10 * spread
    # deterministic signs: running again gives the same numbers
    torch.testing.assert_close(pca(vectors, 2).projected, result.projected)


def test_pca_rejects_too_many_components():
    with pytest.raises(ValueError, match="n_components"):
        pca(torch.randn(3, 5), n_components=4)


def test_tsne_is_deterministic_and_keeps_clusters_apart():
    vectors, counts, _ = planted_clusters(n_per_class=20)
    first = tsne(vectors, seed=0, init="random", n_iter=300)
    again = tsne(vectors, seed=0, init="random", n_iter=300)
    other = tsne(vectors, seed=1, init="random", n_iter=300)
    torch.testing.assert_close(first, again)
    assert not torch.allclose(first, other)
    embedding = tsne(vectors)
    centres = torch.stack([embedding[counts == c].mean(dim=0) for c in range(1, 5)])
    within = max(float((embedding[counts == c] - centres[c - 1]).norm(dim=1).mean()) for c in range(1, 5))
    between = torch.pdist(centres).min()
    assert float(between) > 2 * within
    with pytest.raises(ValueError, match="perplexity"):
        tsne(vectors, perplexity=500)


def test_geometry_figure_one_panel_per_layer_coloured_by_count():
    vectors, counts, _ = planted_clusters(n_per_class=10)
    stacked = torch.stack([vectors, 2 * vectors, vectors.flip(1)])
    figure = representation_geometry_figure(stacked, counts, layers=[0, 2], method="pca")
    assert len(figure.data) == 2 * 4  # 2 panels x 4 counts
    assert sum(len(trace.x) for trace in figure.data) == 2 * len(counts)
    assert [trace.name for trace in figure.data if trace.showlegend] == [f"count {c}" for c in range(1, 5)]
    assert figure.layout.annotations[0].text.startswith("layer 0<br>PC1")  # two lines: neighbours never collide
    by_dict = representation_geometry_figure({5: vectors}, counts.tolist(), method="tsne")
    assert len(by_dict.data) == 4
    with pytest.raises(ValueError, match="layers"):
        representation_geometry_figure(stacked, counts, layers=[7])
    with pytest.raises(ValueError, match="counts"):
        representation_geometry_figure(stacked, counts[:-1], layers=[0])
