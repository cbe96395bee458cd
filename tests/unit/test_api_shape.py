"""The shape of the public API: no public function takes more than eight parameters (a method's run
settings go in `vlens.SweepOptions`, its own many settings in a frozen dataclass of its own),
except the few listed here with the reason."""

from __future__ import annotations

import ast
from pathlib import Path

MAX_PARAMETERS = 8
ROOT = Path(__file__).resolve().parents[2]

# qualified name -> why it takes more than MAX_PARAMETERS
ALLOWED = {
    "vlens.core.generation.generate": "HF / TransformerLens generate's sampling keywords, spelled as there",
    "vlens.core.model.HookedVLM.generate": "HF / TransformerLens generate's sampling keywords, spelled as there",
    "vlens.core.model.HookedVLM.from_pretrained": "HF from_pretrained's loading keywords (device_map, max_memory, "
                                                  "offload_folder, trust_remote_code, ...), spelled as there",
    "vlens.datasets.readers.read_pixmo": "one keyword per load_dataset option the format takes (the CLI's dataset "
                                         "flags, passed through by name and refused when unknown)",
    "vlens.data.pairs.make_pair": "the scene parameters of one generated pair (all defaulted, recorded per image)",
    "vlens.data.scene.render_with_record": "the scene parameters of one generated image (all defaulted)",
    "vlens.data.tasks.make_task_sample": "the scene parameters of one generated image (all defaulted)",
    "vlens.testing.llava.tiny_llava_config": "one keyword per HF config field the parity tests vary",
    "vlens.testing.qwen.tiny_qwen_config": "one keyword per HF config field the parity tests vary",
    "vlens.testing.qwen.tiny_qwen3_vl_config": "one keyword per HF config field the parity tests vary",
    "vlens.testing.llava_next.tiny_llava_next_config": "one keyword per HF config field the parity tests vary",
    "vlens.testing.llava_next.tiny_llava_onevision_config": "one keyword per HF config field the parity tests vary",
    "vlens.testing.llava_next_video.tiny_llava_next_video_config": "one keyword per HF config field the parity tests vary",
    "vlens.testing.qwen3_5.qwen3_5_text_config": "one keyword per HF config field the parity tests vary",
    "vlens.viz.figures.jaccard_matrix_figure": "a figure's styling keywords",
    "vlens.testing.gemma3.tiny_gemma3_config": "one keyword per HF config field the parity tests vary",
    "vlens.testing.paligemma.tiny_paligemma_config": "one keyword per HF config field the parity tests vary",
    "vlens.testing.mistral3.tiny_mistral3_config": "one keyword per HF config field the parity tests vary",
    "vlens.testing.gemma4.tiny_gemma4_config": "one keyword per HF config field the parity tests vary",
    "vlens.testing.lfm2_vl.tiny_lfm2_vl_config": "one keyword per HF config field the parity tests vary",
    "vlens.testing.molmo2.tiny_molmo2_config": "one keyword per HF config field the parity tests vary",
    "vlens.testing.phi4_multimodal.tiny_phi4_multimodal_config": "one keyword per HF config field the parity tests vary",
    "vlens.viz.figures.layer_head_heatmap": "a figure's styling keywords (plotly's own take dozens)",
    "vlens.viz.image_attention.attention_grid_image": "a figure's styling keywords",
    "vlens.viz.image_attention.attention_tiles_figure": "a figure's styling keywords",
    "vlens.recipes.embedded.loop.run_loop": "the embedded model's training recipe (apart: nothing imports it)",
    "vlens.recipes.embedded.train.train_model": "the embedded model's training recipe (apart)",
    "vlens.recipes.embedded.vision_pretrain.pretrain_vision": "the embedded model's training recipe (apart)",
}


def _visit(body: list, prefix: str, found: dict[str, int]) -> None:
    for node in body:
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            _visit(node.body, f"{prefix}{node.name}.", found)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("_"):
            a = node.args
            names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
            found[f"{prefix}{node.name}"] = len(names)


def public_functions() -> dict[str, int]:
    """Qualified name -> parameter count (self / cls, *args and **kwargs not counted) of every
    public function and method in public modules."""
    found: dict[str, int] = {}
    for path in sorted((ROOT / "vlens").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if any(p.startswith("_") and p not in ("__init__", "__main__") for p in parts):
            continue
        module = ".".join(p for p in parts if p != "__init__")
        _visit(ast.parse(path.read_text(encoding="utf-8")).body, f"{module}.", found)
    return found


def test_no_public_function_takes_more_than_eight_parameters():
    functions = public_functions()
    assert len(functions) > 500  # the walk found the package
    too_many = {name: n for name, n in functions.items() if n > MAX_PARAMETERS and name not in ALLOWED}
    assert not too_many, f"more than {MAX_PARAMETERS} parameters (group them in an options or settings dataclass): " \
                         f"{too_many}"
    stale = sorted(name for name in ALLOWED if functions.get(name, 0) <= MAX_PARAMETERS)
    assert not stale, f"no longer over the limit (drop them from ALLOWED): {stale}"


def test_every_sweep_takes_the_one_options_object():
    import inspect

    from vlens.ablation import collect_reference, cross_task_ablation, head_ablation_sweep
    from vlens.circuits import (
        edge_attribution,
        extract_circuit,
        image_attribution,
        path_patch,
        run_conditions,
    )
    from vlens.evaluation import evaluate
    from vlens.lens.corpus import collect_residuals
    from vlens.lens.head_scores import compute_head_scores
    from vlens.lens.logit_lens import logit_lens, logit_lens_records
    from vlens.patching import (
        attribution_patching,
        patch_layer_head,
        patch_layer_position,
        patch_layer_region,
        run_fast,
        run_naive,
        run_specs,
    )
    from vlens.studies.ablation import ablation_study

    run_keywords = {"progress", "sharding", "max_batch", "pair_batch_size", "heads_per_pass", "readout", "batch_size"}
    for fn in (patch_layer_region, patch_layer_position, patch_layer_head, attribution_patching, run_specs, run_fast,
               run_naive, cross_task_ablation, head_ablation_sweep, collect_reference, ablation_study,
               logit_lens, logit_lens_records, compute_head_scores, collect_residuals, evaluate, edge_attribution,
               path_patch, run_conditions, extract_circuit, image_attribution):
        parameters = inspect.signature(fn).parameters
        assert "options" in parameters, fn.__name__
        assert not run_keywords & set(parameters), f"{fn.__name__} re-declares {run_keywords & set(parameters)}"
