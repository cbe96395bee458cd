"""`vlens sae evaluate` / `dashboard` and `vlens transcoder evaluate` run on the model the dictionary
records; a folder that records none or one that cannot be loaded, and a --model that does not fit, are
one-line errors (before: the built-in model was evaluated without a word, or a width mismatch crashed as
an internal error)."""

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
    cfg = TranscoderConfig(kind="plt", activation="relu", d_model=RANDOM_TINY_WIDTH, d_tc=8, layers=(0, 1),
                           metadata={"model_name": "random-tiny"})
    folder = tmp_path / "tc"
    save_transcoders(Transcoders(cfg), folder)
    code, _ = _run(["transcoder", "evaluate", "--transcoders", str(folder), "--out", str(tmp_path / "e"), *FAST],
                   capsys)
    assert code == 0
    assert json.loads((tmp_path / "e" / "results.json").read_text())["model"] == "random-tiny"
