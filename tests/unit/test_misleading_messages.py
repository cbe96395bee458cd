"""Messages that misled (issue 42's audit and this slice's own probes), each now saying what was wrong and
how to fix it: hooks that are not (name, function) pairs, a file or a missing path given as a model folder,
answer tokens of the wrong form, an interventions file of numbers, a --direction that is no tensor, the
default --top-k on a small model."""

from __future__ import annotations

import pytest
import torch

import vlens
from tests.helpers.models import tiny_vlm
from vlens.cli import main
from vlens.core.loading import load_hf_model_and_processor
from vlens.demo.interventions_stage import interventions_rows
from vlens.lens import logit_lens

torch.set_num_threads(1)


def test_hooks_that_are_not_name_function_pairs():
    model = tiny_vlm("qwen2_5_vl")
    inputs = model.prepare(prompts=["How many dots are there?"])
    hook = "blocks.0.hook_resid_post"
    # before: TypeError "'int' object is not callable" / ValueError "too many values to unpack"
    with pytest.raises(vlens.UserInputError, match=r"fwd_hooks\[0\]: the hook for 'blocks.0.hook_resid_post' is a "
                                                   "int, not a function"):
        model.run_with_hooks(inputs, fwd_hooks=[(hook, 3)])
    with pytest.raises(vlens.UserInputError, match=r"fwd_hooks\[0\] must be a \(hook name, function\) pair"):
        model.run_with_hooks(inputs, fwd_hooks=[hook])
    with pytest.raises(vlens.UserInputError, match="bwd_hooks must be a list of"):
        with model.hooks(bwd_hooks=hook):
            pass
    seen = []
    with model.hooks(fwd_hooks=((hook, lambda a, hook: seen.append(a.shape)) for _ in range(1))):  # any iterable
        model(inputs)
    assert len(seen) == 1 and all(not p.fwd_hooks for p in model.hook_dict.values())


def test_a_file_or_a_missing_path_is_no_model_folder(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"x")
    # before: the Hub's "Repo id must be in the form 'repo_name' or 'namespace/repo_name'"
    with pytest.raises(vlens.UserInputError, match="is a file, not a model folder"):
        load_hf_model_and_processor(str(tmp_path / "weights.bin"))
    with pytest.raises(vlens.UserInputError, match="does not exist .*check the path"):
        load_hf_model_and_processor(str(tmp_path / "missing"))


def test_answer_tokens_of_the_wrong_form():
    model = tiny_vlm("qwen2_5_vl")
    inputs = model.prepare(prompts=["a", "b"])
    with pytest.raises(vlens.UserInputError, match=r"per row, a list of the answer's token ids .* got \[1, 2\]"):
        logit_lens(model, inputs, [1, 2])  # before: TypeError "'int' object is not iterable"


def test_an_interventions_file_of_numbers_has_rows_of_the_wrong_kind():
    with pytest.raises(vlens.UserInputError, match="row 0 is a int, not an object"):
        interventions_rows([1, 2])  # before: "the interventions file has no rows"
    with pytest.raises(vlens.UserInputError, match="has no rows"):
        interventions_rows([])


def test_a_direction_that_is_no_tensor_and_the_default_top_k(tmp_path, capsys):
    (tmp_path / "d.pt").write_text("{")
    code = main(["steer", "--model", "random-tiny", "--prompt", "hi", "--direction", str(tmp_path / "d.pt"),
                 "--out", str(tmp_path / "s"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    # before: torch's "Weights only load failed. In PyTorch 2.6, we changed the default value of ..."
    assert code == 2 and len(err) == 1 and "--direction" in err[0] and "torch.save(v, path)" in err[0], err
    code = main(["ablate", "--model", "random-tiny", "--tasks", "counting", "--out", str(tmp_path / "a"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    # before: "--top-k must be an integer in [1, 7] ..., got 20" though no --top-k was given
    assert code == 2 and "the default --top-k 20 is not fewer than this model's 8 heads" in err[-1], err
