"""Head ablation machinery on a random tiny VLM with images: alignment, reference means,
exact resumed sweeps, resampling, Jaccard, JSON and the `vlens ablate` command."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers.ablation_models import SIZE, report_with_known_sets, task_vocab_model
from vlens import HookedVLM, SweepOptions, act_name
from vlens.ablation import (
    AblationReport,
    chance_jaccard,
    collect_reference,
    head_ablation_sweep,
    head_set_from_json,
    jaccard,
    jaccard_matrix,
    top_k_heads,
)
from vlens.ablation.reference import row_position_keys
from vlens.ablation.tasks import REFERENCE_SEED_OFFSET, build_task_batch, parse_task
from vlens.testing import tiny_hf_model, tiny_qwen_processor
from vlens.utils.finite import json_safe

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model():
    return task_vocab_model()


@pytest.fixture(scope="module")
def counting(model):
    return (build_task_batch(model, "counting", 5, seed=0, image_size=SIZE),
            build_task_batch(model, "counting", 4, seed=0, image_size=SIZE, reference=True))


# ---------------------------------------------------------------- head sets and Jaccard
def test_jaccard_on_known_sets():
    a, b, c = {(0, 1), (1, 2), (2, 3)}, {(1, 2), (2, 3), (3, 0), (3, 1)}, set()
    assert jaccard(a, b) == pytest.approx(2 / 5)
    assert jaccard(a, a) == 1.0 and jaccard(a, c) == 0.0 and jaccard(c, c) == 1.0
    matrix, names = jaccard_matrix({"x": a, "y": b, "z": {(9, 9)}})
    assert names == ["x", "y", "z"]
    expected = torch.tensor([[1, 0.4, 0], [0.4, 1, 0], [0, 0, 1]], dtype=torch.float64)
    assert torch.allclose(matrix, expected)


def test_chance_jaccard_matches_hand_computation():
    # k = 1 of n: the sets coincide with probability 1/n (J = 1), else J = 0
    assert chance_jaccard(1, 4) == pytest.approx(0.25)
    assert chance_jaccard(5, 5) == 1.0
    # k = 2 of 4: |A ∩ B| = 0, 1, 2 with P = 1/6, 4/6, 1/6 -> J = 0, 1/3, 1
    assert chance_jaccard(2, 4) == pytest.approx(4 / 6 / 3 + 1 / 6)


def test_top_k_order_and_ties():
    scores = torch.tensor([[0.1, 0.5], [0.5, -2.0]])
    assert top_k_heads(scores, 3) == [(0, 1), (1, 0), (0, 0)]  # tie broken by (layer, head)
    assert top_k_heads(scores, 3, tiebreak=torch.tensor([[0, 0], [1, 0]])) == [(1, 0), (0, 1), (0, 0)]
    assert top_k_heads(scores, 1, absolute=True) == [(1, 1)]
    assert len(top_k_heads(scores, 20)) == 4  # k larger than the number of heads
    with pytest.raises(ValueError, match="k >= 1"):
        top_k_heads(scores, 0)


def test_head_set_from_patching_json_formats():
    grid = [[0.1, -0.9], [0.3, 0.0]]
    assert head_set_from_json(grid, 2, 2, k=2) == [(0, 1), (1, 0)]  # by |effect|
    assert head_set_from_json({"head_scores": grid}, 2, 2, k=1) == [(0, 1)]
    assert head_set_from_json({"heads": [[1, 0], [0, 0]]}, 2, 2) == [(1, 0), (0, 0)]
    assert head_set_from_json({"heads": [{"layer": 1, "head": 1}]}) == [(1, 1)]
    # `vlens patch --mode layer-head` output: rows are the swept layers, columns the heads
    vap = {"mode": "layer-head", "layers": [2, 3], "heads": [0, 1], "overwrite_rate": [[0, 1], [0.5, 0]],
           "patch_effect": [[0.2, 0.1], [-0.9, 0.0]]}
    assert head_set_from_json(vap, k=2) == [(3, 0), (2, 0)]
    assert head_set_from_json(vap, k=1, metric="overwrite_rate") == [(2, 1)]
    with pytest.raises(ValueError, match="n_layers, n_heads"):
        head_set_from_json([[1.0, 2.0, 3.0]], 2, 2)
    # a patch effect below its noise floor is null: those heads are left out (and said so), none at all refused
    vap["patch_effect"] = [[None, 0.1], [-0.9, None]]
    assert head_set_from_json(vap, k=3) == [(3, 0), (2, 1)]
    vap["patch_effect"] = [[None, None], [None, None]]
    vap["patch_effect_floor"] = {"defined": False, "rule": "NaN unless ..."}
    with pytest.raises(ValueError, match="every head's patch_effect is null.*--patching-metric overwrite_rate"):
        head_set_from_json(vap, k=2)


# ---------------------------------------------------------------- tasks
def test_task_names_and_disjoint_reference_seeds(model, counting):
    assert parse_task("counting@synreal") == ("counting", "synreal")
    assert parse_task("colour") == ("colour", "synpoly")
    with pytest.raises(ValueError, match="unknown task"):
        parse_task("juggling")
    evaluation, reference = counting
    assert [r["seed"] for r in evaluation.records] == list(range(5))
    assert [r["seed"] for r in reference.records] == [REFERENCE_SEED_OFFSET + i for i in range(4)]
    assert evaluation.answer_ids.tolist() == [model.to_single_token(a) for a in evaluation.answers]


def test_unknown_answer_word_is_a_clear_error():
    small = HookedVLM.from_hf(tiny_hf_model("qwen2_5_vl", n_layers=1, d_model=32, n_heads=2, n_kv_heads=1), processor=tiny_qwen_processor())
    with pytest.raises(ValueError, match="not in the model's vocabulary"):
        build_task_batch(small, "colour", 8, image_size=SIZE)  # the test vocabulary lacks most colours


# ---------------------------------------------------------------- alignment and reference means
def test_region_keys_follow_the_prompt_layout(model):
    inputs = model.prepare(images=[None, _image()], prompts=["How many dots are there ?", "How many ?"])
    positions, keys = row_position_keys(inputs.regions, 1, "region")
    image_positions = inputs.regions.image[1].tolist()
    by_position = dict(zip(positions.tolist(), keys, strict=True))
    assert [by_position[p] for p in image_positions] == [("image", 0, 2, 2, k) for k in range(4)]
    assert by_position[int(inputs.regions.final[1])] == ("end", 0)
    first_real = int(inputs.attention_mask[1].nonzero().min())
    assert by_position[first_real] == ("start", 0)
    # text-only row: everything counted from the end, padding excluded
    positions, keys = row_position_keys(inputs.regions, 0, "region")
    assert keys[-1] == ("end", 0) and len(keys) == int(inputs.attention_mask[0].sum())


def _image(seed: int = 0):
    from vlens.testing import random_image

    return random_image(SIZE, SIZE, seed)


@pytest.mark.parametrize("alignment", ["all", "position"])
def test_reference_means_are_the_reference_sets_means(model, counting, alignment):
    _, reference_set = counting
    inputs = reference_set.inputs(model, range(len(reference_set)))
    reference = collect_reference(model, reference_set, alignment, options=SweepOptions(batch_size=3, progress=False))
    _, cache = model.run_with_cache(inputs, names_filter=lambda n: n.endswith("hook_z"))
    z = cache[act_name("z", 1)]  # [batch, pos, H, d]
    real = inputs.attention_mask.bool()
    assert reference.n_examples == 4 and reference.n_positions == int(real.sum())
    assert torch.allclose(reference.global_mean[1], z[real].mean(0), atol=1e-5)
    # one reference row ablated "by its own reference": per-position means at the final
    # position are the mean of the final positions (left padding: the last column)
    values = reference.mean_values(1, inputs)
    expected_final = z[:, -1].mean(0) if alignment == "position" else z[real].mean(0)
    assert torch.allclose(values[0, -1], expected_final, atol=1e-5)


def test_resample_from_a_single_reference_equals_its_aligned_outputs(model, counting):
    evaluation, reference_set = counting
    one = build_task_batch(model, "counting", 1, seed=7, image_size=SIZE, reference=True)
    reference = collect_reference(model, one, "region", keep_samples=True, options=SweepOptions(progress=False))
    inputs = evaluation.inputs(model, range(3))
    resampled = reference.resample_values(0, inputs, [0, 0, 0])
    assert torch.allclose(resampled, reference.mean_values(0, inputs))
    with pytest.raises(ValueError, match="partners"):
        reference.resample_values(0, inputs, [0, 1, 0])


# ---------------------------------------------------------------- sweeps
@pytest.mark.parametrize("method", ["mean", "zero", "resample"])
def test_resumed_stacked_sweep_equals_plain_run_with_hooks(model, counting, method):
    evaluation, reference_set = counting
    reference = None if method == "zero" else collect_reference(
        model, reference_set, "region", keep_samples=method == "resample", options=SweepOptions(progress=False))
    fast = head_ablation_sweep(model, evaluation, method, reference,
                               options=SweepOptions(batch_size=3, heads_per_pass=3, progress=False))
    plain = head_ablation_sweep(model, evaluation, method, reference, resume=False,
                                options=SweepOptions(batch_size=5, progress=False))
    assert torch.allclose(fast.ablated_logprob, plain.ablated_logprob, atol=1e-5)
    assert torch.equal(fast.ablated_accuracy, plain.ablated_accuracy)
    assert fast.clean_logprob == pytest.approx(plain.clean_logprob, abs=1e-5)
    assert not torch.isnan(fast.ablated_logprob).any()
    # the clean metric is the model's own: log-softmax at the last prompt position
    inputs = evaluation.inputs(model, range(len(evaluation)))
    with torch.no_grad():
        logp = model(inputs)[:, -1].log_softmax(-1).gather(-1, evaluation.answer_ids[:, None])
    assert fast.clean_logprob == pytest.approx(float(logp.mean()), abs=1e-5)


def test_the_last_block_runs_at_the_answer_positions_only(model, counting, monkeypatch):
    import vlens.ablation.sweep as sweep_module

    evaluation, reference_set = counting
    reference = collect_reference(model, reference_set, "region", options=SweepOptions(progress=False))
    read = []
    real = sweep_module.last_block_at

    def spy(model_, resid, state, positions):
        read.append((resid.shape[1], tuple(positions.shape)))
        return real(model_, resid, state, positions)

    monkeypatch.setattr(sweep_module, "last_block_at", spy)
    fast = head_ablation_sweep(model, evaluation, "mean", reference,
                               options=SweepOptions(batch_size=3, heads_per_pass=2, progress=False))
    last = model.cfg.n_layers - 1
    per_chunk = 1 + sum(-(-model.cfg.n_heads // 2) for _ in range(last))  # the clean run + every layer but the last
    assert len(read) == per_chunk * -(-len(evaluation) // 3)
    assert all(n_read == 1 and pos > 1 for pos, (_, n_read) in read)  # one answer position of the whole sequence
    plain = head_ablation_sweep(model, evaluation, "mean", reference, resume=False,
                                options=SweepOptions(batch_size=5, progress=False))
    assert torch.allclose(fast.ablated_logprob, plain.ablated_logprob, atol=1e-5)


def test_sweep_of_some_layers_leaves_others_nan(model, counting):
    evaluation, _ = counting
    sweep = head_ablation_sweep(model, evaluation, "zero", layers=[1], options=SweepOptions(progress=False))
    assert torch.isnan(sweep.ablated_logprob[0]).all() and not torch.isnan(sweep.ablated_logprob[1]).any()
    assert all(layer == 1 for layer, _ in sweep.top_heads(4))  # unmeasured heads rank last
    again = AblationReport.from_dict(json.loads(json.dumps(  # NaN -> null
        json_safe(AblationReport({"counting": sweep}, top_k=4).to_dict()), allow_nan=False)))
    assert torch.isnan(again.results["counting"].ablated_logprob[0]).all()


# ---------------------------------------------------------------- report, JSON and CLI
def test_report_jaccard_and_json_roundtrip(tmp_path):
    report = report_with_known_sets()
    assert report.head_sets() == {"a": [(0, 0), (0, 1)], "b": [(1, 0), (0, 1)]}
    matrix, _ = report.jaccard()
    assert float(matrix[0, 1]) == pytest.approx(1 / 3)
    written = report.save(tmp_path / "r.json")
    again = AblationReport.load(written)
    assert again.head_sets() == report.head_sets()
    assert report.save(tmp_path / "folder") == tmp_path / "folder" / "results.json"  # a folder gets results.json
    assert AblationReport.load(tmp_path / "folder").head_sets() == report.head_sets()
    data = json.loads(written.read_text())
    assert data["jaccard"]["matrix"][0][1] == pytest.approx(1 / 3, abs=1e-6)
    assert data["results"]["a"]["ranked_heads"][0] == {"rank": 1, "layer": 0, "head": 0, "logprob_drop": 3.0,
                                                       "accuracy_drop": 1.0}
    assert report.reliability() is None
    report.retest = {"a": report_with_known_sets().results["b"]}  # top-2 {(1,0),(0,1)} vs {(0,0),(0,1)}
    assert report.reliability() == {"a": pytest.approx(1 / 3)}
    assert AblationReport.from_dict(report.to_dict()).reliability() == {"a": pytest.approx(1 / 3)}
    markdown = report.to_markdown()
    assert "| a | 1.00 | 0.33 (p 0.83) |" in markdown and "| b | 1.000 | 3.000 | L1H0, L0H1 |" in markdown
    figure = report.plot()
    assert figure.data[0].z.shape == (2, 2)
