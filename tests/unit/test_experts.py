"""Expert methods on a planted mixture of experts: ablation (hooks, sweep, cross-task Jaccard), patching of
expert contributions and routing statistics by region, each against a known answer.

The planted model: every expert writes zero except expert 2 of the last MoE layer, whose output is a
non-negative multiple of the answer tokens' unembedding direction; that layer's router has rows
[v, -v, 0], so expert 2 (logit 0) is chosen at every token (one of v.x, -v.x is below 0) with top-2 of 3.
Ablating expert 2 must hurt the answer; ablating any other expert changes nothing at all.
"""

from __future__ import annotations

import functools

import pytest
import torch

from tests.helpers.arch_parity import hf_logits
from vlens import SweepOptions
from vlens.ablation import AblationSettings, build_task_batch
from vlens.ablation.experts import (
    collect_expert_reference,
    cross_task_expert_ablation,
    expert_ablation_hooks,
    expert_ablation_sweep,
)
from vlens.patching import build_pair_batch, make_count_pairs
from vlens.patching.conditions import patch_hook
from vlens.patching.experts import expert_patch_hooks, patch_layer_expert
from vlens.routing import routing_statistics

QUIET = SweepOptions(progress=False)

LAYER, EXPERT, SIZE = 2, 2, 64
TASKS = ("counting", "counting@synreal")


@functools.lru_cache(maxsize=1)
def _planted():
    from vlens import HookedVLM
    from vlens.testing import tiny_qwen3_vl_moe_model, tiny_qwen3_vl_processor

    hf = tiny_qwen3_vl_moe_model(seed=3, n_layers=3, d_model=40, n_heads=2, n_kv_heads=1, d_head=16, n_experts=3,
                                 top_k=2, d_expert=12, mlp_only_layers=[1])
    model = HookedVLM.from_hf(hf, processor=tiny_qwen3_vl_processor())
    tokenizer = model.tokenizer
    answers = sorted({tokenizer.convert_tokens_to_ids(w) for w in
                      [str(i) for i in range(11)] + ["red", "blue", "green", "yes", "no"]})
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        direction = model.unembed.directions(torch.tensor(answers)).sum(0)
        direction = direction / direction.norm()
        for layer in model.cfg.moe_layers:
            model.blocks[layer].mlp.experts.down_proj.zero_()
        mlp = model.blocks[LAYER].mlp
        v = torch.randn(model.cfg.d_model, generator=generator)
        mlp.router.weight.copy_(torch.stack([v, -v, torch.zeros_like(v)]))
        a = torch.randn(model.cfg.d_model, generator=generator)
        gate_up = mlp.experts.gate_up_proj[EXPERT]
        gate_up.zero_()
        gate_up[0], gate_up[12] = a, a  # hidden 0 = silu(a.x) * (a.x) >= 0, the others 0
        mlp.experts.down_proj[EXPERT, :, 0] = 3.0 * direction
    return hf, model


@functools.lru_cache(maxsize=2)
def _task(name: str, reference: bool = False):
    _, model = _planted()
    return build_task_batch(model, name, 3, seed=0, image_size=SIZE, reference=reference)


def test_zero_ablation_equals_zeroing_the_expert_in_hf():
    hf, model = _planted()
    inputs = _task("counting").inputs(model, range(3))
    with torch.no_grad():
        ours = model.run_with_hooks(inputs, fwd_hooks=expert_ablation_hooks(model, inputs, [(LAYER, EXPERT)], "zero"))
        plain = model(inputs)
    down = hf.model.language_model.layers[LAYER].mlp.experts.down_proj
    saved = down.detach().clone()
    try:
        with torch.no_grad():
            down[EXPERT].zero_()
        expected = hf_logits(hf, inputs)
    finally:
        with torch.no_grad():
            down.copy_(saved)
    real = inputs.attention_mask.bool()  # the ablation leaves padding positions alone (nothing reads them)
    torch.testing.assert_close(ours[real], expected[real], atol=1e-5, rtol=0)
    assert (ours - plain).abs().max() > 1e-2


def test_mean_ablation_writes_the_reference_mean_where_the_expert_was_chosen():
    _, model = _planted()
    reference_set = _task("counting", reference=True)
    reference = collect_expert_reference(model, reference_set, options=QUIET)
    # the reference mean by hand: expert 2's output at every real reference position (it is chosen everywhere)
    inputs = reference_set.inputs(model, range(len(reference_set)))
    _, cache = model.run_with_cache(inputs, names_filter=lambda n: n.startswith(f"blocks.{LAYER}.mlp.hook_expert"))
    real = inputs.attention_mask.bool()
    chosen = cache[f"blocks.{LAYER}.mlp.hook_expert_indices"] == EXPERT
    assert bool(chosen[real].any(-1).all())  # planted: every token chose expert 2
    outputs = cache[f"blocks.{LAYER}.mlp.hook_expert_out"][chosen & real[..., None]]
    torch.testing.assert_close(reference.means[LAYER][EXPERT], outputs.mean(0), atol=1e-5, rtol=0)
    assert int(reference.counts[LAYER][EXPERT]) == int(real.sum())

    evaluation = _task("counting").inputs(model, range(3))
    seen = {}

    def keep(out, hook):
        seen["out"] = out

    hooks = expert_ablation_hooks(model, evaluation, [(LAYER, EXPERT)], "mean", reference)
    model.run_with_hooks(evaluation, return_type=None,
                         fwd_hooks=[*hooks, (f"blocks.{LAYER}.mlp.hook_expert_out", keep)])
    _, clean = model.run_with_cache(evaluation, names_filter=f"blocks.{LAYER}.mlp.hook_expert_indices")
    slots = (clean[f"blocks.{LAYER}.mlp.hook_expert_indices"] == EXPERT) & evaluation.attention_mask.bool()[..., None]
    assert torch.allclose(seen["out"][slots], reference.means[LAYER][EXPERT].expand(int(slots.sum()), -1))


def test_sweep_finds_the_planted_expert_and_nothing_else():
    _, model = _planted()
    task = _task("counting")
    reference = collect_expert_reference(model, _task("counting", reference=True), options=QUIET)
    others = [(layer, e) for layer in model.cfg.moe_layers for e in range(3) if (layer, e) != (LAYER, EXPERT)]
    for method in ("mean", "zero"):
        result = expert_ablation_sweep(model, task, method, reference,
                                       options=QUIET.replace(batch_size=2, heads_per_pass=2))
        plain = expert_ablation_sweep(model, task, method, reference, resume=False,
                                      options=QUIET.replace(batch_size=3))
        torch.testing.assert_close(result.ablated_logprob, plain.ablated_logprob, atol=1e-5, rtol=0, equal_nan=True)
        drop = result.logprob_drop
        assert result.unit == "expert" and drop.shape == (3, 3) and result.n_heads_total == 6
        assert bool(drop[1].isnan().all())  # the dense layer has no experts
        assert max(abs(float(drop[c])) for c in others) < 1e-5  # zero-output experts: exactly nothing
        assert abs(float(drop[LAYER, EXPERT])) > 1e-3  # the planted expert matters (mean ablation: either sign)
    # removing the planted expert's (non-negative) push towards the answers must hurt: it ranks first
    assert float(drop[LAYER, EXPERT]) > 1e-3 and result.top_heads(1) == [(LAYER, EXPERT)]


def test_cross_task_report_ranks_experts_and_compares_tasks():
    _, model = _planted()
    tasks = {name: (_task(name), _task(name, reference=True)) for name in TASKS}
    report = cross_task_expert_ablation(model, tasks, AblationSettings(method="zero", top_k=1, unit="expert"),
                                        options=QUIET.replace(batch_size=3))
    matrix, names = report.jaccard()
    assert names == list(TASKS) and float(matrix[0, 1]) == 1.0  # both tasks' top expert is the planted one
    assert report.unit == "expert" and report.n_heads_total == 6
    data = report.to_dict()
    top = data["results"]["counting"]["ranked_heads"][0]
    assert (top["layer"], top["expert"]) == (LAYER, EXPERT) and data["results"]["counting"]["unit"] == "expert"
    assert "L2E2" in report.summary() and "experts" in report.to_markdown()
    again = type(report).from_dict(data)
    assert again.unit == "expert" and again.head_sets() == report.head_sets()
    figure = report.results["counting"].plot()
    assert figure.data[0].x[0] == "E0" and figure.layout.xaxis.title.text == "expert"


def test_routing_statistics_count_by_region():
    _, model = _planted()
    task = _task("counting")
    inputs = task.inputs(model, range(3))
    stats = routing_statistics(model, [inputs], progress=False)
    assert stats.layers == model.cfg.moe_layers == [0, 2]
    planted = stats.layers.index(LAYER)
    for region in ("image", "text"):
        share = stats.share(region)
        torch.testing.assert_close(share.sum(-1), torch.full((2,), 2.0, dtype=torch.float64))  # top-2 per token
        assert float(share[planted, EXPERT]) == 1.0
        torch.testing.assert_close(stats.weight_share(region).sum(-1), torch.ones(2, dtype=torch.float64))
    # counts by hand from a cache
    _, cache = model.run_with_cache(inputs, names_filter=lambda n: n.endswith("hook_expert_indices"))
    image = inputs.token_regions.mask("image", inputs.seq_len)
    hand = torch.bincount(cache["blocks.0.mlp.hook_expert_indices"][image].flatten(), minlength=3)
    assert stats.counts[0, 0].long().tolist() == hand.tolist() and int(stats.tokens[0]) == int(image.sum())
    assert 0.0 <= float(stats.divergence()[0]) <= 1.0 and float(stats.divergence()[planted]) >= 0.0
    again = type(stats).from_dict(stats.to_dict())
    torch.testing.assert_close(again.share("text"), stats.share("text"))
    figure = stats.plot()
    assert len(figure.data) == 3 and figure.data[0].z.shape == (2, 3)


@pytest.mark.parametrize("region", ["all", "image"])
@pytest.mark.filterwarnings("ignore::vlens.patching.metrics.NoiseFloorWarning")  # a random tiny model
def test_expert_patching_matches_the_plain_hooked_run(region):
    _, model = _planted()
    batch = build_pair_batch(model, make_count_pairs(2, seed=1, size=SIZE))
    result = patch_layer_expert(model, batch, region=region, options=SweepOptions(max_batch=4))
    assert result.mode == "layer-expert" and result.metrics["logit_diff"].shape == (2, 3)
    _, corrupt = model.run_with_cache(batch.corrupt, names_filter=lambda n: "hook_expert" in n)
    positions = batch.region_mask(region)
    for row, layer in enumerate(result.layers):
        sources = {kind: corrupt[f"blocks.{layer}.mlp.hook_expert_{kind}"] for kind in ("indices", "weights", "out")}
        for expert in range(3):
            with torch.no_grad():
                logits = model.run_with_hooks(batch.clean, fwd_hooks=expert_patch_hooks(layer, [expert], sources,
                                                                                         positions))
            final = logits[torch.arange(2), batch.final]
            diff = final.gather(1, batch.corrupt_tokens[:, None]) - final.gather(1, batch.clean_tokens[:, None])
            torch.testing.assert_close(result.per_pair["logit_diff"][row, expert].float(), diff[:, 0].float(),
                                       atol=1e-4, rtol=0)
    baseline = float(result.baseline.clean_logit_diff.mean())
    zero_experts = [(r, e) for r, layer in enumerate(result.layers) for e in range(3) if (layer, e) != (LAYER, EXPERT)]
    assert all(abs(float(result.metrics["logit_diff"][c]) - baseline) < 1e-5 for c in zero_experts)


def test_patching_every_expert_at_once_equals_patching_the_routed_output():
    _, model = _planted()
    batch = build_pair_batch(model, make_count_pairs(2, seed=2, size=SIZE))
    names = lambda n: n.startswith(f"blocks.{LAYER}.mlp.hook_")  # noqa: E731
    _, corrupt = model.run_with_cache(batch.corrupt, names_filter=names)
    positions = batch.region_mask("all")
    sources = {kind: corrupt[f"blocks.{LAYER}.mlp.hook_expert_{kind}"] for kind in ("indices", "weights", "out")}
    with torch.no_grad():
        every = model.run_with_hooks(batch.clean, fwd_hooks=expert_patch_hooks(LAYER, [0, 1, 2], sources, positions,
                                                                                together=True))
        from vlens.patching.conditions import PatchSpec

        spec = PatchSpec(LAYER, "mlp_out", positions)
        routed_name = f"blocks.{LAYER}.mlp.hook_routed_out"
        whole = model.run_with_hooks(batch.clean, fwd_hooks=[(routed_name, patch_hook([spec], corrupt[routed_name]))])
    torch.testing.assert_close(every, whole, atol=1e-5, rtol=0)
