"""Every method's command on small files in the real datasets' formats (written here): PixMo-Count,
CountBenchQA, MMMU-style multiple choice, generic qa rows, in jsonl / parquet / arrow / save_to_disk."""

from __future__ import annotations

import json

from tests.helpers.real_formats import (
    countbench_table,
    image_dict,
    mmmu_table,
    pixmo_table,
    qa_table,
    write_rows,
)
from vlens.cli import main

FAST = ["--model", "random-tiny"]


def test_ablate_runs_real_sets_as_tasks(tmp_path):
    pixmo = write_rows(pixmo_table([1, 2, 3, 4]), tmp_path / "pixmo", "parquet")
    countbench = write_rows(countbench_table([2, 3, 4, 1]), tmp_path / "countbench", "disk")
    out = tmp_path / "ablation"
    assert main(["ablate", *FAST, "--data", str(pixmo), str(countbench), "--tasks", "none", "--n-examples", "2",
                 "--n-reference", "2", "--top-k", "2", "--out", str(out), "--quiet"]) == 0
    report = json.loads((out / "results.json").read_text())
    assert sorted(report["results"]) == ["countbench", "pixmo"]
    assert report["results"]["pixmo"]["n_examples"] == 2


def test_ablate_keeps_the_task_suites_with_data_and_says_how_it_splits(tmp_path, capsys):
    apples = write_rows(pixmo_table([1, 2, 3, 4, 5, 6]), tmp_path / "apples", "parquet")
    out = tmp_path / "ablation"
    assert main(["ablate", *FAST, "--data", str(apples), "--tasks", "counting", "--n-examples", "4",
                 "--n-reference", "4", "--top-k", "2", "--out", str(out)]) == 0
    report = json.loads((out / "results.json").read_text())
    assert sorted(report["results"]) == ["apples", "counting"]  # the suite stays
    split = report["settings"]["data_splits"]["apples"]
    assert (split["evaluated"], split["reference"]) == (3, 3)  # 6 records < 4 + 4: split in half
    assert report["results"]["apples"]["n_examples"] == 3
    err = capsys.readouterr().err
    assert "apples: 3 examples evaluated (readable records 1-3), 3 give the reference means (4-6)" in err
    assert "split in half" in err and "tasks: counting (task suites" in err


def test_logit_lens_and_lens_train_on_real_sets(tmp_path):
    data = write_rows(countbench_table([1, 2, 3]), tmp_path / "cb", "arrow")
    assert main(["logit-lens", *FAST, "--data", str(data), "--format", "countbenchqa", "--out",
                 str(tmp_path / "ll"), "--quiet"]) == 0
    result = json.loads((tmp_path / "ll" / "results.json").read_text())
    assert result["answers"] == ["1", "2", "3"]
    pixmo = write_rows(pixmo_table([1, 2, 3, 4]), tmp_path / "pixmo", "jsonl")
    assert main(["lens", "train", *FAST, "--data", str(pixmo), "--steps", "3", "--out", str(tmp_path / "lens"),
                 "--quiet"]) == 0
    assert main(["headlens", *FAST, "--data", str(data), "--lens-data", str(pixmo), "--lens-steps", "3",
                 "--k", "3", "--out", str(tmp_path / "hl"), "--quiet"]) == 0
    heads = json.loads((tmp_path / "hl" / "results.json").read_text())
    assert heads and json.loads((tmp_path / "hl" / "lens_kl.json").read_text())


def test_patch_builds_pairs_where_the_data_has_them(tmp_path, capsys):
    rows = []
    for pair, (clean, corrupt) in enumerate([(2, 3), (4, 1)]):
        for role, count in (("clean", clean), ("corrupt", corrupt)):
            rows.append({"image": image_dict(count), "question": "How many dots are there?", "answer": str(count),
                         "pair_id": f"p{pair}", "role": role})
    pairs = write_rows(rows, tmp_path / "pairs", "parquet")
    assert main(["patch", *FAST, "--pairs", str(pairs), "--mode", "layer-region", "--out", str(tmp_path / "vap"),
                 "--quiet"]) == 0
    assert json.loads((tmp_path / "vap" / "results.json").read_text())["pair_ids"] == ["p0", "p1"]
    no_pairs = write_rows(pixmo_table([1, 2]), tmp_path / "pixmo", "parquet")
    code = main(["patch", *FAST, "--pairs", str(no_pairs), "--mode", "layer-region", "--out",
                 str(tmp_path / "x"), "--quiet"])
    assert code == 2 and "no pair_id / role column" in capsys.readouterr().err


def test_train_and_temperature_apply_on_real_sets(tmp_path):
    pixmo = write_rows(pixmo_table([1, 2, 3]), tmp_path / "pixmo", "disk")
    qa = write_rows(qa_table(["3", "1"]), tmp_path / "qa", "jsonl")
    assert main(["train", *FAST, "--data", str(pixmo), str(qa), "--out", str(tmp_path / "run"), "--max-steps", "1",
                 "--lora-rank", "2", "--focus-layers", "1", "--quiet"]) == 0
    assert json.loads((tmp_path / "run" / "sft_result.json").read_text())["steps"] == 1
    temps = tmp_path / "temps.json"
    temps.write_text(json.dumps({"alpha": 1.2, "heads": [{"layer": 1, "head": 0, "beta": 1.5}]}))
    countbench = write_rows(countbench_table([2, 3]), tmp_path / "cb", "parquet")
    assert main(["temperature", "apply", *FAST, "--temps", str(temps), "--data", str(countbench),
                 "--max-new-tokens", "2", "--out", str(tmp_path / "temp")]) == 0
    summary = json.loads((tmp_path / "temp" / "results.json").read_text())
    assert summary["with"]["n"] == summary["without"]["n"] == 2


def test_eval_reads_an_mmmu_save_to_disk_folder(tmp_path, capsys):
    mmmu = write_rows(mmmu_table(), tmp_path / "mmmu", "disk")
    assert main(["eval", "--model", "tiny", "--data", str(mmmu), "--out", str(tmp_path / "out"),
                 "--max-new-tokens", "2", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "mcq: n=2" in out and "post-prompt: '' (none: the embedded model" in out
    report = json.loads((tmp_path / "out" / "results.json").read_text())
    assert report["n_skipped"] == 1  # the open question


def test_a_word_answer_set_is_refused_for_counting_scores(tmp_path, capsys):
    qa = write_rows(qa_table(["red", "blue"]), tmp_path / "qa", "parquet")
    assert main(["eval", "--model", "tiny", "--data", str(qa), "--out", str(tmp_path / "out")]) == 2
    assert "answer 'red'" in capsys.readouterr().err
