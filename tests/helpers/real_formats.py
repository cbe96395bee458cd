"""Small files in the real datasets' formats (PixMo-Count, CountBenchQA, MMMU, imagefolder),
in every container (jsonl, parquet, arrow, save_to_disk), written into a pytest tmp_path.

Images are PNGs of ``n`` black dots on white, so a counting model has something to count.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from PIL import Image, ImageDraw


def dots_png(n: int, size: tuple[int, int] = (64, 48)) -> bytes:
    """PNG bytes of ``n`` dots on a white image of ``size`` (width, height)."""
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    for i in range(n):
        x, y = 8 + (i * 13) % (size[0] - 16), 8 + (i * 7) % (size[1] - 16)
        draw.ellipse([x - 4, y - 4, x + 4, y + 4], fill="black")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def image_dict(n: int) -> dict:
    return {"bytes": dots_png(n), "path": f"dots_{n}.png"}


def pixmo_table(counts: list[int]) -> list[dict]:
    """PixMo-Count rows as the HF export has them, plus an embedded image column."""
    return [{"image_url": f"https://example.com/{i}.jpg", "image_sha256": f"{i:064x}", "count": c,
             "label": "dots", "points": [{"x": 1.0, "y": 2.0}] * c, "image": image_dict(c)}
            for i, c in enumerate(counts)]


def countbench_table(counts: list[int]) -> list[dict]:
    return [{"image": image_dict(c), "text": f"a photo of {c} dots", "number": c,
             "question": "How many dots are there in the image?"} for c in counts]


def mmmu_table() -> list[dict]:
    """MMMU rows: options as a string list, answer letters, image_1..image_3 (unused ones None)."""
    return [
        {"id": "validation_Art_1", "question": "<image 1> How many dots?", "options": "['1', '2', '3']",
         "answer": "B", "image_1": image_dict(2), "image_2": None, "image_3": None, "question_type": "multiple-choice",
         "subfield": "art"},
        {"id": "validation_Art_2", "question": "Compare <image 1> and <image 2>: which has more?",
         "options": "['first', 'second']", "answer": "A", "image_1": image_dict(3), "image_2": image_dict(1),
         "image_3": None, "question_type": "multiple-choice", "subfield": "art"},
        {"id": "validation_Art_3", "question": "Name the count in <image 1>.", "options": "[]", "answer": "4",
         "image_1": image_dict(4), "image_2": None, "image_3": None, "question_type": "open", "subfield": "art"},
    ]  # fmt: skip


def qa_table(answers: list[str]) -> list[dict]:
    return [{"image": image_dict(i + 1), "question": "What is it?", "answer": a} for i, a in enumerate(answers)]


def write_rows(rows: list[dict], path: Path, container: str) -> Path:
    """Write rows as ``jsonl`` (images saved beside it as files), ``parquet``, ``arrow`` or ``disk``
    (a ``datasets`` save_to_disk folder with Image features). Returns the path to read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if container == "jsonl":
        out = []
        for i, row in enumerate(rows):
            row = dict(row)
            for key, value in row.items():
                if isinstance(value, dict) and "bytes" in value:
                    name = f"img/{i}_{key}.png"
                    (path.parent / "img").mkdir(exist_ok=True)
                    (path.parent / name).write_bytes(value["bytes"])
                    row[key] = name
            out.append(row)
        path = path.with_suffix(".jsonl")
        path.write_text("".join(json.dumps(r) + "\n" for r in out), encoding="utf-8")
        return path
    import datasets

    image_columns = {k for r in rows for k, v in r.items() if isinstance(v, dict) and "bytes" in v}
    table = datasets.Dataset.from_list(rows)
    table = table.cast(datasets.Features({**table.features, **{k: datasets.Image() for k in image_columns}}))
    if container == "parquet":
        table.to_parquet(str(path.with_suffix(".parquet")))
        return path.with_suffix(".parquet")
    if container == "disk":
        table.save_to_disk(str(path))
        return path
    if container == "arrow":
        table.save_to_disk(str(path) + "_saved")
        return next(Path(str(path) + "_saved").glob("*.arrow"))
    raise ValueError(container)
