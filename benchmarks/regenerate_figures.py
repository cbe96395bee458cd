"""Regenerate everything a reader sees that depends on the model: one command after new weights.

    python benchmarks/regenerate_figures.py            # all steps (about 10-20 min on 2 CPU cores)
    python benchmarks/regenerate_figures.py --skip-notebooks --skip-cli

Steps (each prints what it wrote):
1. `vlens demo --quick` into OUT/demo; checks the report in headless Chromium (tests/helpers/browser.py:
   console errors, trace types missing from the plotly bundle, ticks between layers, colliding
   titles / bar labels, compared tiles on different colour scales, hidden coinciding lines, tables
   that overflow or leave an abbreviation undefined) and writes one screenshot per section to
   docs/report/<section>.png;
2. the figure files of `vlens patch`, `logit-lens`, `headlens`, `ablate` and `eval` into OUT/cli,
   each checked the same way and screenshot to docs/report/cli-<command>.png;
3. the page sizes of all of them (docs/figures.md quotes them);
4. the demos/ notebooks executed in place with their outputs (benchmarks/run_notebooks.py);
5. the README's embedded-model paragraph from evaluation.json (benchmarks/regenerate_claims.py).

Needs the dev extra, /usr/bin/chromium and kaleido. Exits 1 if any page shows a problem.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.helpers.browser

SHOTS = ROOT / "docs" / "report"
# section anchor -> screenshot name (stable names for the docs)
SECTION_NAMES = {
    "model-summary": "model", "the-paper-s-findings-on-this-model": "findings", "key-numbers-at-a-glance": "key-numbers", "data-generated-counting-images": "data",
    "counting-accuracy-per-count-subitizing-curve": "counting-accuracy",
    "confusion-matrix-of-counting-answers": "confusion-matrix",
    "image-attention-of-every-head-layer-x-head": "attention-share",
    "attention-over-the-image-final-position": "attention-image",
    "vap-overwrite-rate-per-layer-and-region": "vap-layer-region", "vap-layer-x-head-sweep": "vap-layer-head",
    "logit-lens-the-true-count-per-layer": "logit-lens", "headlens-taxonomy-layer-x-head": "headlens",
    "ablation-jaccard-overlap-of-important-heads-across-tasks": "ablation-jaccard",
    "representation-geometry-pca-per-layer": "geometry-pca", "representation-geometry-t-sne-per-layer": "geometry-tsne",
    "interventions-baseline-sft-sft-l-focus-sft-l-focus-beta": "interventions",
    "counting-accuracy-per-count-subitizing-curve-synpoly": "counting-accuracy-synpoly",
    "confusion-matrix-of-counting-answers-synpoly": "confusion-matrix-synpoly",
    "the-counting-circuit-edges-from-image-regions-through-heads-and-mlps-to-the-answer": "circuit",
    "the-counting-circuit-as-an-attribution-graph-transcoder-features-from-image-cells-to-the-count":
        "attribution-graph",
}
PREFIX_NAMES = {"attention-patterns-of-layer-": "attention-circuitsvis"}  # anchors that carry a number


def vlens(*args: str) -> None:
    command = [sys.executable, "-m", "vlens", *args, "--quiet"]
    print("$ vlens " + " ".join(args), file=sys.stderr, flush=True)
    subprocess.run(command, check=True, cwd=ROOT)


def check(path: Path, problems: list[str]) -> None:
    from tests.helpers.browser import inspect_page, page_problems

    found = page_problems(inspect_page(path))
    problems += [f"{path.name}: {p}" for p in found]
    print(f"checked {path} in chromium: {len(found)} problem(s)", file=sys.stderr)


def demo_step(out: Path, problems: list[str]) -> dict[str, int]:
    from tests.helpers.browser import section_screenshots

    vlens("demo", "--quick", "--out", str(out / "demo"), "--overwrite")
    report = out / "demo" / "report.html"
    check(report, problems)
    for path in SHOTS.glob("*.png"):
        if not path.name.startswith("cli-"):
            path.unlink()
    for path in section_screenshots(report, SHOTS, names=SECTION_NAMES):
        for prefix, name in PREFIX_NAMES.items():
            if path.name.startswith(prefix):
                path.rename(SHOTS / f"{name}.png")
    return {"vlens demo --quick: report.html": report.stat().st_size}


def cli_step(out: Path, problems: list[str]) -> dict[str, int]:
    from tests.helpers.browser import screenshot

    cli = out / "cli"
    data = cli / "syndot"
    vlens("data", "syndot", "--n", "40", "--seed", "0", "--out", str(data), "--overwrite")
    runs = {
        "patch": (["patch", "--model", "tiny", "--make-pairs", "24", "--mode", "layer-region"], "figure.html"),
        "logit-lens": (["logit-lens", "--model", "tiny", "--data", str(data)], "logit_lens.html"),
        "headlens": (["headlens", "--model", "tiny", "--data", str(data)], "taxonomy.html"),
        "ablate": (["ablate", "--model", "tiny", "--tasks", "counting,colour,shape", "--top-k", "6",
                    "--n-examples", "24", "--n-reference", "24", "--retest-seed", "1000"], "report.html"),
        "eval": (["eval", "--model", "tiny", "--data", str(data)], "confusion_matrix.html"),
    }
    sizes = {}
    for name, (args, figure) in runs.items():
        folder = cli / name
        vlens(*args, "--out", str(folder), "--overwrite")
        page = folder / figure
        check(page, problems)
        screenshot(page, SHOTS / f"cli-{name}.png", width=1000, height=700 if name != "ablate" else 1400)
        sizes[f"vlens {name}: {figure}"] = page.stat().st_size
    return sizes


def shrink_screenshots() -> int:
    """Screenshots as 256-colour PNGs (text and flat plot colours: about a third of the size, same look),
    with the empty window below the content cut off."""
    from PIL import Image, ImageChops

    total = 0
    for path in sorted(SHOTS.glob("*.png")):
        with Image.open(path) as image:
            if image.mode == "P":  # already shrunk by an earlier run: leave the file as it is
                total += path.stat().st_size
                continue
            rgb = image.convert("RGB")
        background = Image.new("RGB", rgb.size, rgb.getpixel((0, rgb.height - 1)))
        box = ImageChops.difference(rgb, background).getbbox()
        if box is not None and box[3] + 16 < rgb.height:
            rgb = rgb.crop((0, 0, rgb.width, box[3] + 16))
        # max-coverage keeps rare colours (a colour bar's ends); median-cut turned viridis yellow orange
        small = rgb.quantize(colors=256, method=Image.Quantize.MAXCOVERAGE, dither=Image.Dither.NONE)
        small.save(path, optimize=True)
        total += path.stat().st_size
    print(f"docs/report: {total / 1e6:.2f} MB of screenshots", file=sys.stderr)
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(ROOT / "runs" / "regenerate"), help="where the pages are written")
    parser.add_argument("--skip-demo", action="store_true")
    parser.add_argument("--skip-cli", action="store_true")
    parser.add_argument("--skip-notebooks", action="store_true")
    parser.add_argument("--skip-claims", action="store_true")
    args = parser.parse_args()
    from tests.helpers.browser import available

    if not available():
        print("needs /usr/bin/chromium (apt-get install chromium)", file=sys.stderr)
        return 2
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    started, problems, sizes = time.perf_counter(), [], {}
    if not args.skip_demo:
        sizes.update(demo_step(out, problems))
    if not args.skip_cli:
        sizes.update(cli_step(out, problems))
    if not (args.skip_demo and args.skip_cli):
        shrink_screenshots()
    if not args.skip_notebooks:
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run_notebooks.py")], check=True, cwd=ROOT)
    if not args.skip_claims:
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "regenerate_claims.py")], check=True, cwd=ROOT)
    print("\n| page | size |\n|---|---|")
    for name, size in sizes.items():
        print(f"| {name} | {size / 1e6:.2f} MB |")
    (out / "sizes.json").write_text(json.dumps(sizes, indent=1) + "\n")
    print(f"\n{time.perf_counter() - started:.0f} s; {len(problems)} problem(s)", file=sys.stderr)
    for problem in problems:
        print("  " + problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
