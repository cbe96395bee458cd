"""The README's quick tour runs as written, on the embedded model."""

from __future__ import annotations

import re
from pathlib import Path

from tests.helpers.results import without_provenance
from vlens.zoo.image_sizes import CELL, embedded_image_size

README = Path(__file__).resolve().parents[2] / "README.md"
GRID = embedded_image_size() // CELL  # rows (= columns) of the embedded model's image tokens


def readme_block(containing: str) -> str:
    """The README's python code block that mentions `containing`."""
    return next(b for b in re.findall(r"```python\n(.*?)```", README.read_text(), re.S) if containing in b)


def dots_prompt(model):
    """One generated dots image (3 dots) with the counting question, prepared for `model`."""
    from vlens.data import make_pair

    image = make_pair(n_clean=3, n_corrupt=5, seed=0, size=embedded_image_size()).clean_image
    return model.prepare(images=[image], prompts=["How many dots are there?"])


def test_readme_quickstart_is_short_and_runs(capsys):
    """The first code block, at the top of the README: at most 15 lines, and what it prints holds."""
    section = README.read_text().split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    assert block == re.findall(r"```python\n(.*?)```", README.read_text(), re.S)[0]
    assert len(block.strip().splitlines()) <= 15
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    out = capsys.readouterr().out
    assert "['3']" in out and "attention from the last token to the image" in out
    model, inputs, corrupt = namespace["model"], namespace["inputs"], namespace["corrupt"]
    assert namespace["on_image"].shape == (model.cfg.n_heads,)
    assert float(model.answer_logit_diff(inputs, "3", "5")[0]) > 0 > float(model.answer_logit_diff(corrupt, "3", "5")[0])
    assert all(not hp.fwd_hooks for hp in model.hook_dict.values())


def test_readme_quick_tour_runs():
    section = README.read_text().split("## Quick tour", 1)[1]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert blocks, "README's quick tour has no python code block"
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    model, inputs = namespace["model"], namespace["inputs"]
    assert namespace["patched"].shape == (1, inputs.seq_len, model.cfg.d_vocab)
    assert inputs.regions.image_grid[0] == [(GRID, GRID)]
    assert all(not hp.fwd_hooks for hp in model.hook_dict.values())


def test_readme_transformer_lens_section_runs_and_adds_up():
    section = README.read_text().split("## Coming from TransformerLens", 1)[1]
    block = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    model, logits, attrs = namespace["model"], namespace["logits"], namespace["attrs"]
    three, five = model.to_single_token("3"), model.to_single_token("5")
    logit_diff = logits[0, -1, three] - logits[0, -1, five]
    assert abs(float(attrs.sum(0)[0] - logit_diff)) <= 1e-4 * abs(float(logit_diff))
    assert namespace["heads"].shape == (model.cfg.n_layers, model.cfg.n_heads)
    assert namespace["loss"].ndim == 0 and "blocks.0.hook_resid_pre_grad" in namespace["grad_cache"].cache_dict
    assert all(not hp.fwd_hooks and not hp.bwd_hooks for hp in model.hook_dict.values())


def test_readme_transformer_lens_tools_run(capsys):
    section = README.read_text().split("## Coming from TransformerLens", 1)[1]
    block = next(b for b in re.findall(r"```python\n(.*?)```", section, re.S) if "SVDInterpreter" in b)
    import vlens

    model = vlens.load()
    namespace: dict = {"model": model}
    exec(compile(block, "README.md", "exec"), namespace)
    assert "Ranks of the answer tokens" in capsys.readouterr().out
    scores = model.all_composition_scores("Q")
    assert scores.shape == (model.cfg.n_layers, model.cfg.n_heads) * 2
    assert all(not hp.fwd_hooks for hp in model.hook_dict.values())


def test_readme_attention_page_snippet_runs(tmp_path, monkeypatch):
    block = readme_block("vlens.viz.attention_patterns")
    import vlens

    model = vlens.load()
    inputs = dots_prompt(model)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"model": model, "inputs": inputs}
    exec(compile(block, "README.md", "exec"), namespace)
    page = (tmp_path / "attention-L2.html").read_text(encoding="utf-8")
    assert "img0[r5,c5]" in page and (tmp_path / "attention-L2-big.html").exists()
    assert "img0[r0,c0]" in namespace["labels"]


def test_readme_multi_token_answers_snippet_runs():
    block = readme_block('answer_logit_diff(inputs, "12", "13")')
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    model, inputs, diff = namespace["model"], namespace["inputs"], namespace["diff"]
    first = model.answer_logit_diff(inputs, "12", "13", mode="first_token")
    assert abs(float(first[0]) - float(diff)) <= 1e-4


def test_readme_circuits_snippet_runs():
    block = readme_block("vlens.circuits")
    namespace: dict = {"model": __import__("vlens").load()}
    exec(compile(block, "README.md", "exec"), namespace)
    circuit, exact = namespace["circuit"], namespace["exact"]
    assert circuit.faithfulness >= 0.9 and len(exact.effects) == 10
    assert namespace["figure"].layout.images  # the picture under the image-region nodes


def test_readme_sae_snippet_runs(tmp_path, monkeypatch):
    block = readme_block("run_with_saes")
    import torch

    import vlens

    model = vlens.load()
    inputs = dots_prompt(model)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"model": model, "inputs": inputs}
    exec(compile(block, "README.md", "exec"), namespace)
    assert namespace["acts"].shape == (1, inputs.seq_len, 256)
    assert torch.equal(namespace["same"].W_dec, namespace["sae"].W_dec)
    assert (tmp_path / "sae_folder" / "cfg.json").is_file()
    assert all(not hp.fwd_hooks for hp in model.hook_dict.values())


def test_readme_flow_section_runs():
    """The README's knockout / sweep / object-token block, on the quick tour's model and inputs."""
    import torch

    import vlens

    model = vlens.load()
    inputs = dots_prompt(model)
    namespace: dict = {"model": model, "inputs": inputs}
    exec(compile(readme_block("knockout_sweep("), "README.md", "exec"), namespace)
    with torch.no_grad():
        clean = model(inputs)
    assert (namespace["blocked"] - clean).abs().max() > 0
    assert set(namespace["flow"].summary) == {"image->final", "question->final", "object->final"}
    assert set(namespace["ablation"].accuracy) == {"clean", "object", "random", "register"}
    assert all(not hp.fwd_hooks for hp in model.hook_dict.values())
    assert all(not getattr(block.attn, "mask_edits", []) for block in model.blocks)


def test_readme_generation_block_runs(tmp_path, monkeypatch):
    """The generation block (cache, a step hook, steering, per-token attribution), on the tour's model and prompt."""
    import vlens
    from vlens.data import make_pair

    monkeypatch.chdir(tmp_path)  # it saves attr_out/
    model = vlens.load()
    pair = make_pair(n_clean=3, n_corrupt=5, seed=0, size=embedded_image_size())
    namespace: dict = {"model": model, "pair": pair, "inputs": dots_prompt(model)}
    exec(compile(readme_block("attribute_generation("), "README.md", "exec"), namespace)
    attr = namespace["attr"]
    assert attr.region_maps["exact"][0].shape == (attr.n_new, GRID * GRID)
    assert attr.lens_prob.shape == (attr.n_new, model.cfg.n_layers)
    assert without_provenance(vlens.load_result(tmp_path / "attr_out").to_dict()) == attr.to_dict()
    assert all(not hp.fwd_hooks for hp in model.hook_dict.values())


def test_readme_video_block_runs():
    import vlens

    model = vlens.load()
    namespace: dict = {"model": model}
    exec(compile(readme_block("patch_layer_frame("), "README.md", "exec"), namespace)
    assert namespace["label"] == "<img0.f0[r0,c0]>" and len(namespace["first"]) == GRID * GRID
    assert namespace["frames"].cells == ["f0", "f1"] and namespace["frames"].layers == [0, 3]
    assert all(not hp.fwd_hooks for hp in model.hook_dict.values())
