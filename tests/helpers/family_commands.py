"""Every `vlens` command on a saved model folder of one family, at the smallest settings.

A family's CLI test saves its tiny random HF model and processor (`save_family_folder`) and calls
`run_every_command` on the folder; each command runs in-process (`vlens.cli.main`) and must exit 0
and write its results. The checks here are what every family shares; a family's own test adds its
family-specific ones on the returned results.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vlens.cli import main


def save_family_folder(hf_model: Any, processor: Any, folder: Path) -> str:
    """`save_pretrained` of the model and its processor into `folder`; returns the folder as a --model spec."""
    folder.mkdir(parents=True, exist_ok=True)
    hf_model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return str(folder)


def counting_folder(root: Path, image_size: int = 56, n: int = 3) -> Path:
    """A tiny SynDot imagefolder (`vlens data syndot`) for the commands that read --data."""
    folder = root / "counting"
    if not (folder / "metadata.jsonl").is_file():
        assert main(["data", "syndot", "--n", str(n), "--image-size", str(image_size), "--out", str(folder),
                     "--quiet"]) == 0
    return folder


def results(folder: Path, name: str = "results.json") -> dict:
    return json.loads((folder / name).read_text())


def check_loads_back(folder: Path, expected: str) -> Any:
    """`vlens.load_result(folder)` gives the typed result (class name `expected`) and its `to_dict()`
    is what the command saved, key for key (the provenance block included)."""
    import vlens
    from vlens.utils.finite import json_safe
    from vlens.utils.results import result_file

    loaded = vlens.load_result(folder)
    assert type(loaded).__name__ == expected, (folder, type(loaded).__name__)
    saved = json.loads(result_file(folder).read_text())
    again = json.loads(json.dumps(json_safe(loaded.to_dict()), allow_nan=False))
    differ = sorted(k for k in set(saved) | set(again) if saved.get(k) != again.get(k))
    assert not differ, (folder, differ)
    assert saved["kind"] == loaded.kind
    if "provenance" in saved and hasattr(loaded, "saved_provenance"):
        assert loaded.saved_provenance == saved["provenance"]
    return loaded


def check_provenance(payload: dict, command: str, model: str | None) -> dict:
    """Every written result says how it was made (vlens.utils.provenance): the command line, vlens,
    torch and transformers versions, seeds, world size, start time, and the model with its weights."""
    record = payload["provenance"]
    assert record["command"] == command and record["command_line"].startswith(f"vlens {command} "), record
    for key in ("vlens_version", "torch_version", "transformers_version", "started_at", "written_at"):
        assert record[key], (command, key)
    assert record["world_size"] == 1 and isinstance(record["seeds"], dict)
    assert "git_commit" in record  # the commit when vlens runs from a checkout (as here), else null
    if model is None:
        assert record["model"] is None, (command, record["model"])
    else:
        loaded = record["model"]
        assert loaded["spec"] == model and loaded["dtype"] and loaded["device"] and loaded["n_parameters"] > 0
        assert len(loaded["weights_digest"]) == 16 and loaded["weights_digest_method"].startswith("sha256")
    return record


def run(argv: Sequence[str]) -> None:
    code = main([*argv, "--quiet"])
    assert code == 0, f"vlens {' '.join(argv)} exited {code}"


def run_every_command(model: str, out: Path, data: Path, image_args: Sequence[str] = ("--image-size", "56"),
                      n_layers: int | None = None, n_heads: int | None = None,
                      export: bool = True, n_heads_total: int | None = None, circuit: bool = True,
                      train: bool = True) -> dict[str, dict]:
    """patch, circuit, logit-lens, lens train, headlens, ablate, eval, train, temperature fit/apply/export
    and info on the model folder `model`; returns each command's results (by command name).

    image_args: the flags that size the images the commands render (and the processor's budget) for
    this family; n_layers / n_heads: the model's, to check the shapes of what the commands wrote (n_heads:
    the widest layer's heads; n_heads_total: every layer's heads together where layers differ, as in a
    hybrid decoder, default n_layers * n_heads);
    export: also `temperature export` (families whose q projection can absorb a head's temperature);
    circuit: `circuit` runs (False: it must refuse the model with exit status 2, as for parallel attention + MLP);
    train: `train` (LoRA) runs (False: it must refuse the model with exit status 2 and write nothing, as for a
    fused qkv projection).
    """
    image = list(image_args)
    done: dict[str, dict] = {}
    run(["info", "--model", model])

    run(["patch", "--model", model, "--make-pairs", "2", *image, "--mode", "layer-head", "--out", str(out / "patch")])
    done["patch"] = results(out / "patch")

    circuit_args = ["circuit", "--model", model, "--make-pairs", "2", *image, "--ig-steps", "2", "--target", "0.5",
                    "--image-nodes", "image", "--exact-check", "4", "--out", str(out / "circuit")]
    if circuit:
        run(circuit_args)
        done["circuit"] = results(out / "circuit")
        assert done["circuit"]["kind"] == "circuit" and done["circuit"]["exact_check"]["n_edges"] == 4
    else:
        assert main([*circuit_args, "--quiet"]) == 2 and not (out / "circuit" / "results.json").exists()

    run(["logit-lens", "--model", model, "--data", str(data), "--out", str(out / "logit-lens")])
    done["logit-lens"] = results(out / "logit-lens")

    run(["lens", "train", "--model", model, "--make", "3", "--steps", "2", *image, "--out", str(out / "lens")])
    assert (out / "lens" / "translators.safetensors").is_file()
    run(["headlens", "--model", model, "--make", "2", "--lens", str(out / "lens"), "--k", "3", *image,
         "--out", str(out / "headlens")])
    done["headlens"] = results(out / "headlens")

    run(["ablate", "--model", model, "--tasks", "counting,counting@synreal", "--n-examples", "2", "--n-reference", "2",
         "--top-k", "2", *image, "--out", str(out / "ablate")])
    done["ablate"] = results(out / "ablate")

    run(["eval", "--model", model, "--data", str(data), "--limit", "2", "--max-new-tokens", "2",
         "--out", str(out / "eval")])
    done["eval"] = results(out / "eval")

    train_args = ["train", "--model", model, "--data", str(data), "--limit", "2", "--max-steps", "1", "--lora-rank",
                  "2", "--out", str(out / "train")]
    if train:
        run(train_args)
        done["train"] = results(out / "train", "sft_result.json")
    else:
        assert main([*train_args, "--quiet"]) == 2 and not (out / "train" / "sft_result.json").exists()

    run(["temperature", "fit", "--result", str(out / "ablate"), "--task", "counting", "--top-k", "2",
         "--out", str(out / "fit")])
    done["temperature fit"] = results(out / "fit")
    run(["temperature", "apply", "--model", model, "--temps", str(out / "fit"), "--data", str(data), "--limit", "2",
         "--max-new-tokens", "2", "--out", str(out / "apply")])
    done["temperature apply"] = results(out / "apply")
    if export:
        run(["temperature", "export", "--model", model, "--temps", str(out / "fit"), "--out", str(out / "export")])
        assert any((out / "export").glob("*.safetensors"))

    # provenance in everything written: results.json, the lens's config.json, the dataset's marker,
    # the exported checkpoint's temperatures, the training result
    data_marker = results(data, ".vlens_dataset.json")
    check_provenance(data_marker, "data syndot", None)
    check_provenance(results(out / "lens", "config.json"), "lens train", model)
    for name, payload in done.items():
        check_provenance(payload, name, None if name == "temperature fit" else model)
    if export:
        # the exported temperatures are the fit's result saved again: they keep the provenance they were made with
        check_provenance(results(out / "export", "vlens_temperature.json"), "temperature fit", None)
    digests = {done[name]["provenance"]["model"]["weights_digest"] for name in ("patch", "logit-lens", "headlens",
                                                                                "ablate", "eval")}
    assert len(digests) == 1  # the same weights, loaded five times
    assert done["patch"]["provenance"]["seeds"] == {"seed": 0}
    if n_layers is not None and n_heads is not None:
        heads = done["headlens"]["heads"]
        assert len(heads) == (n_heads_total or n_layers * n_heads)
        grid = done["patch"].get("patch_effect") or done["patch"].get("overwrite_rate")
        assert grid is not None and len(grid) == n_layers and len(grid[0]) == n_heads
    assert not train or done["train"]["steps"] == 1
    # every folder reads back as its typed result (vlens.load_result), to_dict() equal to what was saved
    for name, expected in (("patch", "PatchingResult"), *([("circuit", "Circuit")] if circuit else []),
                           ("logit-lens", "LogitLensResult"),
                           ("lens", "Translators"), ("headlens", "HeadTaxonomy"), ("ablate", "AblationReport"),
                           ("eval", "EvalResult"), *([("train", "SFTResult")] if train else []),
                           ("fit", "HeadTemperature"),
                           ("apply", "TemperatureComparison"), ("apply/with_temperature", "EvalResult"),
                           *([("export", "HeadTemperature")] if export else [])):
        check_loads_back(out / name, expected)
    return done


def run_expert_commands(model: str, out: Path, image_args: Sequence[str] = ("--image-size", "56")) -> dict[str, dict]:
    """The mixture-of-experts commands on a MoE model folder: routing statistics, expert ablation across
    two tasks, expert patching; returns each one's results."""
    image = list(image_args)
    done: dict[str, dict] = {}
    run(["routing", "--model", model, "--make", "3", *image, "--out", str(out / "routing")])
    done["routing"] = results(out / "routing")
    assert (out / "routing" / "routing.html").is_file()
    run(["ablate", "--model", model, "--unit", "expert", "--tasks", "counting,counting@synreal", "--n-examples", "2",
         "--n-reference", "2", "--top-k", "2", *image, "--out", str(out / "ablate-experts")])
    done["ablate --unit expert"] = results(out / "ablate-experts")
    run(["patch", "--model", model, "--make-pairs", "2", *image, "--mode", "layer-expert", "--region", "image",
         "--out", str(out / "patch-experts")])
    done["patch --mode layer-expert"] = results(out / "patch-experts")
    for name, payload in done.items():
        check_provenance(payload, name.split()[0], model)
    for name, expected in (("routing", "RoutingStatistics"), ("ablate-experts", "AblationReport"),
                           ("patch-experts", "PatchingResult")):
        check_loads_back(out / name, expected)
    return done
