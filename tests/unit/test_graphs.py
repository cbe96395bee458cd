"""Attribution graphs on known answers.

- the replacement model's logits equal HF's on every family (fp32, 1e-4), and it is frozen (an edit
  moves its features but not its patterns or scales);
- sampled edges equal autograd derivatives of the replacement model computed here through the public
  hook points only (features, errors, text tokens, image groups; PLT, skip, CLT);
- every row's direct effects plus its bias equal its value (completeness), on several families;
- a planted model whose answer one feature writes: the graph finds it, the scores are 1, pruning keeps it;
- hybrid families are refused with the reason.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.models import FAMILIES, tiny_pair, tiny_vlm
from tests.helpers.results import without_provenance
from tests.helpers.transcoders import plant
from vlens.graphs import (
    FeatureEdit,
    GraphSettings,
    ReplacementModel,
    attribution_graph,
    edits_for,
    intervene,
    linear_problem,
)
from vlens.testing import random_image
from vlens.transcoders import TranscoderConfig, Transcoders
from vlens.utils.errors import UserInputError
from vlens.utils.results import load_result

torch.set_num_threads(1)
PROMPT = "How many dots are there?"


def random_transcoders(model, kind="clt", d_tc=12, seed=0, layers=None, decoder_norm=1.0) -> Transcoders:
    layers = tuple(range(model.cfg.n_layers)) if layers is None else layers
    tc = Transcoders(TranscoderConfig(kind=kind, activation="relu", layers=layers, d_model=model.cfg.d_model, d_tc=d_tc))
    tc.initialize(torch.Generator().manual_seed(seed), decoder_norm=decoder_norm)
    if tc.W_skip is not None:
        with torch.no_grad():
            tc.W_skip.copy_(torch.randn(tc.W_skip.shape, generator=torch.Generator().manual_seed(seed + 1)) * 0.1)
    with torch.no_grad():
        tc.b_dec.normal_(0, 0.1, generator=torch.Generator().manual_seed(seed + 2))
    return tc


@pytest.mark.parametrize("family", FAMILIES)
def test_replacement_logits_equal_hf_on_every_family(family):
    hf, model = tiny_pair(family)
    inputs = model.prepare(images=[[random_image(seed=2)]], prompts=[PROMPT])
    with torch.no_grad():
        expected = hf(**inputs.to_hf_kwargs()).logits
        # decoders of a trained transcoder's scale: with far larger ones, recons + (mlp_out - recons) loses float32 bits
        replacement = ReplacementModel(model, random_transcoders(model, decoder_norm=0.1))
        got = replacement(inputs)
    assert (got - expected).abs().max() <= 1e-4
    if family in ("qwen3_5", "qwen3_5_moe"):
        assert "Gated DeltaNet" in (linear_problem(model) or "")
        with pytest.raises(UserInputError, match="Gated DeltaNet"):
            attribution_graph(replacement, inputs, target=3)
    assert "blocks.0.hook_tc_acts" not in model.hook_dict


def test_the_replacement_is_frozen_and_its_features_move_its_output():
    model = tiny_vlm("llava")
    inputs = model.prepare(images=[[random_image(seed=3)]], prompts=[PROMPT])
    replacement = ReplacementModel(model, random_transcoders(model, kind="plt"))
    run = replacement.run(inputs)
    zero = [("blocks.0.hook_tc_acts", lambda acts, hook: torch.zeros_like(acts))]
    with torch.no_grad(), replacement.frozen(run), model.hooks(fwd_hooks=zero):
        edited, cache = model.run_with_cache(inputs, names_filter=lambda n: n.endswith(("hook_pattern", "ln2.hook_scale")))
    assert (edited - run.logits).abs().max() > 1e-3  # the features matter ...
    for name in run.patterns:  # ... but attention and norms stay as they were
        assert torch.equal(cache[name], run.patterns[name])
    assert torch.equal(cache["blocks.1.ln2.hook_scale"], run.scales["blocks.1.ln2.hook_scale"])
    with torch.no_grad():
        live, _ = model.run_with_cache(inputs, names_filter=lambda n: n.endswith("ln2.hook_scale"))
    assert torch.allclose(live, run.logits, atol=1e-5)  # nothing stays behind


def reference_edges(replacement: ReplacementModel, inputs, graph, sources: list[str], target: str) -> dict[str, float]:
    """d target / d source x source value, by autograd through the replacement model with every feature
    held at its clean value: the public hook points only (hook_tc_acts, hook_tc_error, hook_inputs_embeds)."""
    model, tc = replacement.model, replacement.transcoders
    run = replacement.run(inputs)
    t = graph.nodes[graph.index(target)]
    leaves: dict[str, torch.Tensor] = {}
    hooks = []
    for i, layer in enumerate(tc.cfg.layers):
        leaf = run.acts[i].detach().clone().requires_grad_(True)
        leaves[f"acts{layer}"] = leaf
        hooks.append((f"blocks.{layer}.hook_tc_acts", lambda acts, hook, leaf=leaf: leaf))
        err = run.errors[layer].detach().clone().requires_grad_(True)
        leaves[f"err{layer}"] = err
        hooks.append((f"blocks.{layer}.hook_tc_error", lambda e, hook, err=err: err))
    captured = {}

    def embeds_hook(embeds, hook):
        leaf = embeds.detach().clone().requires_grad_(True)
        captured["embeds"] = leaf
        return leaf

    def read_input(resid, hook):  # the MLP's input: ln2(resid_mid), or ln1(resid_pre) in a parallel block
        layer = int(hook.name.split(".")[1])
        captured[layer] = model.blocks[layer].mlp_input(resid)

    def deepstack_hook(features, hook):  # Qwen3-VL: image features added after early blocks (part of the image node)
        leaf = features.detach().clone().requires_grad_(True)
        captured[hook.name] = leaf
        return leaf

    hooks.append(("hook_inputs_embeds", embeds_hook))
    hooks += [(f"blocks.{layer}.hook_deepstack", deepstack_hook) for layer in range(model.cfg.n_layers)]
    hooks += [(f"blocks.{layer}.{model.blocks[layer].mlp_input_hook}", read_input) for layer in tc.cfg.layers]
    with replacement.frozen(run), model.hooks(fwd_hooks=hooks):
        logits = model(inputs)
    if t["kind"] == "logit":
        value = logits[0, -1, graph.target["token_id"]]
        if graph.target["contrast_id"] is not None:
            value = value - logits[0, -1, graph.target["contrast_id"]]
    else:
        i = tc.cfg.layers.index(t["layer"])
        value = tc.pre_acts(i, captured[t["layer"]][0, t["pos"]])[t["feature"]]
    deepstack = [name for name in captured if isinstance(name, str) and name.endswith("hook_deepstack")]
    names = ["embeds", *leaves, *deepstack]
    found = torch.autograd.grad(value, [captured["embeds"], *leaves.values(), *(captured[n] for n in deepstack)],
                                allow_unused=True)
    grads = dict(zip(names, found, strict=True))
    image_positions = inputs.token_regions.image[0].tolist()
    out = {}
    for name in sources:
        s = graph.nodes[graph.index(name)]
        if s["kind"] == "feature":
            g = grads[f"acts{s['layer']}"]
            out[name] = 0.0 if g is None else float(g[0, s["pos"], s["feature"]] * s["activation"])
        elif s["kind"] == "error":
            g = grads[f"err{s['layer']}"]
            out[name] = 0.0 if g is None else float((g[0, s["pos"]] * run.errors[s["layer"]][0, s["pos"]]).sum())
        else:
            positions = s["positions"]
            total = (grads["embeds"][0, positions] * captured["embeds"][0, positions]).sum()
            for hook_name in deepstack:
                rows = [image_positions.index(p) for p in positions if p in image_positions]
                if grads[hook_name] is not None and rows:
                    total = total + (grads[hook_name][rows] * captured[hook_name][rows]).sum()
            out[name] = float(total)
    return out


@pytest.mark.parametrize("family,kind", [("qwen2_5_vl", "clt"), ("llava", "skip"), ("gemma3", "plt"),
                                         ("qwen3_vl", "clt"), ("aya_vision", "clt")])
def test_sampled_edges_equal_autograd_derivatives(family, kind):
    model = tiny_vlm(family)
    image = random_image(seed=4)
    inputs = model.prepare(images=[[image]], prompts=[PROMPT])
    replacement = ReplacementModel(model, random_transcoders(model, kind=kind, seed=5))
    graph = attribution_graph(replacement, inputs, target=3, contrast=5, settings=GraphSettings(batch_size=7,
                                                                                                  image_nodes="2x2"))
    features = [n["name"] for n in graph.nodes if n["kind"] == "feature"]
    late = [n["name"] for n in graph.nodes if n["kind"] == "feature" and n["layer"] == model.cfg.n_layers - 1]
    sources = features[:6] + features[-4:] + ["err0@3", f"err0@{len(graph.prompt_tokens) - 1}"] + \
        [n["name"] for n in graph.nodes if n["kind"] in ("token", "image")][-6:]
    checked = 0
    for target in [graph.nodes[-1]["name"], *late[-2:]]:
        expected = reference_edges(replacement, inputs, graph, sources, target)
        for name, value in expected.items():
            assert graph.edge(target, name) == pytest.approx(value, abs=1e-5, rel=1e-4), (target, name)
            checked += value != 0
    assert checked > 10  # the sample holds real edges, not only zeros
    assert graph.cost["backward_passes"] == 1 + -(-len(features) // 7)


# aya_vision: parallel attention + MLP (the MLP reads ln1(resid_pre)), a centred final norm and a logit scale
@pytest.mark.parametrize("family", ["qwen2_vl", "llava_next", "internvl", "qwen3_vl_moe", "smolvlm", "aya_vision"])
def test_every_row_sums_to_its_value(family):
    model = tiny_vlm(family)
    inputs = model.prepare(images=[[random_image(seed=6)]], prompts=[PROMPT])
    cap = 7 if family == "qwen2_vl" else None  # a capped graph: the left-out features' effects in `dropped`
    graph = attribution_graph(ReplacementModel(model, random_transcoders(model, kind="skip", d_tc=6, seed=7)), inputs,
                              target=4, settings=GraphSettings(batch_size=64, max_features=cap))
    rows = [i for i, v in enumerate(graph.values) if v is not None]
    assert len(rows) == graph.n_features + 1
    assert (graph.n_features == 7 and abs(graph.dropped[-1]) > 0) if cap else not any(graph.dropped)
    for i in rows:
        # float32 sums: the tolerance scales with the row's largest terms (random transcoders' errors are large)
        scale = float(graph.adjacency[i].abs().sum())
        total = float(graph.adjacency[i].sum()) + graph.biases[i] + graph.dropped[i]
        assert total == pytest.approx(graph.values[i], abs=2e-5 + 2e-7 * scale)
    logits = model(inputs)[0, -1]
    assert graph.values[-1] == pytest.approx(float(logits[4]), abs=1e-5)


def planted_answer_model():
    """Every MLP is a ReLU MLP its transcoder equals; in the last layer one feature (F3) fires everywhere and
    writes the unembedding direction of token 5 minus token 4: it alone carries the answer."""
    model = tiny_vlm("qwen2_5_vl", seed=2, fresh=True, n_layers=2, d_model=40, n_heads=4, n_kv_heads=2, d_mlp=56)
    d, f = model.cfg.d_model, 8
    tc = Transcoders(TranscoderConfig(kind="plt", activation="relu", layers=(0, 1), d_model=d, d_tc=f))
    g = torch.Generator().manual_seed(0)
    w = model.unembed.W_U.detach()
    direction = w[:, 5] - w[:, 4]
    for layer in (0, 1):
        e = torch.randn(d, f, generator=g) * 0.05
        b = torch.full((f,), -5.0)  # silent ...
        dec = torch.randn(f, d, generator=g) * 0.01
        if layer == 1:
            b[3] = 2.0  # ... but for F3 of the last layer
            dec[3] = 3.0 * direction / direction.norm() ** 2
        plant(model, tc, layer, e, b, dec)
    return model, tc


def planted_graph():
    """(model, inputs, replacement, graph of "5" minus "4", the last position) of `planted_answer_model`."""
    model, tc = planted_answer_model()
    image = random_image(seed=8)
    inputs = model.prepare(images=[[image]], prompts=[PROMPT])
    replacement = ReplacementModel(model, tc)
    graph = attribution_graph(replacement, inputs, target=5, contrast=4, images=[image])
    return model, inputs, replacement, graph, len(graph.prompt_tokens) - 1


def test_a_planted_feature_that_carries_the_answer_is_found(tmp_path):
    model, inputs, replacement, graph, last = planted_graph()
    top = graph.edges_into(graph.nodes[-1]["name"], top=3)
    assert top[0][0] == f"L1F3@{last}"
    total = float(graph.adjacency[-1].abs().sum())
    assert abs(top[0][1]) / total > 0.8
    assert top[0][1] > 0.5 and graph.values[-1] > 0.5  # it writes "5" over "4"
    scores = graph.scores()  # a perfect transcoder: no error node carries anything
    assert scores["replacement"] == pytest.approx(1.0) and scores["completeness"] == pytest.approx(1.0)
    pruned = graph.prune()
    assert bool(pruned.nodes[graph.index(f"L1F3@{last}")])
    graph.supernode("answer writer", [f"L1F3@{last}"])
    graph.save(tmp_path / "g")
    back = load_result(tmp_path / "g")
    assert without_provenance(back.to_dict()) == graph.to_dict()
    assert back.edge(graph.nodes[-1]["name"], f"L1F3@{last}") == graph.edge(graph.nodes[-1]["name"], f"L1F3@{last}")


def test_bad_requests_say_what_to_fix():
    model = tiny_vlm("qwen2_5_vl")
    replacement = ReplacementModel(model, random_transcoders(model))
    two = model.prepare(images=[[random_image(seed=1)], [random_image(seed=2)]], prompts=[PROMPT, PROMPT])
    with pytest.raises(UserInputError, match="one prompt"):
        attribution_graph(replacement, two, target=3)
    one = model.prepare(images=[[random_image(seed=1)]], prompts=[PROMPT])
    with pytest.raises(UserInputError, match="same token"):
        attribution_graph(replacement, one, target=3, contrast=3)
    with pytest.raises(UserInputError, match="outside the vocabulary"):
        attribution_graph(replacement, one, target=10**6)
    wrong = Transcoders(TranscoderConfig(kind="plt", activation="relu", layers=(0,), d_model=7, d_tc=4))
    with pytest.raises(UserInputError, match="d_model=7"):
        ReplacementModel(model, wrong)


def test_interventions_predicted_replacement_and_real():
    model, inputs, replacement, graph, last = planted_graph()
    writer = f"L1F3@{last}"
    graph.supernode("answer", [writer])
    result = intervene(replacement, inputs, graph, edits_for(graph, ["answer"], "zero"))
    # last layer, no feature downstream, frozen norms: the prediction and the replacement are the direct effect
    effect = -graph.edge(graph.nodes[-1]["name"], writer)
    for value in (result.predicted, result.replacement):
        assert value - result.clean == pytest.approx(effect, abs=1e-4)
    # the real model (final norm live) is the planted model without that feature at that position
    mlp = model.blocks[1].mlp

    def drop_writer(out, hook):
        x = model.blocks[1].ln2(hook.ctx["resid_mid"])
        act = torch.relu(x[:, last] @ mlp.e[:, 3] + mlp.b[3])
        out = out.clone()
        out[:, last] -= act[:, None] * mlp.d[3]
        return out

    def keep_resid_mid(resid, hook):
        model.blocks[1].hook_mlp_out.ctx["resid_mid"] = resid

    with torch.no_grad(), model.hooks(fwd_hooks=[("blocks.1.hook_resid_mid", keep_resid_mid),
                                                 ("blocks.1.hook_mlp_out", drop_writer)]):
        logits = model(inputs)[0, -1]
    assert result.real == pytest.approx(float(logits[5] - logits[4]), abs=1e-4)
    assert result.real - result.clean < -0.3
    doubled = intervene(replacement, inputs, graph, edits_for(graph, [writer], "scale", 2.0))
    assert doubled.replacement - doubled.clean == pytest.approx(-effect, abs=1e-4)
    # the real model's final norm is live: the residual at the answer is mostly this feature, so doubling it
    # leaves the normalised direction (and the logit difference) almost where it was
    assert abs(doubled.real - doubled.clean) < 0.05
    assert load_result_roundtrip(doubled)


def load_result_roundtrip(result) -> bool:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        result.save(tmp)
        return without_provenance(load_result(tmp).to_dict()) == result.to_dict()


def test_predicted_effects_match_the_replacement_model_for_small_edits():
    """Random transcoders: scaling early features by 1.001 moves no feature across its threshold, so the graph's
    linear prediction (direct and through every later feature) equals the replacement model's change."""
    model = tiny_vlm("qwen2_5_vl")
    inputs = model.prepare(images=[[random_image(seed=9)]], prompts=[PROMPT])
    replacement = ReplacementModel(model, random_transcoders(model, kind="clt", seed=11))
    graph = attribution_graph(replacement, inputs, target=3, contrast=5, settings=GraphSettings(batch_size=64))
    early = [n for n in graph.nodes if n["kind"] == "feature" and n["layer"] == 0]
    edits = [FeatureEdit(0, n["feature"], (n["pos"],), "scale", 1.001) for n in early[:5]]
    result = intervene(replacement, inputs, graph, edits)
    moved = result.replacement - result.clean
    assert abs(moved) > 1e-6
    assert result.predicted - result.clean == pytest.approx(moved, rel=2e-2, abs=1e-6)
    assert not result.notes
    with pytest.raises(UserInputError, match="error"):
        edits_for(graph, ["err0@1"])
