"""SAELens itself reads what vlens writes and vlens reads what SAELens writes (slow: needs sae-lens).

The SAELens side runs in the interpreter of an environment with sae-lens (vlens and sae-lens share one:
transformer-lens 3.9): ``$VLENS_SAELENS_PYTHON`` or ``.saelens-venv/bin/python`` (docs/sae.md, "Checking
against SAELens", says how to make one; .ci/run makes it). Exchanged through files only.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.helpers.models import tiny_vlm
from vlens.sae import build_sae, load_sae, make_config, save_sae

ROOT = Path(__file__).resolve().parents[2]
PYTHON = Path(os.environ.get("VLENS_SAELENS_PYTHON", ROOT / ".saelens-venv" / "bin" / "python"))
ARCHS = {"standard": {}, "topk": {"k": 3}, "jumprelu": {}}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def exchanged(tmp_path_factory):
    if not PYTHON.exists():
        pytest.skip(f"no sae-lens environment at {PYTHON} (set VLENS_SAELENS_PYTHON)")
    work = tmp_path_factory.mktemp("saelens")
    model = tiny_vlm("qwen2_5_vl")
    hook = "blocks.1.hook_resid_post"
    x = torch.randn(7, model.cfg.d_model, generator=torch.Generator().manual_seed(0))
    save_file({"x": x}, str(work / "x.safetensors"))
    (work / "inputs.json").write_text(json.dumps({"architectures": list(ARCHS), "d_sae": 32, "k": 3, "seed": 0,
                                                  "hook_name": hook}))
    ours = {}
    for arch, extra in ARCHS.items():
        sae = build_sae(make_config(arch, d_in=model.cfg.d_model, d_sae=32, hook_name=hook, **extra))
        sae.initialize(torch.Generator().manual_seed(1), decoder_norm=1.0)
        with torch.no_grad():
            sae.b_enc.normal_(0, 0.3, generator=torch.Generator().manual_seed(2))
            if arch == "jumprelu":
                sae.threshold.uniform_(0, 0.3, generator=torch.Generator().manual_seed(3))
        save_sae(sae, work / f"vlens_{arch}")
        ours[arch] = sae
    run = subprocess.run([str(PYTHON), str(ROOT / "tests/helpers/saelens_side.py"), str(work)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return work, x, ours, model


@pytest.mark.parametrize("arch", list(ARCHS))
def test_saelens_loads_vlens_folders_with_equal_activations(exchanged, arch):
    work, x, ours, _ = exchanged
    report = json.loads((work / "saelens_report.json").read_text())
    assert report[arch]["hook_name"] == "blocks.1.hook_resid_post"
    theirs = load_file(str(work / f"saelens_acts_{arch}.safetensors"))
    with torch.no_grad():
        assert torch.allclose(ours[arch].encode(x), theirs["acts"], atol=1e-6)
        assert torch.allclose(ours[arch](x), theirs["recon"], atol=1e-6)
        assert bool((theirs["acts"] > 0).any())


@pytest.mark.parametrize("arch", list(ARCHS))
def test_vlens_loads_saelens_folders_and_splices_them(exchanged, arch):
    work, x, _, model = exchanged
    theirs = load_file(str(work / f"saelens_own_{arch}.safetensors"))
    sae = load_sae(work / f"saelens_{arch}")
    assert sae.cfg.architecture == arch and sae.cfg.hook_name == "blocks.1.hook_resid_post"
    with torch.no_grad():
        assert torch.allclose(sae.encode(x), theirs["acts"], atol=1e-6)
        assert torch.allclose(sae(x), theirs["recon"], atol=1e-6)
    inputs = model.prepare(prompts=["a b c"])
    clean = model(inputs)
    spliced, cache = model.run_with_cache(inputs, saes={sae.cfg.hook_name: sae}, use_error_term=True)
    assert torch.allclose(spliced, clean, atol=1e-4)
    assert cache[f"{sae.cfg.hook_name}.hook_sae_acts_post"].shape[-1] == 32
