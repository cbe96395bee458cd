"""`vlens sae evaluate` / `dashboard`, `vlens transcoder evaluate`, `vlens steer --sae` and `vlens graph` run
on the model the dictionary records (and say so); a folder that records none or one that cannot be loaded,
and a --model that does not fit, are one-line errors (before: the built-in model was evaluated without a
word, or a width mismatch crashed as an internal error)."""

from __future__ import annotations

import json

import pytest
import torch

from vlens.cli import main
from vlens.sae.registry import build_sae, make_config
from vlens.sae.saelens_format import save_sae
from vlens.transcoders import save_transcoders
from vlens.transcoders.config import TranscoderConfig
from vlens.transcoders.model import Transcoders

torch.set_num_threads(1)
HOOK = "blocks.1.hook_resid_post"
FAST = ["--image-size", "56", "--prompts-per-forward", "4", "--quiet", "--make", "2"]
RANDOM_TINY_WIDTH = 64  # d_model of random-tiny; the embedded model ("tiny", --model's usual default) has 128


def _sae(folder, d_in=RANDOM_TINY_WIDTH, **metadata):
    sae = build_sae(make_config("standard", d_in=d_in, d_sae=8, hook_name=HOOK, metadata=metadata))
    with torch.no_grad():
        sae.W_enc.normal_(generator=torch.Generator().manual_seed(0))
        sae.W_dec.copy_(sae.W_enc.T)
    save_sae(sae, folder)
    return folder


def _run(argv, capsys):
    code = main(argv)
    return code, capsys.readouterr()


def test_sae_evaluate_uses_the_recorded_model(tmp_path, capsys):
    sae = _sae(tmp_path / "sae", model_name="random-tiny")
    code, _ = _run(["sae", "evaluate", "--sae", str(sae), "--positions", "all", "--out", str(tmp_path / "e"), *FAST],
                   capsys)
    assert code == 0
    assert json.loads((tmp_path / "e" / "results.json").read_text())["model"] == "random-tiny"


@pytest.mark.parametrize("case", ["none recorded", "unloadable", "wider", "override misfits"])
def test_sae_evaluate_refuses_a_model_that_does_not_fit(tmp_path, capsys, case):
    metadata = {} if case == "none recorded" else {"model_name": str(tmp_path / "gone") if case == "unloadable"
                                                   else "random-tiny"}
    sae = _sae(tmp_path / "sae", d_in=RANDOM_TINY_WIDTH + (8 if case == "wider" else 0), **metadata)
    extra = ["--model", "tiny"] if case == "override misfits" else []
    code, out = _run(["sae", "evaluate", "--sae", str(sae), "--positions", "all", "--out", str(tmp_path / "e"),
                      *FAST, *extra], capsys)
    lines = out.err.strip().splitlines()
    assert code == 2 and len(lines) == 1, out.err
    expected = {"none recorded": "records no model (metadata.model_name): pass --model",
                "unloadable": "cannot be loaded here",
                "wider": f"reads activations of width {RANDOM_TINY_WIDTH + 8}, but this model's {HOOK} has width 64",
                "override misfits": "reads activations of width 64, but this model's blocks.1.hook_resid_post has "
                                    "width 128"}[case]
    assert expected in lines[0]
    assert not (tmp_path / "e").exists()  # refused: no --out folder left behind


def test_training_records_a_local_model_folder_by_its_absolute_path(monkeypatch, tmp_path):
    from vlens.cli.recorded_model import recorded_spec

    (tmp_path / "m").mkdir()
    monkeypatch.chdir(tmp_path)
    assert recorded_spec("m") == str(tmp_path / "m") and recorded_spec("./m") == str(tmp_path / "m")
    assert recorded_spec("tiny") == "tiny" and recorded_spec("org/name") == "org/name"


def test_transcoder_evaluate_uses_the_recorded_model(tmp_path, capsys):
    folder = _transcoders(tmp_path / "tc", model_name="random-tiny")
    code, _ = _run(["transcoder", "evaluate", "--transcoders", str(folder), "--out", str(tmp_path / "e"), *FAST],
                   capsys)
    assert code == 0
    assert json.loads((tmp_path / "e" / "results.json").read_text())["model"] == "random-tiny"


# `vlens steer --sae` and `vlens graph` (before: the built-in model ran whatever the folder recorded)
STEER = ["steer", "--prompt", "red", "--feature", "2", "--layers", "1", "--strengths", "0,2", "--max-new-tokens", "2"]
GRAPH = ["graph", "--prompt", "How many dots are there?", "--target", "3", "--batch-size", "16", "--max-features", "4",
         "--image-size", "56"]


def _transcoders(folder, **metadata):
    cfg = TranscoderConfig(kind="plt", activation="relu", d_model=RANDOM_TINY_WIDTH, d_tc=8, layers=(0, 1),
                           metadata=metadata)
    save_transcoders(Transcoders(cfg), folder)
    return folder


@pytest.mark.parametrize("command", ["steer", "graph"])
def test_steer_with_an_sae_and_graph_use_the_recorded_model_and_say_so(tmp_path, capsys, command):
    if command == "steer":
        folder = _sae(tmp_path / "sae", model_name="random-tiny")
        argv, what = [*STEER, "--sae", str(folder)], f"the SAE folder {folder}"
    else:
        folder = _transcoders(tmp_path / "tc", model_name="random-tiny")
        argv, what = [*GRAPH, "--transcoders", str(folder)], f"the transcoders {folder}"
    code, out = _run([*argv, "--out", str(tmp_path / "out")], capsys)
    assert code == 0, out.err
    assert f"model random-tiny: the one {what} was trained on" in out.err
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["provenance"]["model"]["spec"] == "random-tiny"
    assert saved["source"] == "SAE sae feature 2" if command == "steer" else saved["model"] == "random-tiny"


def test_steer_with_an_sae_and_another_fitting_model_notes_it(tmp_path, capsys):
    sae = _sae(tmp_path / "sae", model_name="some/other-model")  # the width of random-tiny's residual stream
    code, out = _run([*STEER, "--sae", str(sae), "--model", "random-tiny", "--quiet", "--out", str(tmp_path / "s")],
                     capsys)
    assert code == 0, out.err
    assert ("note: the SAE folder" in out.out and "was trained on 'some/other-model'; steering with its feature on "
            "--model 'random-tiny'" in out.out)
    assert json.loads((tmp_path / "s" / "results.json").read_text())["provenance"]["model"]["spec"] == "random-tiny"


@pytest.mark.parametrize("case", ["none recorded", "unloadable", "override misfits"])
def test_steer_with_an_sae_refuses_a_model_that_does_not_fit(tmp_path, capsys, case):
    metadata = {} if case == "none recorded" else {"model_name": str(tmp_path / "gone") if case == "unloadable"
                                                   else "random-tiny"}
    sae = _sae(tmp_path / "sae", **metadata)
    extra = ["--model", "tiny"] if case == "override misfits" else []
    code, out = _run([*STEER, "--sae", str(sae), "--quiet", "--out", str(tmp_path / "s"), *extra], capsys)
    lines = out.err.strip().splitlines()
    assert code == 2 and len(lines) == 1, out.err
    expected = {"none recorded": f"the SAE folder {sae} records no model (metadata.model_name): pass --model",
                "unloadable": "cannot be loaded here",
                "override misfits": "the direction must be [d_model=128], got (64,)"}[case]
    assert expected in lines[0]
    assert not (tmp_path / "s").exists()


def test_steer_without_an_sae_keeps_the_embedded_model_default(tmp_path, monkeypatch):
    from vlens.cli import build_parser
    from vlens.cli import steer as steer_cli

    class Loading(Exception):
        """Raised where the model would load: enough to see which."""

    def stop(args):
        raise Loading(args.model)

    monkeypatch.setattr(steer_cli, "load_model_from_args", stop)
    args = build_parser().parse_args(["steer", "--prompt", "red", "--direction", str(tmp_path), "--out",
                                      str(tmp_path / "s")])
    assert args.model is None  # the parser leaves it to the command: the --sae folder's model, else tiny
    with pytest.raises(Loading, match="^tiny$"):
        steer_cli.run_steer(args)


@pytest.mark.parametrize("case", ["none recorded", "override misfits"])
def test_graph_refuses_a_model_that_does_not_fit(tmp_path, capsys, case):
    tc = _transcoders(tmp_path / "tc", **({} if case == "none recorded" else {"model_name": "random-tiny"}))
    extra = ["--model", "tiny"] if case == "override misfits" else []
    code, out = _run([*GRAPH, "--transcoders", str(tc), "--quiet", "--out", str(tmp_path / "g"), *extra], capsys)
    lines = out.err.strip().splitlines()
    assert code == 2 and len(lines) == 1, out.err
    expected = {"none recorded": f"the transcoders {tc} records no model (metadata.model_name): pass --model",
                "override misfits": "the transcoders read d_model=64 but the model's is 128"}[case]
    assert expected in lines[0]
    if case == "override misfits":
        assert "was trained on 'random-tiny'; attributing with them on --model 'tiny'" in out.out
    assert not (tmp_path / "g").exists()


# `vlens steer --sae` steers where the dictionary's features live unless told otherwise
STEER_AT_RECORD = ["steer", "--prompt", "red", "--feature", "2", "--strengths", "0,2", "--max-new-tokens", "2",
                   "--quiet"]


def test_steer_with_an_sae_steers_at_its_recorded_hook(tmp_path, capsys):
    sae = _sae(tmp_path / "sae", model_name="random-tiny")  # trained on blocks.1.hook_resid_post
    code, out = _run([*STEER_AT_RECORD, "--sae", str(sae), "--out", str(tmp_path / "s")], capsys)
    assert code == 0, out.err
    settings = json.loads((tmp_path / "s" / "results.json").read_text())["settings"]
    assert (settings["layers"], settings["hook"]) == ([1], "hook_resid_post") and "note:" not in out.out


def test_steer_with_a_transcoder_layer_steers_where_it_writes(tmp_path, capsys):
    from vlens.transcoders.formats import save_saelens_transcoders

    cfg = TranscoderConfig(kind="plt", activation="relu", d_model=RANDOM_TINY_WIDTH, d_tc=8, layers=(0, 1),
                           metadata={"model_name": "random-tiny"})
    tc = Transcoders(cfg).initialize(torch.Generator().manual_seed(0))
    save_saelens_transcoders(tc, tmp_path / "tc", model_name="random-tiny")
    code, out = _run([*STEER_AT_RECORD, "--sae", str(tmp_path / "tc" / "layer_1"), "--out", str(tmp_path / "s")],
                     capsys)
    assert code == 0, out.err
    saved = json.loads((tmp_path / "s" / "results.json").read_text())
    assert (saved["settings"]["layers"], saved["settings"]["hook"]) == ([1], "hook_mlp_out")  # where it writes
    assert saved["source"] == "transcoder layer_1 layer 1 feature 2"
    # the whole set (vlens's folder): --layers picks the feature's layer; the same run as the direction itself
    save_transcoders(tc, tmp_path / "set")
    torch.save(tc.decoder(1, 1)[2].detach().clone(), tmp_path / "row.pt")
    code, out = _run([*STEER_AT_RECORD, "--sae", str(tmp_path / "set"), "--layers", "1", "--out", str(tmp_path / "t")],
                     capsys)
    assert code == 0, out.err
    code, out = _run([*STEER_AT_RECORD[:3], *STEER_AT_RECORD[5:], "--model", "random-tiny", "--direction",
                      str(tmp_path / "row.pt"), "--layers", "1", "--hook", "hook_mlp_out", "--out", str(tmp_path / "d")],
                     capsys)
    assert code == 0, out.err
    by_set, by_row = (json.loads((tmp_path / name / "results.json").read_text()) for name in ("t", "d"))
    assert by_set["settings"] == by_row["settings"] and by_set["tokens"] == by_row["tokens"]
    assert by_set["direction_norm"] == pytest.approx(by_row["direction_norm"], rel=1e-6)


def test_steer_with_transcoders_over_several_layers_needs_the_layer(tmp_path, capsys):
    _transcoders(tmp_path / "tc", model_name="random-tiny")  # layers 0 and 1
    code, out = _run([*STEER_AT_RECORD, "--sae", str(tmp_path / "tc"), "--out", str(tmp_path / "s")], capsys)
    assert code == 2 and "cover layers 0, 1: pass --layers L" in out.err
    assert not (tmp_path / "s").exists()


def test_steer_with_an_sae_at_another_site_notes_it(tmp_path, capsys):
    sae = _sae(tmp_path / "sae", model_name="random-tiny")
    code, out = _run([*STEER_AT_RECORD, "--sae", str(sae), "--layers", "0", "--out", str(tmp_path / "s")], capsys)
    assert code == 0, out.err
    assert f"note: the features of {sae} are written at blocks.1.hook_resid_post; steering at layers 0 " \
        "hook_resid_post as given" in out.out
    settings = json.loads((tmp_path / "s" / "results.json").read_text())["settings"]
    assert (settings["layers"], settings["hook"]) == ([0], "hook_resid_post")


def test_steer_with_an_sae_that_records_no_layer_needs_the_site(tmp_path, capsys):
    sae = build_sae(make_config("standard", d_in=RANDOM_TINY_WIDTH, d_sae=8, hook_name=None,
                                metadata={"model_name": "random-tiny"}))
    save_sae(sae, tmp_path / "sae")
    code, out = _run([*STEER_AT_RECORD, "--sae", str(tmp_path / "sae"), "--out", str(tmp_path / "s")], capsys)
    assert code == 2 and "records no per-layer hook 'blocks.L.<hook>'" in out.err and "pass --layers and --hook" \
        in out.err
    assert not (tmp_path / "s").exists()
    code, out = _run([*STEER_AT_RECORD, "--sae", str(tmp_path / "sae"), "--layers", "1", "--hook", "hook_resid_pre",
                      "--out", str(tmp_path / "s2")], capsys)
    assert code == 0, out.err
