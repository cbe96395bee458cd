"""vlens verify: passes on every family's tiny model, names a check that a planted discrepancy breaks,
fails broken folders on the "load" check, and the committed verified-models table is what the rows give."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers.models import FAMILIES, tiny_pair, tiny_vlm
from tools import verified_models
from vlens import load_result
from vlens.cli import main
from vlens.verify import VerificationResult, VerifySettings, verify_model

# the other cases (two images, text only) run in the CLI test below
VIDEO_FAMILIES = {"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe", "llava_onevision",
                  "llava_next_video"}  # at least these take video
FAST = VerifySettings(max_new_tokens=2, repeats=1, case_names=("one_image", "padded_batch"))


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_passes(family):
    result = verify_model(tiny_vlm(family), family, FAST, progress=False)
    assert result.passed, result.table_rows()
    statuses = {(c.check, c.case): c.status for c in result.checks}
    for check in [("logits", "one_image"), ("logits", "padded_batch"), ("generate", "one_image"),
                  ("generate", "padded_batch"), ("hooks", "one_image"), ("causality", "padded_batch")]:
        assert statuses[check] == "pass", check
    row = result.row()
    assert row["hooks_checked"] > 10 and row["generate_identical"] and row["logits_max_rel"] <= 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_the_video_case_runs_where_the_family_takes_video(family):
    model = tiny_vlm(family)
    result = verify_model(model, family, VerifySettings(max_new_tokens=2, repeats=1, case_names=("video",)),
                          progress=False)
    row = result.row()
    # the family's adapter runs video and its config names a video token (GLM-4V's adapter would, its config has none)
    runs_video = model.adapter.takes_video() and model.cfg.video_token_id is not None
    assert runs_video or family not in VIDEO_FAMILIES
    assert result.passed and row["video_checked"] is runs_video, result.table_rows()
    statuses = {(c.check, c.case): c.status for c in result.checks}
    if runs_video:  # logits and greedy tokens equal HF's on four frames
        assert statuses == {("logits", "video"): "pass", ("generate", "video"): "pass"}
        assert row["logits_max_rel"] <= 1e-4 and row["generate_identical"] and row["skipped"] == {}
    else:
        assert statuses == {("inputs", "video"): "skip"} and row["skipped"]["video"]  # skipped with the reason


def test_a_planted_discrepancy_fails_the_named_checks():
    model = tiny_vlm("qwen2_vl")

    def nudge(resid, hook):  # HookedVLM differs from HF by a small push in the last block
        return resid + 1e-2

    model.add_hook("blocks.1.hook_resid_post", nudge, is_permanent=True)
    try:
        result = verify_model(model, "nudged", VerifySettings(max_new_tokens=2, repeats=1, case_names=("one_image",)),
                              progress=False)
    finally:
        model.reset_hooks(including_permanent=True)
    assert "logits/one_image" in result.failed_checks() and not result.passed
    assert result.row()["failed"] == result.failed_checks()


def test_cli_on_a_saved_folder_and_on_broken_ones(tmp_path, capsys):
    hf, model = tiny_pair("qwen2_5_vl")
    folder = tmp_path / "model"
    hf.save_pretrained(folder)
    model.processor.save_pretrained(folder)
    out = tmp_path / "out"
    assert main(["verify", str(folder), "--out", str(out), "--max-new-tokens", "2", "--repeats", "1", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "every check passed" in printed and "max_rel=" in printed
    loaded = load_result(out)
    assert isinstance(loaded, VerificationResult) and loaded.passed
    row = json.loads((out / "verified.json").read_text())
    assert set(verified_models.COLUMNS) <= set(row) and row["passed"] is True

    config = json.loads((folder / "config.json").read_text())
    config["text_config"]["hidden_size"] *= 2  # disagrees with the weights
    (folder / "config.json").write_text(json.dumps(config))
    assert main(["verify", str(folder), "--quiet"]) == 1
    assert "FAILED load" in capsys.readouterr().out

    no_tokenizer = tmp_path / "no_tokenizer"
    hf.save_pretrained(no_tokenizer)
    assert main(["verify", str(no_tokenizer), "--quiet", "--out", str(tmp_path / "o2")]) == 1
    printed = capsys.readouterr().out
    assert "FAILED load" in printed and "tokenizer" in printed
    assert json.loads((tmp_path / "o2" / "verified.json").read_text())["failed"] == ["load"]


def test_the_committed_table_is_what_the_rows_give():
    assert verified_models.main(["--check"]) == 0
    rows = verified_models.read_rows()
    assert rows and all(set(verified_models.COLUMNS) <= set(row) for row in rows)
    failing = verified_models.render([{**rows[0], "passed": False, "failed": ["logits/one_image"]}])
    assert "no: logits/one_image" in failing


def test_bf16_tolerances_apply():
    model = tiny_vlm("qwen2_5_vl", fresh=True).to(torch.bfloat16)
    result = verify_model(model, "bf16", VerifySettings(max_new_tokens=2, repeats=1,
                                                        case_names=("one_image", "padded_batch")), progress=False)
    assert result.dtype == "bfloat16" and result.tolerances["logits_rel"] == 3e-2
    assert result.passed, result.table_rows()
