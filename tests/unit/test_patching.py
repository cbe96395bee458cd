"""Exact patching sweeps: metrics by hand, a planted model with known answers, fast == naive, validation."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers.models import tiny_vlm
from tests.helpers.planted import PLANTED_HEAD, PLANTED_LAYER, plant_answers, planted_model, planted_pairs
from vlens import SweepOptions
from vlens.data import make_pair, write_imagefolder
from vlens.patching import (
    METRICS,
    Baseline,
    PairExample,
    build_pair_batch,
    examples_from_pairs,
    load_pair_examples,
    patch_layer_head,
    patch_layer_position,
    patch_layer_region,
    patch_layer_region_components,
    patch_metrics,
)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def planted():
    model = planted_model()
    batch = build_pair_batch(model, planted_pairs())
    plant_answers(model, batch, scale=50.0)
    return model, batch


@pytest.fixture(scope="module")
def tiny():
    return tiny_vlm("qwen2_5_vl", n_layers=2, d_model=32, n_heads=4, n_kv_heads=2)


@pytest.fixture(scope="module")
def image_batch(tiny):
    # two image sizes -> different lengths across pairs -> a left-padded batch
    pairs = [make_pair(2, 3, seed=0, size=56), make_pair(4, 2, seed=1, size=84), make_pair(1, 2, seed=2, size=56)]
    return build_pair_batch(tiny, pairs)


# ---------------------------------------------------------------------- metrics
def test_metrics_by_hand():
    # 4 pairs, vocabulary of 3 tokens; clean answer token 0, corrupt answer token 1 for all.
    clean = torch.tensor([[5.0, 1, 0], [5.0, 1, 0], [5.0, 1, 0], [0.0, 5, 0]])  # pair 3: clean run already wrong
    corrupt = torch.tensor([[1.0, 5, 0], [1.0, 5, 0], [1.0, 5, 0], [1.0, 5, 0]])
    tokens_clean, tokens_corrupt = torch.zeros(4, dtype=torch.long), torch.ones(4, dtype=torch.long)
    baseline = Baseline(clean, corrupt, tokens_clean, tokens_corrupt)
    patched = torch.tensor([
        [[1.0, 3, 0], [4.0, 3, 0], [0.0, 0, 9], [0.0, 9, 0]],  # condition 0: flip, stay, away-to-other, (wrong clean)
        [[5.0, 1, 0], [5.0, 1, 0], [5.0, 1, 0], [0.0, 5, 0]],  # condition 1: unchanged
    ])
    m = patch_metrics(patched, baseline)
    # overwrite: only pair 0 (pair 3 predicted token 1 already in the clean run: no flip from the clean answer)
    assert m["overwrite_rate"].tolist() == [0.25, 0.0]
    # flip-away: pairs 0 and 2
    assert m["flip_away_rate"].tolist() == [0.5, 0.0]
    assert torch.allclose(m["per_pair_logit_diff"][0], torch.tensor([2.0, -1.0, 0.0, 9.0]))
    assert m["logit_diff"][0].item() == pytest.approx(2.5)
    # clean LDs (-4,-4,-4,5) mean -1.75; corrupt LDs all 4; effect = (2.5 + 1.75) / (4 + 1.75)
    assert m["patch_effect"][0].item() == pytest.approx(4.25 / 5.75)
    assert m["patch_effect"][1].item() == pytest.approx(0.0)
    # corrupt-answer rate ignores the clean run: pairs 0 and 3 predict token 1
    assert m["corrupt_answer_rate"].tolist() == [0.5, 0.25]
    assert m["per_pair_prediction"][0].tolist() == [1, 0, 2, 1]


# ---------------------------------------------------------------------- planted model: known answers
def test_planted_head_sweep_flips_only_the_planted_head(planted):
    model, batch = planted
    result = patch_layer_head(model, batch)
    expected = torch.zeros(model.cfg.n_layers, model.cfg.n_heads)
    expected[PLANTED_LAYER, PLANTED_HEAD] = 1.0
    assert torch.equal(result["overwrite_rate"], expected)
    others = torch.ones_like(expected, dtype=torch.bool)
    others[PLANTED_LAYER, PLANTED_HEAD] = False
    clean_ld = result.baseline.clean_logit_diff.mean()
    assert torch.allclose(result["logit_diff"][others], clean_ld.expand(int(others.sum())), atol=1e-5)
    assert result["patch_effect"][PLANTED_LAYER, PLANTED_HEAD].item() == pytest.approx(1.0, abs=1e-4)


def test_planted_position_sweep(planted):
    model, batch = planted
    result = patch_layer_position(model, batch)
    differing = int((batch.clean.input_ids[0] != batch.corrupt.input_ids[0]).nonzero())
    final = int(batch.final[0])
    expected = torch.zeros(model.cfg.n_layers, batch.seq_len)
    expected[: PLANTED_LAYER + 1, differing] = 1.0  # before/at the planted head: the differing token
    expected[PLANTED_LAYER + 1:, final] = 1.0  # after it: only the final position
    assert torch.equal(result["overwrite_rate"], expected)
    assert result.tokens[differing] == "3"


def test_planted_region_sweep(planted):
    model, batch = planted
    result = patch_layer_region(model, batch)
    assert result.cells == ["image", "text", "final", "all"]
    rates = result["overwrite_rate"]
    assert rates[:, 0].tolist() == [0.0, 0.0, 0.0]  # no image
    assert rates[:, 1].tolist() == [1.0, 1.0, 1.0]  # text holds the differing token, then the final one
    assert rates[:, 2].tolist() == [0.0, 0.0, 1.0]  # the final position only after the planted layer
    assert rates[:, 3].tolist() == [1.0, 1.0, 1.0]
    assert torch.allclose(result["patch_effect"][:, 3], torch.ones(3), atol=1e-4)  # "all" = the corrupt run
    # the planted head writes the answer at the final position; no MLP writes anything
    components = patch_layer_region_components(model, batch, components=("attn_out", "mlp_out"))
    expected = torch.zeros(3, 4)
    expected[PLANTED_LAYER] = torch.tensor([0.0, 1.0, 1.0, 1.0])
    assert torch.equal(components["attn_out"]["overwrite_rate"], expected)
    assert torch.equal(components["mlp_out"]["overwrite_rate"], torch.zeros(3, 4))
    assert components["attn_out"].tensor.shape == (3, 4, len(METRICS))


# ---------------------------------------------------------------------- fast == naive, == plain run_with_hooks
@pytest.mark.parametrize("sweep, kwargs", [
    (patch_layer_region, {"component": "resid_pre"}),
    (patch_layer_region, {"component": "attn_out"}),
    (patch_layer_region, {"component": "mlp_out"}),
    (patch_layer_position, {}),
    (patch_layer_head, {"region": "all"}),
    (patch_layer_head, {"region": "image"}),
])
def test_fast_equals_naive(tiny, image_batch, sweep, kwargs):
    fast = sweep(tiny, image_batch, options=SweepOptions(max_batch=7), **kwargs)
    naive = sweep(tiny, image_batch, options=SweepOptions(implementation="naive"), **kwargs)
    assert torch.allclose(fast.per_pair_logit_diff, naive.per_pair_logit_diff, atol=1e-5)
    for name in ("overwrite_rate", "flip_away_rate"):
        assert torch.equal(fast[name], naive[name])


def test_fast_path_respects_hooks_on_the_last_block(tiny, image_batch):
    """An outer hook on the last block (here: scaling its MLP output) must act in both paths."""
    scale = [("blocks.1.hook_mlp_out", lambda act, hook: act * 3.0)]
    with tiny.hooks(fwd_hooks=scale):
        fast = patch_layer_head(tiny, image_batch)
        naive = patch_layer_head(tiny, image_batch, options=SweepOptions(implementation="naive"))
    plain = patch_layer_head(tiny, image_batch)
    assert torch.allclose(fast.per_pair_logit_diff, naive.per_pair_logit_diff, atol=1e-5)
    assert not torch.allclose(fast.per_pair_logit_diff, plain.per_pair_logit_diff, atol=1e-5)


def test_pair_chunks_give_the_same_result(tiny, image_batch):
    whole = patch_layer_head(tiny, image_batch, region="image")
    chunked = patch_layer_head(tiny, image_batch, region="image", options=SweepOptions(batch_size=2))
    assert torch.allclose(whole.per_pair_logit_diff, chunked.per_pair_logit_diff, atol=1e-5)
    assert torch.allclose(whole["logit_diff"], chunked["logit_diff"], atol=1e-5)


def test_cell_equals_plain_run_with_hooks(tiny, image_batch):
    """What an outside check does: cache the corrupt run, write it into the clean run with a hook."""
    result = patch_layer_region(tiny, image_batch, component="resid_pre")
    layer, region = 1, "image"
    clean_inputs, corrupt_inputs = image_batch.clean, image_batch.corrupt
    name = f"blocks.{layer}.hook_resid_pre"
    _, cache = tiny.run_with_cache(corrupt_inputs, names_filter=lambda n: n == name)
    positions = [clean_inputs.regions.region(region, row) for row in range(image_batch.n_pairs)]

    def hook(act, hook):
        act = act.clone()
        for row, pos in enumerate(positions):
            act[row, pos] = cache[name][row, pos]
        return act

    logits = tiny.run_with_hooks(clean_inputs, fwd_hooks=[(name, hook)])
    final = logits[torch.arange(image_batch.n_pairs), clean_inputs.regions.final]
    ld = final[torch.arange(3), image_batch.corrupt_tokens] - final[torch.arange(3), image_batch.clean_tokens]
    cell = result.per_pair_logit_diff[layer, result.cells.index(region)]
    assert torch.allclose(cell, ld, atol=1e-5)


# ---------------------------------------------------------------------- validation, I/O
def test_misaligned_pair_is_named(tiny):
    good = examples_from_pairs([make_pair(2, 3, seed=0, size=56)])[0]
    bad = PairExample("odd-pair", good.clean_image, make_pair(2, 3, seed=0, size=84).corrupt_image,
                      good.clean_prompt, good.corrupt_prompt, "2", "3")
    with pytest.raises(ValueError, match="odd-pair.*misaligned"):
        build_pair_batch(tiny, [good, bad])
    control = examples_from_pairs([make_pair(3, None, seed=0, size=56, kind="move")])[0]
    with pytest.raises(ValueError, match="no differing token"):
        build_pair_batch(tiny, [control])


def test_pairs_from_imagefolder(tiny, tmp_path):
    pairs = [make_pair(2, 3, seed=0, size=56), make_pair(3, 1, seed=1, size=56)]
    write_imagefolder([s for p in pairs for s in p.samples()], tmp_path / "pairs")
    examples = load_pair_examples(tmp_path / "pairs")
    assert [e.pair_id for e in examples] == [p.pair_id for p in pairs]
    batch = build_pair_batch(tiny, examples)
    assert batch.clean_answers == ["2", "3"] and batch.corrupt_answers == ["3", "1"]
    assert batch.clean_tokens.tolist() == [tiny.to_single_token("2"), tiny.to_single_token("3")]
    # a dataset with a missing role
    write_imagefolder(pairs[0].samples()[:1], tmp_path / "broken")
    with pytest.raises(ValueError, match="no 'corrupt' record"):
        load_pair_examples(tmp_path / "broken")


def test_result_json_and_plots(tiny, image_batch):
    result = patch_layer_position(tiny, image_batch.select([0, 2]))  # both 56 px: one image layout
    grid = result.image_grid_values("logit_diff")
    assert grid.shape == (2, 2, 2)
    data = json.loads(json.dumps(result.to_dict()))
    assert data["mode"] == "layer-pos" and data["n_pairs"] == 2 and len(data["overwrite_rate"]) == 2
    assert data["image_grid"] == [2, 2] and len(data["image_positions"]) == 4
    assert result.plot().data[0].z.shape == (2, result.per_pair_logit_diff.shape[1])
    assert len(result.plot_image_grid().data) == 2
    region = patch_layer_region(tiny, image_batch)
    assert len(region.plot().data) == 4
    assert patch_layer_head(tiny, image_batch).plot().data[0].z.shape == (2, 4)


def test_cli_layer_region(tmp_path):
    from vlens.cli import main

    pairs = [make_pair(2, 3, seed=0, size=56), make_pair(3, 1, seed=1, size=56)]
    write_imagefolder([s for p in pairs for s in p.samples()], tmp_path / "pairs")
    out = tmp_path / "r"
    code = main(["patch", "--model", "random-tiny", "--pairs", str(tmp_path / "pairs"), "--mode", "layer-region",
                 "--out", str(out), "--quiet"])
    assert code == 0
    data = json.loads((out / "results.json").read_text())
    assert data["mode"] == "layer-region" and data["n_pairs"] == 2 and data["regions"] == ["image", "text", "final", "all"]
    for metric in ("overwrite_rate", "logit_diff", "patch_effect"):
        assert len(data[metric]) == len(data["layers"]) and len(data[metric][0]) == 4
    assert (out / "figure.html").exists()


def test_cli_atp_and_heads_with_generated_pairs(tmp_path, capsys):
    from vlens.cli import main

    out = tmp_path / "atp"
    assert main(["patch", "--model", "random-tiny", "--make-pairs", "2", "--image-size", "56", "--mode", "atp",
                 "--compare-exact", "--out", str(out), "--quiet"]) == 0
    data = json.loads((out / "results.json").read_text())
    assert data["mode"] == "atp" and len(data["z"]) == 2 and -1.0 <= data["spearman_z_vs_exact"] <= 1.0
    out = tmp_path / "heads"
    assert main(["patch", "--model", "random-tiny", "--make-pairs", "2", "--image-size", "56", "--mode", "layer-head",
                 "--region", "image", "--out", str(out), "--quiet"]) == 0
    data = json.loads((out / "results.json").read_text())
    assert data["heads"] == [0, 1, 2, 3] and data["region"] == "image" and len(data["per_pair_prediction"][0][0]) == 2


def test_cli_skips_control_pairs_and_reports_bad_input(tmp_path, capsys):
    from vlens.cli import main

    samples = make_pair(2, 3, seed=0, size=56).samples() + make_pair(2, None, seed=1, size=56, kind="move").samples()
    write_imagefolder(samples, tmp_path / "mixed")
    out = tmp_path / "r"
    assert main(["patch", "--model", "random-tiny", "--pairs", str(tmp_path / "mixed"), "--mode", "layer-region",
                 "--out", str(out), "--quiet"]) == 0
    assert json.loads((out / "results.json").read_text())["n_pairs"] == 1
    assert "skipping 1 control pairs" in capsys.readouterr().err
    assert main(["patch", "--model", "random-tiny", "--pairs", str(tmp_path / "missing"), "--mode", "layer-region",
                 "--out", str(out), "--quiet", "--overwrite"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("vlens patch: error: ") and error.count("\n") == 1 and "Traceback" not in error


def test_multi_token_answers_use_the_first_differing_token(tiny):
    pair = examples_from_pairs([make_pair(2, 3, seed=0, size=56)])[0]
    pair.clean_answer, pair.corrupt_answer = "3 4", "3 5"  # shared first token "3"
    batch = build_pair_batch(tiny, [pair])
    assert batch.answer_prefix_len == [1]
    assert batch.clean_tokens.tolist() == [tiny.to_single_token("4")]
    assert batch.corrupt_tokens.tolist() == [tiny.to_single_token("5")]
    # the shared token is appended after the chat prompt, in both roles; the final position reads it
    for inputs in (batch.clean, batch.corrupt):
        assert int(inputs.input_ids[0, int(inputs.regions.final[0])]) == tiny.to_single_token("3")
    plain = build_pair_batch(tiny, examples_from_pairs([make_pair(2, 3, seed=0, size=56)]))
    assert batch.seq_len == plain.seq_len + 1


def test_cli_only_correct_needs_a_correct_pair(tmp_path):
    from vlens.cli import main

    # a random model answers nothing right: a clear error, exit code 2
    assert main(["patch", "--model", "random-tiny", "--make-pairs", "2", "--image-size", "56", "--mode",
                 "layer-region", "--only-correct", "--out", str(tmp_path / "r"), "--quiet"]) == 2
