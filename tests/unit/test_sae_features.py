"""Feature views on known answers: top images and cells are the SAE's activations, promoted tokens
follow W_dec @ W_U, and the dashboard draws every hit offline."""

from __future__ import annotations

import torch

from tests.helpers.models import tiny_vlm
from vlens.sae import build_sae, make_config
from vlens.sae.activations import ActivationOptions, ActivationSource
from vlens.sae.features import FeatureViewOptions, example_image, feature_views
from vlens.testing import random_image
from vlens.viz.sae_dashboard import dashboard_html

HOOK = "blocks.1.hook_resid_post"


def test_views_match_the_activations_and_the_unembedding():
    model = tiny_vlm("qwen2_5_vl")
    examples = [(random_image(seed=i), "how many a") for i in range(5)]
    sae = build_sae(make_config("standard", d_in=model.cfg.d_model, d_sae=6, hook_name=HOOK))
    sae.initialize(torch.Generator().manual_seed(0), decoder_norm=1.0)
    token = 7
    with torch.no_grad():
        sae.W_dec[2] = model.W_U[:, token] / model.W_U[:, token].norm()
        sae.b_enc.fill_(0.5)
    views = feature_views(model, sae, examples, FeatureViewOptions(features=(0, 2), top_k=3))
    assert [v.feature for v in views.views] == [0, 2]
    promoted = views.views[1].promoted
    assert promoted[0][0] == model.to_string([token])
    # image hits: the largest image-token activation per example, in order, with the per-cell map
    image_acts = ActivationSource(model, examples, ActivationOptions(HOOK, positions="image"))
    chunk = image_acts.chunk(0)
    assert chunk.sites is not None
    acts = sae.encode(chunk.acts).detach()
    for view in views.views:
        per_example = [float(acts[chunk.sites.example == e, view.feature].max()) for e in range(5)]
        expected = sorted(range(5), key=lambda e: -per_example[e])[:3]
        assert [hit.example for hit in view.top_images] == [e for e in expected if per_example[e] > 0]
        for hit in view.top_images:
            cells = acts[chunk.sites.example == hit.example, view.feature]
            assert torch.allclose(torch.tensor(hit.cells), cells, atol=1e-5)
            assert abs(hit.max_activation - max(hit.cells)) < 1e-5
        assert all(hit.token == hit.context[hit.focus] for hit in view.top_text)
    payload = views.to_dict()
    images = {h["example"]: example_image(examples, h["example"]) for f in payload["features"] for h in f["top_images"]}
    page = dashboard_html(payload["features"], {k: v for k, v in images.items() if v is not None}, "t")
    n_hits = sum(len(f["top_images"]) for f in payload["features"])
    assert page.count("data:image/png;base64,") == n_hits > 0 and "<script" not in page
