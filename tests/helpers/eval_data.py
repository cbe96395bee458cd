"""Small local fixtures in every evaluation format (written into a pytest tmp_path)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from PIL import Image


def write_png(path: Path, shade: int) -> bytes:
    """A 32x32 grey PNG at ``path``; returns its bytes (for sha256 names)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (32, 32), (shade, shade, shade)).save(path)
    return path.read_bytes()


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_imagefolder(folder: Path, counts: list[int]) -> Path:
    """A vlens imagefolder: one PNG per count and metadata.jsonl with the documented fields."""
    rows = []
    for i, count in enumerate(counts):
        name = f"img_{i:03d}.png"
        write_png(folder / name, 20 * i)
        rows.append(
            {
                "file_name": name,
                "count": count,
                "question": "How many dots are there? Answer with a number.",
                "answer": str(count),
                "objects": [{"center": [5, 5], "shape": "dot"}] * count,
                "seed": i,
                "task": "count_dots",
            }
        )
    write_jsonl(folder / "metadata.jsonl", rows)
    return folder


def pixmo_rows(folder: Path, counts: list[int]) -> list[dict]:
    """PixMo-Count rows whose images are saved in ``folder/images`` named ``<sha256>.png``."""
    rows = []
    for i, count in enumerate(counts):
        staging = folder / "staging.png"
        sha = hashlib.sha256(write_png(staging, 30 + 10 * i)).hexdigest()
        (folder / "images").mkdir(exist_ok=True)
        staging.rename(folder / "images" / f"{sha}.png")
        rows.append(
            {
                "image_url": f"https://example.com/{i}.png",
                "image_sha256": sha,
                "count": count,
                "points": [{"x": 1.0, "y": 2.0}] * count,
                "label": "boats",
            }
        )
    return rows


def write_countbenchqa(folder: Path, numbers: list[int]) -> Path:
    rows = []
    for i, number in enumerate(numbers):
        write_png(folder / "cb" / f"{i}.png", 40 + i)
        rows.append({"image": f"cb/{i}.png", "question": "How many cats are in the image?", "number": number})
    return write_jsonl(folder / "countbenchqa.jsonl", rows)


def write_mcq(folder: Path) -> Path:
    write_png(folder / "q0.png", 10)
    write_png(folder / "q1a.png", 20)
    write_png(folder / "q1b.png", 30)
    rows = [
        {"id": "q0", "image": "q0.png", "question": "What colour?", "options": ["red", "green"], "answer": "B",
         "subject": "art"},
        {"id": "q1", "images": ["q1a.png", "q1b.png"], "question": "Which is bigger?",
         "options": "['left', 'right', 'same']", "answer": 2, "subject": "math"},
        {"id": "q2", "image": "q0.png", "question": "Shape?", "options": {"A": "dot", "B": "square"},
         "answer": "square", "subject": "math"},
    ]  # fmt: skip
    return write_jsonl(folder / "mcq.jsonl", rows)
