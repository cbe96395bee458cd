"""docs/verified-models.md's table, generated from the verified-models rows in docs/verified/*.json.

    python -m tools.verified_models            # rewrite the table from the rows
    python -m tools.verified_models --check    # exit 1 when the committed table is not what the rows give

A row is the ``verified.json`` that ``vlens verify MODEL --out DIR`` writes (its format:
docs/verified-models.md); add one by copying it to docs/verified/<name>.json and running this.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROWS = ROOT / "docs" / "verified"
PAGE = ROOT / "docs" / "verified-models.md"
BEGIN, END = "<!-- verified-models table: begin (python -m tools.verified_models) -->", \
    "<!-- verified-models table: end -->"
COLUMNS = ("model", "family", "dtype", "device", "transformers", "logits_max_rel", "top1_agreement",
           "generate_identical", "hooks_checked", "video_checked", "time_ratio", "memory_ratio", "passed", "date")


def read_rows(folder: Path = ROWS) -> list[dict]:
    """Every row, sorted by model then dtype."""
    rows = [json.loads(path.read_text(encoding="utf-8")) for path in sorted(folder.glob("*.json"))]
    return sorted(rows, key=lambda r: (str(r.get("model")), str(r.get("dtype")), str(r.get("device"))))


def cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.2g}" if value < 0.01 else f"{value:.3g}"
    return str(value).replace("|", "\\|")


def render(rows: list[dict]) -> str:
    """The Markdown table of `rows` (a failed row names its failed checks in the last column)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        values = [cell(row.get(column)) for column in COLUMNS]
        if not row.get("passed"):
            values[COLUMNS.index("passed")] = "no: " + ", ".join(row.get("failed") or [])
        lines.append("| " + " | ".join(values) + " |")
    return "\n".join(lines)


def page_with_table(page: str, table: str) -> str:
    """`page` with the text between the markers replaced by `table`."""
    start, end = page.index(BEGIN) + len(BEGIN), page.index(END)
    return page[:start] + "\n" + table + "\n" + page[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare the committed table with the rows")
    args = parser.parse_args(argv)
    page = PAGE.read_text(encoding="utf-8")
    wanted = page_with_table(page, render(read_rows()))
    if args.check:
        if wanted != page:
            sys.stderr.write(f"{PAGE} is not what docs/verified/*.json give: run python -m tools.verified_models\n")
            return 1
        return 0
    PAGE.write_text(wanted, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
