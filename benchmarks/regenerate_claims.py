"""Rewrite the README's paragraph about the embedded model from its evaluation.json.

    python benchmarks/regenerate_claims.py          # write README.md
    python benchmarks/regenerate_claims.py --check  # exit 1 if README.md is out of date

The text comes from `vlens.recipes.embedded.claims.readme_paragraph`: accuracies with 95%
intervals, each source's share of the training mix, "held out" only for a source absent from
every training stage. tests/recipes/test_claims.py fails while the README disagrees with the
shipped evaluation.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def updated_readme(readme: str, evaluation: dict) -> str:
    from vlens.recipes.embedded.claims import README_SECTION, readme_paragraph
    from vlens.utils.marked_sections import replace_marked_section

    return replace_marked_section(readme, README_SECTION, readme_paragraph(evaluation), append_if_missing=False)


def main() -> int:
    from vlens.zoo import WEIGHTS_FOLDER

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only check, write nothing")
    args = parser.parse_args()
    evaluation = json.loads((WEIGHTS_FOLDER / "evaluation.json").read_text(encoding="utf-8"))
    path = ROOT / "README.md"
    current = path.read_text(encoding="utf-8")
    new = updated_readme(current, evaluation)
    if args.check:
        if new != current:
            print("README.md's embedded-model paragraph is out of date: run python benchmarks/regenerate_claims.py",
                  file=sys.stderr)
            return 1
        return 0
    path.write_text(new, encoding="utf-8")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
