"""vlens and sae-lens in one environment: a vlens forward feeds a SAELens SAE, and back.

    python tools/check_saelens_pair.py

Run by .ci/run in a fresh venv made with ``pip install . sae-lens`` (sae-lens pins transformer-lens < 4,
so pip picks transformer-lens 3.9 there). Checks, on a tiny random Qwen2.5-VL:
- the installed versions (printed) and that vlens imports with that transformer-lens;
- hooks work: a zeroing hook changes the logits and `run_with_cache` holds the hook's activations;
- a SAELens `StandardSAE` encodes and decodes the cached activations, and vlens reads the folder SAELens
  saves (`vlens.sae.load_sae`) with equal features;
- spliced into the model through vlens with its error term, the SAE leaves the logits unchanged.
Exit status 0 when all hold; an assertion names the first that does not.
"""

from __future__ import annotations

import sys
import tempfile
from importlib import metadata
from pathlib import Path


def main() -> int:
    import sae_lens
    import torch

    from vlens.core.model import HookedVLM
    from vlens.sae import load_sae
    from vlens.testing import random_image, tiny_hf_model, tiny_qwen_processor

    print("versions:", {name: metadata.version(name) for name in ("vlens", "sae-lens", "transformer-lens",
                                                                  "transformers", "torch")})
    torch.manual_seed(0)
    model = HookedVLM.from_hf(tiny_hf_model("qwen2_5_vl"), processor=tiny_qwen_processor())
    inputs = model.prepare(images=[random_image(56, 56, 1)], prompts=["How many dots are there?"])
    hook = "blocks.1.hook_resid_post"
    with torch.no_grad():
        clean, cache = model.run_with_cache(inputs, names_filter=hook)
        zeroed = model.run_with_hooks(inputs, fwd_hooks=[(hook, lambda x, hook: x * 0)])
    assert (clean - zeroed).abs().max() > 1e-3, "a zeroing hook did not change the logits"
    acts = cache[hook]
    assert acts.shape == (*inputs.input_ids.shape, model.cfg.d_model), acts.shape

    sae = sae_lens.StandardSAE(sae_lens.StandardSAEConfig(d_in=model.cfg.d_model, d_sae=32))
    with torch.no_grad():
        for param in sae.parameters():
            param.copy_(torch.randn_like(param) * 0.3)
        features = sae.encode(acts)
        recon = sae.decode(features)
    assert features.shape == (*acts.shape[:-1], 32) and bool((features > 0).any()), features.shape
    assert recon.shape == acts.shape

    sae.cfg.metadata.hook_name = hook
    with tempfile.TemporaryDirectory() as folder:
        sae.save_model(str(Path(folder) / "sae"))
        ours = load_sae(Path(folder) / "sae")
    with torch.no_grad():
        torch.testing.assert_close(ours.encode(acts), features, atol=1e-5, rtol=0)
        spliced = model.run_with_cache(inputs, saes={hook: ours}, use_error_term=True)[0]
    torch.testing.assert_close(spliced, clean, atol=1e-4, rtol=0)
    print("vlens + sae-lens: forward, hooks, cache, SAELens SAE on vlens activations, splice: all hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
