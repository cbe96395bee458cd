"""The evaluation loop, reports and `vlens eval`, with a scripted backend and a tiny random
Qwen2.5-VL, plain HF and hooked (plumbing only: its answers are noise)."""

import json

import pytest
import torch

from tests.helpers.eval_data import write_imagefolder, write_mcq
from tests.helpers.models import tiny_pair, tiny_vlm
from vlens import SweepOptions
from vlens.evaluation import (
    EvalSettings,
    HFBackend,
    HookedVLMBackend,
    evaluate,
    load_predictions,
    read_counting_imagefolder,
    read_mcq,
    write_report,
)
from vlens.evaluation.metrics import counting_metrics
from vlens.evaluation.runner import score_predictions

QUIET = SweepOptions(progress=False)


class ScriptedBackend:
    """Answers from a fixed list, in order; records the batches it was given."""

    name = "scripted"

    def __init__(self, answers):
        self.answers = list(answers)
        self.batches = []

    def generate(self, images, prompts, max_new_tokens):
        self.batches.append((len(images), [len(i) for i in images], list(prompts)))
        return [self.answers.pop(0) for _ in prompts]


@pytest.fixture(scope="module")
def tiny_hf():
    hf, model = tiny_pair("qwen2_5_vl")
    return hf, model.processor


def test_counting_loop_scores_and_reports(tmp_path):
    data = read_counting_imagefolder(write_imagefolder(tmp_path / "data", [1, 2, 3, 3, 5]))
    backend = ScriptedBackend(["1", "There are three dots.", "3", "no idea", "four"])
    result = evaluate(backend, data, options=SweepOptions(batch_size=2, progress=False))
    assert [b[0] for b in backend.batches] == [2, 2, 1]
    assert backend.batches[0][2][0] == "How many dots are there? Answer with a number."  # nothing appended
    assert [p.parsed for p in result.predictions] == [1, 3, 3, None, 4]
    assert [p.correct for p in result.predictions] == [True, False, True, False, False]
    m = result.metrics
    assert (m.n, m.n_unparsed, m.accuracy, m.mae) == (
        5,
        1,
        pytest.approx(0.4),
        pytest.approx((0 + 1 + 0 + 1) / 4),
    )

    paths = write_report(result, tmp_path / "out", model_name="scripted")
    report = json.loads(paths["json"].read_text())
    assert report["n_evaluated"] == 5 and report["n_skipped"] == 0 and report["metrics"]["n_unparsed"] == 1
    assert report["confusion_matrix"]["predicted"] == [1, 3, 4, "unparsed"]
    assert "| 3 | 2 | 50.00 | 0.00 | 1 |" in paths["markdown"].read_text()  # per-count row for count 3
    assert paths["figure"].is_file()
    rescored = score_predictions("count", load_predictions(paths["predictions"]))
    assert rescored == m


def test_skipped_rows_reach_the_report(tmp_path):
    write_imagefolder(tmp_path / "data", [1, 2, 3])
    (tmp_path / "data" / "img_002.png").unlink()
    data = read_counting_imagefolder(tmp_path / "data", skip_missing=True)
    result = evaluate(ScriptedBackend(["1", "2"]), data, options=QUIET)
    paths = write_report(result, tmp_path / "out")
    report = json.loads(paths["json"].read_text())
    assert (report["n_evaluated"], report["n_skipped"]) == (2, 1)
    assert "img_002.png" in report["skipped"][0]["reason"] and "img_002.png" in paths["markdown"].read_text()


def test_mcq_loop_prompts_with_options(tmp_path):
    data = read_mcq(write_mcq(tmp_path))
    backend = ScriptedBackend(["B", "(A)", "the answer is square, B"])
    result = evaluate(backend, data, EvalSettings(category_field="subject"), options=QUIET)
    prompts = backend.batches[0][2]
    assert prompts[1] == (
        "Which is bigger?\nA. left\nB. right\nC. same\nAnswer with the option's letter from the given choices directly."
    )
    assert backend.batches[0][1] == [1, 2, 1]  # the two-image question gets both images
    assert [p.parsed for p in result.predictions] == ["B", "A", "B"]
    assert result.metrics.accuracy == pytest.approx(2 / 3)
    assert result.metrics.per_category == {
        "art": {"n": 1, "accuracy": 1.0},
        "math": {"n": 2, "accuracy": 0.5},
    }


def test_bad_arguments_are_clear_errors(tmp_path):
    data = read_counting_imagefolder(write_imagefolder(tmp_path, [1]))
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
        evaluate(ScriptedBackend([]), data, options=SweepOptions(batch_size=0))
    with pytest.raises(ValueError, match="unknown answer parser"):
        evaluate(ScriptedBackend([]), data, EvalSettings(parser="regex"))


def test_tiny_hf_model_end_to_end(tmp_path, tiny_hf):
    model, processor = tiny_hf
    data = read_counting_imagefolder(write_imagefolder(tmp_path / "data", [1, 2, 3, 4, 5]))
    result = evaluate(HFBackend(model, processor), data, EvalSettings(max_new_tokens=3),
                      options=SweepOptions(batch_size=3, progress=False))
    assert processor.tokenizer.padding_side == "right"  # restored after left-padded generation
    assert [p.id for p in result.predictions] == [e.id for e in data.examples]
    assert all(isinstance(p.output, str) for p in result.predictions)
    paths = write_report(result, tmp_path / "out", model_name="tiny-random")
    saved = load_predictions(paths["predictions"])
    recomputed = counting_metrics([p.parsed for p in saved], [p.target for p in saved])
    report = json.loads(paths["json"].read_text())
    assert report["metrics"]["accuracy"] == pytest.approx(recomputed.accuracy)
    assert report["metrics"]["n"] == 5 == sum(map(sum, report["confusion_matrix"]["matrix"]))
    assert report["metrics"]["n_unparsed"] == sum(p.parsed is None for p in saved)


def test_batching_does_not_change_greedy_answers(tmp_path, tiny_hf):
    model, processor = tiny_hf
    data = read_counting_imagefolder(write_imagefolder(tmp_path, [1, 2, 3]))
    short = EvalSettings(max_new_tokens=3)
    one = evaluate(HFBackend(model, processor), data, short, options=SweepOptions(batch_size=1, progress=False))
    three = evaluate(HFBackend(model, processor), data, short, options=SweepOptions(batch_size=3, progress=False))
    assert [p.output for p in one.predictions] == [p.output for p in three.predictions]


def test_cli_eval(tmp_path, tiny_hf, monkeypatch, capsys):
    from vlens import cli
    from vlens.cli import eval as eval_cli

    model, processor = tiny_hf
    loaded = {}

    def fake_load_backend(args):
        loaded.update(model=args.model, backend=args.backend)
        return HFBackend(model, processor)

    monkeypatch.setattr(eval_cli, "load_backend", fake_load_backend)
    # "some/dir" stands for a hub id: no hub is asked whether it is there (vlens.core.hub)
    monkeypatch.setattr("vlens.zoo.specs.check_spec", lambda spec: ("hub", spec))
    write_imagefolder(tmp_path / "data", [2, 3])
    argv = ["eval", "--model", "some/dir", "--backend", "hf", "--data", str(tmp_path / "data")]
    argv += [
        "--format",
        "imagefolder",
        "--out",
        str(tmp_path / "out"),
        "--max-new-tokens",
        "2",
        "--quiet",
    ]
    assert cli.main(argv) == 0
    assert loaded == {"model": "some/dir", "backend": "hf"}
    assert "imagefolder: n=2" in capsys.readouterr().out
    assert json.loads((tmp_path / "out" / "results.json").read_text())["model"] == "some/dir"
    assert cli.main(argv + ["--image-column", "path", "--overwrite"]) == 2
    assert "vlens eval: error: image_column (--image-column) do(es) not apply to the imagefolder format" in \
        capsys.readouterr().err
    # without --format the format is detected from the data
    detected = argv[: argv.index("--format")] + argv[argv.index("--format") + 2 :]
    assert cli.main(detected + ["--overwrite"]) == 0
    assert "imagefolder: n=2" in capsys.readouterr().out


def test_hooked_backend_matches_hf_and_keeps_hooks_on(tmp_path, tiny_hf):
    model, processor = tiny_hf
    hooked = tiny_vlm("qwen2_5_vl")  # the same cached pair: parameters shared with `model`
    data = read_counting_imagefolder(write_imagefolder(tmp_path, [1, 2, 3]))
    kwargs = {"settings": EvalSettings(max_new_tokens=3), "options": SweepOptions(batch_size=2, progress=False)}
    plain = evaluate(HFBackend(model, processor), data, **kwargs)
    through_hooks = evaluate(HookedVLMBackend(hooked), data, **kwargs)
    assert [p.output for p in through_hooks.predictions] == [p.output for p in plain.predictions]

    calls = []

    def silence_final_residual(resid, hook):
        calls.append(resid.shape[1])
        return torch.zeros_like(resid)

    last = f"blocks.{hooked.cfg.n_layers - 1}.hook_resid_post"
    ablated = evaluate(HookedVLMBackend(hooked, fwd_hooks=[(last, silence_final_residual)]), data, **kwargs)
    # zero residual -> all-zero logits -> token 0 (a special token, decoded as ""): every answer empty
    assert [p.output for p in ablated.predictions] == ["", "", ""]
    assert ablated.metrics.n_unparsed == 3 and len(calls) >= 2  # the prompt pass of both batches at least


def test_embedded_model_end_to_end(tmp_path):
    import vlens.zoo
    from vlens import cli
    from vlens.data import render_syndot
    from vlens.data import write_imagefolder as write_vlens_imagefolder

    vlens.zoo.model_path()  # the weights ship with the package: a missing file is an error here
    samples = [
        render_syndot(count=count, seed=seed, size=168) for seed, count in enumerate([1, 2, 3, 4, 2, 3])
    ]
    data_dir = write_vlens_imagefolder(samples, tmp_path / "syndot")
    argv = ["eval", "--model", "tiny", "--data", str(data_dir), "--format", "imagefolder"]
    assert cli.main(argv + ["--out", str(tmp_path / "out"), "--max-new-tokens", "4", "--quiet"]) == 0
    report = json.loads((tmp_path / "out" / "results.json").read_text())
    saved = load_predictions(tmp_path / "out" / "predictions.jsonl")
    assert report["n_evaluated"] == len(saved) == 6
    assert [p.target for p in saved] == [1, 2, 3, 4, 2, 3]
    recomputed = counting_metrics([p.parsed for p in saved], [p.target for p in saved])
    assert report["metrics"]["accuracy"] == pytest.approx(recomputed.accuracy)
    assert report["metrics"]["accuracy"] >= 0.5  # a trained counter, on its own training distribution


def test_cli_loads_a_saved_checkpoint_with_either_backend(tmp_path, tiny_hf):
    from vlens import cli

    model, processor = tiny_hf
    checkpoint = tmp_path / "checkpoint"
    model.save_pretrained(checkpoint)
    processor.save_pretrained(str(checkpoint))
    write_imagefolder(tmp_path / "data", [1, 2, 3])
    outputs = {}
    for backend in ("hooked", "hf"):
        argv = ["eval", "--model", str(checkpoint), "--backend", backend, "--data", str(tmp_path / "data")]
        argv += ["--format", "imagefolder", "--out", str(tmp_path / backend), "--max-new-tokens", "3"]
        assert cli.main(argv + ["--batch-size", "2", "--quiet"]) == 0
        saved = load_predictions(tmp_path / backend / "predictions.jsonl")
        report = json.loads((tmp_path / backend / "results.json").read_text())
        assert report["settings"]["backend"] == backend and report["n_evaluated"] == 3
        outputs[backend] = [p.output for p in saved]
    assert outputs["hooked"] == outputs["hf"]  # HookedVLM generates exactly what HF does


def test_undecodable_image_is_skipped_by_name_and_the_rest_scored(tmp_path):
    write_imagefolder(tmp_path / "data", [1, 2, 3])
    (tmp_path / "data" / "img_001.png").write_bytes(b"not a png")
    result = evaluate(ScriptedBackend(["1", "3"]), read_counting_imagefolder(tmp_path / "data"), options=QUIET)
    assert [p.id for p in result.predictions] == ["img_000.png", "img_002.png"]
    assert len(result.skipped) == 1 and "img_001.png cannot be decoded" in result.skipped[0].reason
    paths = write_report(result, tmp_path / "out")
    assert "img_001.png" in paths["markdown"].read_text()


def test_post_prompt_follows_the_model(tmp_path):
    import vlens
    from tests.helpers.eval_data import pixmo_rows, write_jsonl
    from vlens.evaluation import read_pixmo

    rows = pixmo_rows(tmp_path, [2])
    data = read_pixmo(write_jsonl(tmp_path / "p.jsonl", rows), image_dir=tmp_path / "images")
    scripted = ScriptedBackend(["2", "2", "2"])
    real = evaluate(scripted, data, options=QUIET)  # not the embedded model: lmms-eval's instruction
    assert scripted.batches[-1][2][0].endswith("\nAnswer with a single number.")
    assert "lmms-eval" in real.settings["post_prompt_source"]
    scripted.model = vlens.load()  # a backend holding the embedded model: the bare question
    embedded = evaluate(scripted, data, options=QUIET)
    assert scripted.batches[-1][2][0] == "How many boats are there?" and embedded.settings["post_prompt"] == ""
    assert "embedded" in embedded.settings["post_prompt_source"]
    given = evaluate(scripted, data, EvalSettings(post_prompt=" Count."), options=QUIET)
    assert scripted.batches[-1][2][0].endswith("? Count.") and given.settings["post_prompt_source"] == "given"
