"""Writes tests/unit/saved_results/<kind>/results.json (with the files its reader needs beside it): one real saved file of each result kind, made by the
commands (and a few library calls) on the random tiny model, for the tampering tests of `vlens.load_result`
(tests/unit/test_load_result_tampered.py); the demo's file is `vlens demo --quick`'s results.json, its provenance
dropped. Run it again when a result's format changes:

    PYTHONPATH=$PWD python tests/helpers/saved_results.py

Each file is the result as written (its provenance dropped: machine paths and times); a nested result
(the edge scores inside a circuit) is written as its own kind.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "unit" / "saved_results"
IMAGE = ["--image-size", "56"]
TINY = ["--model", "random-tiny", *IMAGE, "--quiet"]
EMBEDDED = ["--model", "tiny", *IMAGE, "--quiet"]  # a vocabulary with colour and shape words
IMAGE_FILE = str(ROOT / "tests" / "unit" / "saved_results" / "image.png")  # the prompt image of attribute-generation


SIDE_FILES = ("cfg.json", "transcoder_config.json")  # besides *.safetensors and *.jsonl: what readers need


def _keep(data: dict, folder: Path | None = None) -> None:
    """OUT/<kind>/results.json, and the files of `folder` its reader needs (weights, predictions)."""
    from vlens.utils.finite import json_safe

    data = json_safe({key: value for key, value in data.items() if key != "provenance"})
    target = OUT / data["kind"]
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    (target / "results.json").write_text(json.dumps(data, indent=1) + "\n")
    for file in sorted(folder.iterdir()) if folder is not None else []:
        if file.suffix in (".safetensors", ".jsonl") or file.name in SIDE_FILES:
            shutil.copy(file, target / file.name)
    print("wrote", data["kind"], flush=True)


def _nested(data: Any, top: bool = True, folder: Path | None = None) -> None:
    """`data` and every result nested in it (a dict whose "kind" is a result kind), at any depth."""
    from vlens.utils.results import BUILTIN_KINDS

    if isinstance(data, dict):
        if data.get("kind") in BUILTIN_KINDS and (top or not (OUT / data["kind"]).exists()):
            _keep(data, folder if top else None)
        for value in data.values():
            _nested(value, top=False)
    elif isinstance(data, list):
        for value in data[:3]:
            _nested(value, top=False)


def _command(argv: list[str], out: Path, name: str = "results.json") -> None:
    from vlens.cli import main

    try:
        code = main([*argv, "--out", str(out)])
    except SystemExit as exit_:
        code = exit_.code
    if code not in (0, 3):
        print("FAILED", argv, code, flush=True)
        return
    for file in [out / name, *sorted(out.glob("*.json"))]:
        if file.is_file():
            data = json.loads(file.read_text())
            if isinstance(data, dict) and isinstance(data.get("kind"), str):
                _nested(data, folder=out)


def _library(tmp: Path) -> None:
    """Kinds no command writes on its own: exact path patching, a routing table, a feature intervention."""
    import vlens
    from vlens.circuits import path_patch
    from vlens.patching import make_count_pairs

    model = vlens.load_model("random-tiny", image_size=56)
    pairs = make_count_pairs(2, seed=0, size=56)
    _keep(path_patch(model, pairs, ["MLP0->logits", ["MLP0->logits", "MLP1->logits"]]).to_dict())
    sys.path.insert(0, str(ROOT))
    from tests.helpers.models import tiny_vlm
    from vlens.lens.head_scores import compute_head_scores
    from vlens.lens.headlens import HeadLens
    from vlens.routing import routing_statistics

    lens = HeadLens(model)
    prompt = model.prepare(images=[random_image_of(0)], prompts=["How many dots are there?"])
    _keep(lens.run(prompt, k=3).to_dict())
    samples = [(random_image_of(i), "How many dots are there?", {"count": 3}) for i in range(2)]
    _keep(compute_head_scores(model, samples, lens, k=3).to_dict())
    if (tmp / "graph").is_dir() and (tmp / "tc").is_dir():
        from vlens.graphs import ReplacementModel
        from vlens.graphs.interventions import edits_for, intervene
        from vlens.transcoders import load_transcoders

        graph = vlens.load_result(tmp / "graph")
        feature = next(node["name"] for node in graph.nodes if node["kind"] == "feature")
        replacement = ReplacementModel(model, load_transcoders(tmp / "tc"))
        inputs = model.prepare(prompts=["How many dots are there?"])
        _keep(intervene(replacement, inputs, graph, edits_for(graph, [feature], "zero")).to_dict())
    moe = tiny_vlm("qwen3_vl_moe")
    inputs = moe.prepare(images=[random_image_of(0)], prompts=["How many dots are there?"])
    _keep(routing_statistics(moe, [inputs], progress=False).to_dict())


def random_image_of(seed: int):
    from vlens.testing import random_image

    return random_image(seed=seed)


def main() -> None:
    import torch

    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp())
    from vlens.cli import main as cli

    cli(["data", "syndot", "--n", "3", "--image-size", "56", "--out", str(tmp / "data"), "--quiet"])
    from vlens.testing import random_image

    random_image(seed=0).save(IMAGE_FILE)
    only = set(sys.argv[1:])  # names of steps to run (default all)
    data = str(tmp / "data")
    steps = [
        (["patch", *TINY, "--make-pairs", "2", "--mode", "layer-region"], "patch"),
        (["patch", *TINY, "--make-pairs", "2", "--mode", "atp"], "atp"),
        (["circuit", *TINY, "--make-pairs", "2", "--ig-steps", "2", "--top-k", "3", "--image-attribution"], "circuit"),
        (["logit-lens", *TINY, "--data", data], "logit-lens"),
        (["headlens", *TINY, "--make", "2", "--lens-make", "2", "--lens-steps", "1", "--k", "3"], "headlens"),
        (["ablate", *TINY, "--tasks", "counting", "--n-examples", "2", "--n-reference", "2", "--top-k", "2"],
         "ablate"),
        (["eval", *TINY, "--data", data, "--limit", "2", "--max-new-tokens", "2"], "eval"),
        (["train", *TINY, "--data", data, "--limit", "2", "--max-steps", "1", "--lora-rank", "2"], "train"),
        (["knockout", *EMBEDDED, "--n", "2", "--window", "1"], "knockout"),
        (["sae", "train", *TINY, "--hook", "blocks.1.hook_resid_post", "--positions", "all", "--make", "4", "--d-sae",
          "16", "--k", "4", "--tokens", "256", "--batch-tokens", "64", "--buffer", "128"], "sae"),
        (["transcoder", "train", *TINY, "--make", "4", "--d-tc", "8", "--tokens", "256", "--batch-tokens", "64",
          "--buffer", "128"], "tc"),
        (["verify", "--model", "random-tiny", "--quiet"], "verify"),
        (["study", "--model", "random-tiny", "--seeds", "0", "--n-train", "1", "--n-eval", "1", "--lora-rank", "2",
          "--top-k-heads", "1", "--quiet"], "study"),
        (["study", "object-tokens", "--model", "tiny", "--image-size", "224", "--quiet", "--n", "2", "--buffer", "0"],
         "study-objects"),
        (["study", "flow", *EMBEDDED, "--n", "2", "--window", "1"], "study-flow"),
        (["attribute-generation", *TINY, "--prompt", "How many dots are there?", "--image", IMAGE_FILE,
          "--max-new-tokens", "2"], "attribute"),
        (["steer", *TINY, "--prompt", "How many dots?", "--positive", "one", "--negative", "two", "--strengths",
          "0,2"], "steer"),
    ]
    for argv, name in steps:
        if only and name not in only:
            continue
        try:
            _command(argv, tmp / name, "sft_result.json" if name == "train" else "results.json")
        except Exception:
            traceback.print_exc()
    follow = [
        (["temperature", "fit", "--result", str(tmp / "ablate"), "--task", "counting", "--top-k", "2"], "fit"),
        (["sae", "evaluate", *TINY, "--sae", str(tmp / "sae"), "--make", "2"], "sae-eval"),
        (["sae", "dashboard", *TINY, "--sae", str(tmp / "sae"), "--make", "2", "--features", "0,1", "--top-k", "2"],
         "sae-dash"),
        (["transcoder", "evaluate", *TINY, "--transcoders", str(tmp / "tc"), "--make", "2"], "tc-eval"),
        (["graph", *TINY, "--transcoders", str(tmp / "tc"), "--prompt", "How many dots are there?", "--target", "3",
          "--max-features", "8"], "graph"),
    ]
    for argv, name in follow:
        if only and name not in only:
            continue
        try:
            _command(argv, tmp / name)
        except Exception:
            traceback.print_exc()
    try:
        _library(tmp)
    except Exception:
        traceback.print_exc()
    try:
        _command(["temperature", "apply", *TINY, "--temps", str(tmp / "fit"), "--data", data, "--limit", "2"],
                 tmp / "apply")
    except Exception:
        traceback.print_exc()
    missing = sorted(set(__import__("vlens.utils.results", fromlist=["BUILTIN_KINDS"]).BUILTIN_KINDS)
                     - {p.name for p in OUT.iterdir() if p.is_dir()})
    print("kinds without a file:", missing)


if __name__ == "__main__":
    sys.exit(main())
