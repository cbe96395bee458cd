"""A user file with a key given twice is refused everywhere vlens reads one (JSON would silently keep
the last value), with the file and key named; a command that fails early leaves no empty --out."""

from __future__ import annotations

import json

import pytest

import vlens
from tests.helpers.faults import run_cli
from vlens.utils.strict_json import DuplicateKeyError

TWICE = "appears twice"


def _dup(path, key="a", first='"x"', second='"y"', extra=""):
    path.write_text(f'{{{extra}"{key}": {first}, "{key}": {second}}}\n', encoding="utf-8")
    return path


@pytest.mark.parametrize("argv, flag", [
    (["ablate", "--model", "tiny", "--patching", "{file}", "--out", "{out}"], "--patching"),
    (["headlens", "--model", "tiny", "--make", "4", "--vocab", "{file}", "--out", "{out}"], "--vocab"),
    (["headlens", "--model", "tiny", "--make", "4", "--thresholds", "{file}", "--out", "{out}"], "--thresholds"),
    (["temperature", "apply", "--model", "tiny", "--temps", "{file}", "--data", "{data}", "--out", "{out}"],
     "--temps"),
])
def test_a_command_refuses_a_file_with_a_repeated_key_and_leaves_no_empty_out(tmp_path, capsys, argv, flag):
    file, out, data = _dup(tmp_path / "file.json"), tmp_path / "out", tmp_path / "data"
    data.mkdir()
    argv = [a.format(file=file, out=out, data=data) for a in argv]
    code, err = run_cli(argv, capsys)
    assert code == 2 and TWICE in err and "'a'" in err and str(file) in err, err
    assert not out.exists(), "an early error left an empty --out folder behind"


def test_device_map_with_a_repeated_module_is_refused(tmp_path, capsys):
    file = _dup(tmp_path / "map.json", "model.visual", '"cpu"', '"cuda:0"')
    for value in (str(file), file.read_text().strip()):
        code, err = run_cli(["ablate", "--model", "tiny", "--device-map", value, "--out", str(tmp_path / "o")], capsys)
        assert code == 2 and "--device-map" in err and TWICE in err and "model.visual" in err, err


def test_load_result_lens_config_and_stored_interventions_refuse_repeated_keys(tmp_path):
    result = _dup(tmp_path / "results.json", "kind", '"ablation"', '"patching"')
    with pytest.raises(DuplicateKeyError, match=f"results.json.*'kind' {TWICE}"):
        vlens.load_result(result)

    from vlens.lens.translators import CONFIG_FILE, WEIGHTS_FILE, Translators

    lens = tmp_path / "lens"
    lens.mkdir()
    _dup(lens / CONFIG_FILE, "d_model", "8", "16", extra='"n_layers": 2, ')
    (lens / WEIGHTS_FILE).write_bytes(b"")
    with pytest.raises(DuplicateKeyError, match=f"lens config .*{CONFIG_FILE}.*'d_model' {TWICE}"):
        Translators.load(lens)

    from vlens.demo.interventions_stage import interventions_section

    study = _dup(tmp_path / "study.json", "rows", "[]", "[]")
    with pytest.raises(DuplicateKeyError, match=f"interventions study .*study.json.*'rows' {TWICE}"):
        interventions_section(None, study)


def test_a_failing_command_keeps_an_out_folder_that_existed_or_holds_files(tmp_path, capsys):
    file = _dup(tmp_path / "file.json")
    existing = tmp_path / "existing"
    existing.mkdir()
    code, _ = run_cli(["ablate", "--model", "tiny", "--patching", str(file), "--out", str(existing)], capsys)
    assert code == 2 and existing.is_dir()  # the user's folder stays, even empty
    (tmp_path / "ok.json").write_text(json.dumps({"a": 1}))
    assert json.loads((tmp_path / "ok.json").read_text()) == {"a": 1}


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    from vlens.testing import tiny_hf_model, tiny_qwen_processor

    folder = tmp_path_factory.mktemp("outs") / "model"
    tiny_hf_model("qwen2_5_vl").save_pretrained(folder)
    tiny_qwen_processor().save_pretrained(folder)
    return folder


@pytest.mark.parametrize("where, relation", [("{m}", "is"), ("{m}/sub", "is inside"), ("{m}/..", "contains")])
def test_an_out_folder_on_an_input_model_folder_is_refused_before_anything_is_written(
        model_folder, tmp_path, capsys, where, relation):
    temps = tmp_path / "temps.json"
    temps.write_text("{}")
    before = sorted(p.name for p in model_folder.iterdir())
    out = where.format(m=model_folder)
    code, err = run_cli(["temperature", "export", "--model", str(model_folder), "--temps", str(temps), "--out", out,
                         "--overwrite"], capsys)
    assert code == 2 and f"--out {out} {relation} the input --model {model_folder}" in err, err
    assert sorted(p.name for p in model_folder.iterdir()) == before  # the source weights untouched


def test_an_out_folder_inside_a_data_folder_is_refused_and_a_sibling_is_fine(tmp_path, capsys):
    import argparse

    from vlens.cli.dataset_options import check_out_apart

    data = tmp_path / "data"
    data.mkdir()
    code, err = run_cli(["ablate", "--model", "tiny", "--data", str(data), "--out", str(data / "runs")], capsys)
    assert code == 2 and "is inside the input --data" in err, err
    assert not (data / "runs").exists()
    check_out_apart(argparse.Namespace(out=str(tmp_path / "runs"), data=[str(data)], input_paths=("data",),
                                       model="tiny"))


def test_a_flag_the_data_would_ignore_is_refused_before_the_model_loads(tmp_path, capsys):
    from vlens.data import make_task_sample, write_imagefolder

    data = tmp_path / "counting"
    write_imagefolder([make_task_sample("counting", seed=i, size=56) for i in range(2)], data)
    code, err = run_cli(["eval", "--model", "tiny", "--data", str(data), "--category-field", "subject", "--out",
                         str(tmp_path / "o")], capsys)
    assert code == 2 and "--category-field 'subject' breaks multiple-choice accuracy down" in err, err
    assert "is a count task: drop it" in err and not (tmp_path / "o").exists()
