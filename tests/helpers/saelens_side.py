"""The SAELens side of the interop check, run by the sae-lens environment's python (never imports vlens).

    python tests/helpers/saelens_side.py WORKDIR

For each architecture in WORKDIR/inputs.json: loads WORKDIR/vlens_<arch> with
``sae_lens.SAE.load_from_disk`` and writes its feature activations of WORKDIR/x.safetensors to
WORKDIR/saelens_acts_<arch>.safetensors; builds a random SAE of that architecture with SAELens,
saves it to WORKDIR/saelens_<arch> with ``save_model`` and writes its activations and
reconstruction to WORKDIR/saelens_own_<arch>.safetensors.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def main(workdir: Path) -> None:
    from sae_lens import (
        SAE,
        JumpReLUSAE,
        JumpReLUSAEConfig,
        StandardSAE,
        StandardSAEConfig,
        TopKSAE,
        TopKSAEConfig,
    )

    spec = json.loads((workdir / "inputs.json").read_text())
    x = load_file(str(workdir / "x.safetensors"))["x"]
    d_in, d_sae = x.shape[-1], spec["d_sae"]
    builders = {
        "standard": lambda: StandardSAE(StandardSAEConfig(d_in=d_in, d_sae=d_sae)),
        "topk": lambda: TopKSAE(TopKSAEConfig(d_in=d_in, d_sae=d_sae, k=spec["k"])),
        "jumprelu": lambda: JumpReLUSAE(JumpReLUSAEConfig(d_in=d_in, d_sae=d_sae)),
    }
    report = {}
    for arch in spec["architectures"]:
        loaded = SAE.load_from_disk(str(workdir / f"vlens_{arch}"))
        report[arch] = {"class": type(loaded).__name__, "hook_name": loaded.cfg.metadata.hook_name}
        with torch.no_grad():
            save_file({"acts": loaded.encode(x).contiguous(), "recon": loaded(x).contiguous()},
                      str(workdir / f"saelens_acts_{arch}.safetensors"))
        torch.manual_seed(spec["seed"])
        own = builders[arch]()
        with torch.no_grad():
            for param in own.parameters():
                param.copy_(torch.randn_like(param) * 0.3)
            if arch == "jumprelu":
                own.threshold.copy_(torch.rand_like(own.threshold) * 0.2)
        own.cfg.metadata.hook_name = spec["hook_name"]
        own.save_model(str(workdir / f"saelens_{arch}"))
        with torch.no_grad():
            save_file({"acts": own.encode(x).contiguous(), "recon": own(x).contiguous()},
                      str(workdir / f"saelens_own_{arch}.safetensors"))
    import sae_lens

    report["sae_lens_version"] = sae_lens.__version__
    (workdir / "saelens_report.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
