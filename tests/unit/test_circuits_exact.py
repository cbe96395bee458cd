"""Edge scores and exact edge patching against an independent plain-hooks reference, on every family.

`tests.helpers.circuits_reference` computes, for sampled edges (into q / k / v of a head, into an
MLP, into the logits; from image regions, heads and MLPs), the exact effect of corrupting that
edge alone and the EAP integrand with its own hooks. `path_patch` must give the same effects and
`edge_attribution(method="eap")` the same scores; corrupting every edge must give the corrupt
run and no edge the clean run.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import circuits_reference as ref
from tests.helpers.models import tiny_vlm
from vlens.circuits import CircuitGraph, Condition, edge_attribution, path_patch, run_conditions
from vlens.circuits.runs import CircuitMetric
from vlens.data import make_pair
from vlens.patching import build_pair_batch
from vlens.utils.errors import UserInputError

torch.set_num_threads(1)

# sizes unlike the defaults; GQA with 2, 3 and 4 heads per key/value head, and none; weights 5x the default
# initialisation so that edges move the metric well above float rounding
FAMILIES = {
    "qwen2_5_vl": dict(n_layers=3, d_model=48, n_heads=6, n_kv_heads=2, d_mlp=80, initializer_range=0.1),
    "qwen2_vl": dict(n_layers=2, d_model=40, n_heads=5, n_kv_heads=5, d_mlp=56, initializer_range=0.1),
    "qwen3_vl": dict(n_layers=3, d_model=48, n_heads=4, n_kv_heads=2, d_head=16, d_mlp=72,  # DeepStack 0, 1
                     initializer_range=0.1),
    "llava": dict(n_layers=2, d_model=48, n_heads=4, n_kv_heads=1, d_mlp=64, initializer_range=0.1),
    # a mixture-of-experts MLP on every layer but the first; anyres tiles (base view, 4 tiles, newlines)
    "qwen3_vl_moe": dict(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_head=8, mlp_only_layers=(0,),
                         initializer_range=0.1),
    "llava_next": dict(n_layers=2, d_model=40, n_heads=4, n_kv_heads=2, d_mlp=48, initializer_range=0.1),
    "llava_next_video": dict(n_layers=2, d_model=40, n_heads=2, n_kv_heads=1, d_mlp=48, initializer_range=0.1),
    # Gated DeltaNet layers 0 and 2 (4 value heads over 2 key heads) around a softmax layer of 3 heads
    "qwen3_5": dict(initializer_range=0.1),
    # sandwich norms (post-attention / post-MLP), sliding-window and global layers, a scaled embedding
    "gemma3": dict(n_layers=3, d_model=40, n_heads=4, n_kv_heads=1, d_head=12, initializer_range=0.1),
    # dynamic tiles + thumbnail (24 px, 2x2 tokens each) wrapped in <img> ... </img>; a Llama decoder
    "internvl": dict(n_layers=2, d_model=40, n_heads=5, n_kv_heads=1, d_mlp=48, text_model="llama", tile=24,
                     patch_size=6, initializer_range=0.1),
    # split images: tagged sub-images + the global image (pixel shuffle by 3 for SmolVLM)
    "idefics3": dict(n_layers=2, d_model=36, n_heads=3, n_kv_heads=1, d_mlp=40, sub_image=24, patch_size=6,
                     initializer_range=0.1),
    # the whole prompt one bidirectional prefix block (token types); Gemma's (1 + w) norms, scaled embedding
    "paligemma": dict(n_layers=2, d_model=40, n_heads=4, n_kv_heads=2, d_head=12, initializer_range=0.1),
    # Pixtral tower (images of several sizes in one sequence), 2x2 patch merger, [IMG_BREAK] / [IMG_END] markers
    "mistral3": dict(n_layers=2, d_model=36, n_heads=3, n_kv_heads=1, d_head=12, initializer_range=0.1),
    # chunked RoPE layers with the q / k norm, a NoPE layer with temperature tuning, sigmoid-routed MoE + shared expert
    "llama4": dict(initializer_range=0.1),
    # short convolutions (ports b, c, x per channel group) around an attention layer; tiles + thumbnail
    # every image token in one bidirectional block, image features added to the placeholder embeddings
    "molmo2": dict(n_layers=2, d_model=36, n_heads=3, n_kv_heads=1, d_head=12, initializer_range=0.1),
    # fused qkv_proj (row views) and gate/up, partial rotary; HD crops + global view with newline / separator features
    "phi4_multimodal": dict(n_layers=2, d_model=36, n_heads=3, n_kv_heads=1, d_mlp=40, initializer_range=0.1),
    "lfm2_vl": dict(n_layers=3, d_model=36, n_heads=3, n_kv_heads=1, full_attn_idxs=(1, 2), initializer_range=0.1),
    "smolvlm": dict(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_mlp=40, sub_image=24, patch_size=4,
                    scale_factor=3, initializer_range=0.1),
    # perceiver latents (non-spatial image tokens) between <fake_token_around_image> boundaries; a Mistral decoder
    "idefics2": dict(n_layers=2, d_model=36, n_heads=3, n_kv_heads=1, d_mlp=40, n_latents=6, patch_size=7,
                     image_size=56, vision_init=0.2, initializer_range=0.2),
    # four norms per block (post-attention / post-MLP), fused gate/up, 3-D rotary on adjacent pairs
    "glm4v": dict(n_layers=2, d_model=48, n_heads=4, n_kv_heads=2, d_mlp=40, initializer_range=0.1),
    # grouped sigmoid routing with ungated shared experts after one dense layer
    "glm4v_moe": dict(n_layers=2, d_model=48, n_heads=3, n_kv_heads=1, d_mlp=40, n_experts=4, top_k=2, d_expert=12,
                      initializer_range=0.1),
}


def sample_edges(graph: CircuitGraph) -> list[tuple[str, str]]:
    """Edges of every receiver kind, from input, head and MLP senders."""
    last = graph.n_layers - 1
    kv = [r.name for r in graph.receivers if r.layer == last and r.kind in ("k", "v")]
    queries = [r.name for r in graph.receivers if r.layer == last and r.kind == "q"]
    image = graph.inputs[-1].name  # the last image node
    edges = [(image, [r.name for r in graph.receivers if r.layer == 0 and r.kind in ("q", "x")][-1]),
             (graph.inputs[1].name, kv[0]), (image, kv[-1]), (image, "MLP0"), (image, "logits"),
             ("L0H1", queries[0]), ("L0H0", kv[-1]), ("MLP0", kv[0]), ("L0H1", "MLP0"), (f"L{last}H1", "logits"),
             (f"MLP{last}", "logits"), ("MLP0", f"MLP{last}")]
    # a Gated DeltaNet layer's other ports: write strength, decay, output gate; a short convolution's gates
    edges += [(image if r.layer == 0 else "L0H0", r.name) for r in graph.receivers
              if r.kind in ("beta", "g", "gate", "b", "c") and r.index == 1]
    return [e for e in edges if e[0] in graph.sender_index]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    model = tiny_vlm(request.param, seed=3, **FAMILIES[request.param])
    size = 64 if request.param in ("qwen3_vl", "qwen3_vl_moe", "llava_next", "qwen3_5", "gemma3") else 56
    batch = build_pair_batch(model, [make_pair(2, 3, seed=5, size=size), make_pair(4, 2, seed=6, size=size)])
    return request.param, model, batch


def test_path_patch_matches_plain_hooks_and_eap_matches_gradients(family):
    name, model, batch = family
    graph = CircuitGraph.for_batch(model, batch.clean.token_regions, "token")
    edges = sample_edges(graph)
    references = ref.caches(model, batch)
    exact = path_patch(model, batch, [f"{s}->{r}" for s, r in edges])
    scores = edge_attribution(model, batch, method="eap")
    for i, (sender, receiver) in enumerate(edges):
        expected = ref.exact_effect(model, batch, sender, receiver, references)
        got = exact.per_pair_effects[i]
        # float32 rounding of O(1) logits is ~1e-7; the effects reach 1e-2
        assert torch.allclose(got, expected, rtol=1e-4, atol=1e-6), f"{name} {sender}->{receiver}: {got} vs {expected}"
        gradient = ref.edge_integrand(model, batch, sender, receiver, 1.0, references)
        score = scores.score(f"{sender}->{receiver}")
        assert abs(score - gradient) <= 1e-4 * abs(gradient) + 1e-9, f"{name} {sender}->{receiver}: {score} vs {gradient}"
    # the sample spans every receiver kind and edges that really move the metric
    kinds = {graph.receivers[graph.receiver_index[r]].kind for _, r in edges}
    assert kinds >= {"q", "k", "v", "mlp", "logits"}
    if name == "qwen3_5":
        assert kinds >= {"beta", "g", "gate"} and graph.layers[0].mixer == "linear_attention"
    if name == "lfm2_vl":
        assert kinds >= {"b", "c", "x"} and graph.layers[0].mixer == "short_conv"
    assert float(exact.effects.abs().max()) > 1e-3


@pytest.mark.parametrize("image_nodes", ["image", "token"])
def test_no_edge_is_the_clean_run_and_every_edge_the_corrupt_run(family, image_nodes):
    _, model, batch = family
    graph = CircuitGraph.for_batch(model, batch.clean.token_regions, image_nodes)
    # the input nodes hold every position once (tiles, newlines and class tokens included)
    assert bool((graph.input_masks(batch.clean.token_regions, batch.seq_len).sum(0) == 1).all())
    metric = CircuitMetric(batch)
    none, every = torch.tensor([], dtype=torch.long), torch.arange(graph.n_edges)
    inputs = (graph.edge_sender < graph.n_inputs).nonzero().flatten()  # every input's edges: the corrupt inputs
    values = run_conditions(model, graph, batch, metric, [Condition(none), Condition(every), Condition(inputs),
                                                          Condition(none, invert=True), Condition(every, invert=True)])
    scale = float((values.corrupt - values.clean).abs().max())
    assert scale > 0
    expected = (values.clean, values.corrupt, values.corrupt, values.corrupt, values.clean)
    for row, target in enumerate(expected):
        assert torch.allclose(values.patched[row], target, atol=1e-5 * scale + 1e-7), row
    _, _, clean_metric, corrupt_metric = ref.caches(model, batch)
    assert torch.allclose(values.clean, clean_metric, atol=1e-5 * scale + 1e-7)
    assert torch.allclose(values.corrupt, corrupt_metric, atol=1e-5 * scale + 1e-7)


def test_a_block_that_is_not_additive_is_refused_in_one_line():
    model = tiny_vlm("qwen2_5_vl", seed=0, fresh=True, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2)
    block = model.blocks[1]
    original = block.attn.forward
    block.attn.forward = lambda *a, **k: 2 * torch.tanh(original(*a, **k))  # no longer o_proj of the heads' z
    batch = build_pair_batch(model, [make_pair(2, 3, seed=5, size=56)])
    with pytest.raises(UserInputError, match="not the sum of what its heads and MLPs write"):
        edge_attribution(model, batch)
