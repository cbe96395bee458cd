"""`vlens transcoder train|evaluate` and `vlens graph` end to end on the random tiny model."""

from __future__ import annotations

import json

import torch

from vlens.cli import graph as graph_cli
from vlens.cli import main
from vlens.graphs import AttributionGraph, attribution
from vlens.testing import random_image
from vlens.transcoders import TrainedTranscoders, TranscoderEvaluation, load_transcoders
from vlens.utils.results import load_result

torch.set_num_threads(1)
COMMON = ["--model", "random-tiny", "--image-size", "56", "--prompts-per-forward", "4", "--quiet"]


def test_train_evaluate_then_graph(tmp_path, capsys):
    tc = tmp_path / "tc"
    assert main(["transcoder", "train", "--make", "8", "--kind", "clt", "--d-tc", "24", "--tokens", "512",
                 "--batch-tokens", "64", "--buffer", "256", "--evaluate", "4", "--out", str(tc), *COMMON]) == 0
    printed = capsys.readouterr().out
    assert "loss recovered" in printed and "layer 0: explained variance" in printed
    trained = load_result(tc)
    assert isinstance(trained, TrainedTranscoders) and trained.transcoders.cfg.kind == "clt"
    assert "evaluation" in trained.metrics
    plt = tmp_path / "plt"
    assert main(["transcoder", "train", "--make", "4", "--layers", "1", "--d-tc", "16", "--tokens", "256",
                 "--batch-tokens", "64", "--buffer", "128", "--saelens", "--out", str(plt), *COMMON]) == 0
    assert (plt / "layer_1" / "cfg.json").is_file() and load_transcoders(plt / "layer_1").cfg.layers == (1,)
    evaluation = tmp_path / "eval"
    assert main(["transcoder", "evaluate", "--transcoders", str(tc), "--make", "3", "--out", str(evaluation),
                 *COMMON]) == 0
    loaded = load_result(evaluation)
    assert isinstance(loaded, TranscoderEvaluation) and loaded.n_prompts == 3
    image = tmp_path / "dots.png"
    random_image(seed=3).save(image)
    graph_out = tmp_path / "graph"
    assert main(["graph", "--model", "random-tiny", "--image-size", "56", "--transcoders", str(tc), "--image", str(image),
                 "--prompt", "How many dots are there?", "--target", "3", "--contrast", "4", "--batch-size", "16",
                 "--image-nodes", "2x2", "--max-features", "6", "--ranking", "direct", "--out", str(graph_out),
                 "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert 'logit["3"-"4"]' in printed and "forward-equivalents" in printed
    for name in ("graph.json", "graph.html", "results.json", "graph-metadata.json"):
        assert (graph_out / name).is_file(), name
    graph = load_result(graph_out)
    assert isinstance(graph, AttributionGraph) and graph.target["token"] == "3"
    assert sum(node["kind"] == "image" for node in graph.nodes) == 4  # 2x2 blocks of the grid
    assert graph.n_features == 6 and graph.settings["ranking"] == "direct" and graph.cost["ranking_updates"] == 0
    assert graph_cli.RANKINGS == attribution.RANKINGS  # the parser's copy (no torch while parsing)
    assert json.loads((graph_out / "graph.json").read_text())["metadata"]["slug"] == "graph"
    # the viewer's cards with dataset examples: top patches and tokens over 3 generated counting prompts
    examples_out = tmp_path / "graph_examples"
    assert main(["graph", "--model", "random-tiny", "--image-size", "56", "--transcoders", str(tc), "--image", str(image),
                 "--prompt", "How many dots are there?", "--target", "3", "--examples", "3", "--examples-top-k", "2",
                 "--max-features", "8", "--out", str(examples_out), "--quiet"]) == 0
    examples = load_result(examples_out).examples
    assert examples["n_prompts"] == 3 and examples["top_k"] == 2 and examples["features"]
    assert all(len(hits["image"]) <= 2 and len(hits["text"]) <= 2 for hits in examples["features"].values())


def test_bad_flags_are_one_line_errors(tmp_path, capsys):
    tc = tmp_path / "missing"
    for argv, expected in [
        (["transcoder", "train", "--make", "2", "--layers", "0,9", "--out", str(tmp_path / "a")], "layers"),
        (["transcoder", "train", "--make", "2", "--layers", "x", "--out", str(tmp_path / "b")], "--layers"),
        (["transcoder", "evaluate", "--transcoders", str(tc), "--make", "2", "--out", str(tmp_path / "c")], "missing"),
        (["graph", "--transcoders", str(tc), "--prompt", "hi", "--target", "3", "--out", str(tmp_path / "d")], "missing"),
        (["graph", "--transcoders", str(tmp_path), "--prompt", "hi", "--target", "3", "--examples-data",
          str(tmp_path / "nowhere"), "--examples", "2", "--out", str(tmp_path / "e")], "nowhere"),
    ]:
        try:
            code = main([*argv, *COMMON[:4]])
        except SystemExit as exit_:  # a value checked while parsing (--layers) exits from argparse
            code = exit_.code
        assert code == 2, argv
        err = capsys.readouterr().err.strip()
        assert expected in err and len(err.splitlines()) == 1, err
