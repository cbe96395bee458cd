"""Write docs/verified/tiny-<family>.json: `vlens verify`'s row for every family's tiny random model
(CPU, fp32), then rewrite docs/verified-models.md's table (tools/verified_models.py).

    python benchmarks/verify_tiny_rows.py                     # every family
    python benchmarks/verify_tiny_rows.py lfm2_vl molmo2      # these families' rows only
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers.models import FAMILIES, tiny_vlm  # noqa: E402
from tools import verified_models  # noqa: E402
from vlens.verify import verify_model  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    torch.set_num_threads(1)
    chosen = list(sys.argv[1:] if argv is None else argv) or list(FAMILIES)
    unknown = [f for f in chosen if f not in FAMILIES]
    if unknown:
        sys.stderr.write(f"unknown families {unknown}: choose from {list(FAMILIES)}\n")
        return 2
    failed = []
    for family in chosen:
        result = verify_model(tiny_vlm(family), f"tiny {family}", progress=False)
        row = result.row()
        (verified_models.ROWS / f"tiny-{family}.json").write_text(json.dumps(row, indent=1) + "\n", encoding="utf-8")
        if not result.passed:
            failed.append(family)
    verified_models.main([])
    if failed:
        sys.stderr.write(f"failed: {failed}\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
