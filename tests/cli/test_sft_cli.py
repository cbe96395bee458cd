"""`vlens train` and `vlens temperature` on a tiny random model and a tiny imagefolder."""

from __future__ import annotations

import json

import torch

from vlens.cli import main
from vlens.data import render_syndot, write_imagefolder


def test_train_cli_writes_adapters_and_merged_checkpoint(tmp_path):
    write_imagefolder([render_syndot(1 + i % 3, seed=i, size=84) for i in range(4)], tmp_path / "data")
    code = main(
        [
            "train",
            "--model",
            "random-tiny",
            "--data",
            str(tmp_path / "data"),
            "--out",
            str(tmp_path / "run"),
            "--max-steps",
            "2",
            "--lora-rank",
            "4",
            "--lr",
            "1e-3",
            "--focus-layers",
            "1",
            "--quiet",
            "--merged",
        ]
    )
    assert code == 0
    result = json.loads((tmp_path / "run" / "sft_result.json").read_text())
    assert result["steps"] == 2 and result["final_focus_loss"] is not None
    assert (tmp_path / "run" / "adapter" / "adapter_config.json").is_file()
    assert (tmp_path / "run" / "merged" / "config.json").is_file()


def test_temperature_cli_fit_export_apply(tmp_path):
    ablation = {
        "task": "counting",
        "method": "mean",
        "alignment": "all",
        "n_examples": 4,
        "clean_logprob": -0.5,
        "clean_accuracy": 1.0,
        "ablated_logprob": [[-0.5, -2.5, -0.5, -0.5], [-1.0, -0.5, -0.5, -0.7]],
        "ablated_accuracy": [[1.0] * 4, [1.0] * 4],
    }
    (tmp_path / "ablation.json").write_text(json.dumps(ablation))
    assert (
        main(
            [
                "temperature",
                "fit",
                "--result",
                str(tmp_path / "ablation.json"),
                "--top-k",
                "2",
                "--out",
                str(tmp_path / "temps"),
            ]
        )
        == 0
    )
    temps = json.loads((tmp_path / "temps" / "results.json").read_text())
    assert [(h["layer"], h["head"], round(h["beta"], 3)) for h in temps["heads"]] == [
        (0, 1, 1.2),
        (1, 0, 1.0),
    ]

    assert (
        main(
            [
                "temperature",
                "export",
                "--model",
                "random-tiny",
                "--temps",
                str(tmp_path / "temps"),
                "--out",
                str(tmp_path / "baked"),
            ]
        )
        == 0
    )
    from transformers import AutoModelForImageTextToText

    from vlens.testing import tiny_hf_model

    baked = AutoModelForImageTextToText.from_pretrained(str(tmp_path / "baked")).state_dict()
    original = tiny_hf_model("qwen2_5_vl").state_dict()
    key = "model.language_model.layers.0.self_attn.q_proj.weight"
    d_head = original[key].shape[0] // 4
    torch.testing.assert_close(baked[key][d_head : 2 * d_head], 1.2 * original[key][d_head : 2 * d_head])
    torch.testing.assert_close(baked[key][:d_head], original[key][:d_head])

    write_imagefolder([render_syndot(2, seed=i, size=56) for i in range(2)], tmp_path / "eval")
    assert (
        main(
            [
                "temperature",
                "apply",
                "--model",
                "random-tiny",
                "--temps",
                str(tmp_path / "temps" / "results.json"),
                "--data",
                str(tmp_path / "eval"),
                "--max-new-tokens",
                "2",
                "--out",
                str(tmp_path / "applied"),
            ]
        )
        == 0
    )
    summary = json.loads((tmp_path / "applied" / "results.json").read_text())
    assert summary["with"]["n"] == summary["without"]["n"] == 2
