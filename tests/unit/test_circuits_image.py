"""Attribution over the image: each estimate is what it claims, and the exact token patching is exact.

- attribution patching of a token = the sum of the EAP scores of the edges out of its input node;
  integrated gradients = the sum of its EAP-IG scores (same steps);
- exact token patching = `path_patch` of every edge out of the token's node at once = a plain
  hook that copies the token's corrupt input embedding (and, for Qwen3-VL, its DeepStack
  features) into the clean run = `vlens.patching`'s layer-0 position sweep (Qwen2.5-VL).
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import circuits_reference as ref
from tests.helpers.models import tiny_vlm
from vlens.circuits import ImageAttribution, edge_attribution, image_attribution, path_patch
from vlens.patching import build_pair_batch, make_count_pairs, patch_layer_position

torch.set_num_threads(1)
CONFIGS = {"qwen2_5_vl": dict(n_layers=2, d_model=40, n_heads=4, n_kv_heads=2, d_mlp=48, initializer_range=0.1),
           "qwen3_vl": dict(n_layers=3, d_model=32, n_heads=4, n_kv_heads=2, d_head=8, d_mlp=48, initializer_range=0.1)}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def setup(request):
    model = tiny_vlm(request.param, seed=2, **CONFIGS[request.param])
    pairs = make_count_pairs(3, seed=1, size=64 if request.param == "qwen3_vl" else 56)
    return request.param, model, pairs, build_pair_batch(model, pairs)


def plain_token_patch(model, batch, token: int) -> torch.Tensor:
    """[n_pairs] metric change with image token `token` of every pair taken from the corrupt run (plain hooks)."""
    clean, corrupt, clean_metric, _ = ref.caches(model, batch)
    images = batch.clean.token_regions.images
    positions = [images[row][0][token] for row in range(batch.n_pairs)]
    image_mask = batch.clean.input_ids == model.cfg.image_token_id
    order = image_mask.flatten().nonzero().flatten().tolist()  # DeepStack features follow the image positions
    flat = [row * batch.seq_len + int(p) for row, p in enumerate(positions)]
    feature_rows = [order.index(f) for f in flat]

    def embeds(act, hook):
        act = act.clone()
        for row, p in enumerate(positions):
            act[row, p] = corrupt["hook_inputs_embeds"][row, p]
        return act

    hooks = [("hook_inputs_embeds", embeds)]
    for layer in range(model.cfg.n_layers):
        name = f"blocks.{layer}.hook_deepstack"
        if name in clean.cache_dict:
            def features(act, hook, name=name):
                act = act.clone()
                act[feature_rows] = corrupt[name][feature_rows]
                return act
            hooks.append((name, features))
    with torch.no_grad():
        logits = model.run_with_hooks(batch.clean, fwd_hooks=hooks)
    return ref.metric(model, batch, logits) - clean_metric


@pytest.mark.filterwarnings("ignore::vlens.patching.metrics.NoiseFloorWarning")  # 3 pairs of a random model
def test_estimates_are_sums_of_edge_scores_and_exact_is_exact(setup):
    family, model, pairs, batch = setup
    attribution = image_attribution(model, pairs, ig_steps=6)
    eap = edge_attribution(model, batch, method="eap", image_nodes="token")
    eap_ig = edge_attribution(model, batch, method="eap-ig", ig_steps=6, image_nodes="token")
    graph = eap.graph
    nodes = [node.name for node in graph.inputs[1:]]  # img0[r0,c0], ... row-major: the token order
    for method, scores in (("attribution_patching", eap), ("integrated_gradients", eap_ig)):
        summed = torch.stack([scores.per_pair[:, graph.edges_from(n)].sum(1) for n in nodes], dim=1)
        assert torch.allclose(attribution.scores[method][0], summed, rtol=1e-4, atol=1e-7), method
    exact = attribution.scores["exact"][0]  # [n_pairs, n_tokens]
    assert float(exact.abs().max()) > 1e-4
    joint = path_patch(model, batch, [graph.edges_from(n).tolist() for n in nodes[:2]], image_nodes="token")
    for token in (0, 1):
        assert torch.allclose(joint.per_pair_effects[token], exact[:, token], rtol=1e-4, atol=1e-6)
    for token in (0, len(nodes) - 1):
        assert torch.allclose(plain_token_patch(model, batch, token), exact[:, token], rtol=1e-4, atol=1e-6)
    if family == "qwen2_5_vl":  # no DeepStack: the token's input is its embedding, patching's layer-0 resid_pre
        sweep = patch_layer_position(model, batch, component="resid_pre", layers=[0])
        columns = batch.clean.token_regions.images[0][0].tolist()
        patched = sweep.per_pair["logit_diff"][0, columns].T  # [n_pairs, n_tokens]
        assert torch.allclose(patched - attribution.clean_metric[:, None], exact, rtol=1e-4, atol=1e-6)


def test_agreement_figure_and_round_trip(setup, tmp_path):
    _, model, pairs, _ = setup
    attribution = image_attribution(model, pairs, exact=True)
    agreement = attribution.agreement()
    assert set(agreement) == {"gradient_x_input", "attribution_patching"}
    assert -1 <= agreement["attribution_patching"]["spearman_per_pair_mean"] <= 1
    figure = attribution.plot(pair=1)
    heatmaps = [t for t in figure.data if t.type == "heatmap"]
    assert len(heatmaps) == 3 and figure.layout.coloraxis.cmin == -figure.layout.coloraxis.cmax
    again = ImageAttribution.load(attribution.save(tmp_path))
    for method, maps in attribution.scores.items():
        assert torch.allclose(again.scores[method][0], maps[0])
    assert again.thumbnails is not None and again.thumbnails[0][0].size == attribution.thumbnails[0][0].size
