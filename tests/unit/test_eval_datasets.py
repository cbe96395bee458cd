"""Readers for local copies, on fixtures written in each documented format."""

import json

import pytest

from tests.helpers.eval_data import (
    pixmo_rows,
    write_countbenchqa,
    write_imagefolder,
    write_jsonl,
    write_mcq,
    write_png,
)
from vlens.evaluation.datasets import read_countbenchqa, read_counting_imagefolder, read_mcq, read_pixmo
from vlens.evaluation.examples import MissingImageError, open_image
from vlens.evaluation.formats import format_prompt


def test_imagefolder(tmp_path):
    data = read_counting_imagefolder(write_imagefolder(tmp_path, [1, 4, 2]))
    assert [e.target for e in data.examples] == [1, 4, 2]
    first = data.examples[0]
    assert first.id == "img_000.png" and first.images == [tmp_path / "img_000.png"]
    assert first.question.startswith("How many dots")
    assert first.extra["task"] == "count_dots" and "objects" not in first.extra
    assert open_image(first.images[0]).size == (32, 32)


def test_missing_image_is_named_or_skipped_and_counted(tmp_path):
    write_imagefolder(tmp_path, [1, 2, 3])
    (tmp_path / "img_001.png").unlink()
    with pytest.raises(MissingImageError, match=r"img_001\.png does not exist.*--skip-missing"):
        read_counting_imagefolder(tmp_path)
    data = read_counting_imagefolder(tmp_path, skip_missing=True)
    assert [e.id for e in data.examples] == ["img_000.png", "img_002.png"]
    assert len(data.skipped) == 1 and "img_001.png" in data.skipped[0].reason


def test_missing_field_is_a_clear_error(tmp_path):
    write_png(tmp_path / "a.png", 0)
    write_jsonl(tmp_path / "metadata.jsonl", [{"file_name": "a.png", "question": "How many?"}])
    with pytest.raises(ValueError, match=r"neither 'answer' nor 'count'"):
        read_counting_imagefolder(tmp_path)


def test_pixmo_jsonl_with_images_named_by_sha256(tmp_path):
    rows = pixmo_rows(tmp_path, [3, 7])
    data = read_pixmo(
        write_jsonl(tmp_path / "pixmo.jsonl", rows), image_dir=tmp_path / "images", verify_sha256=True
    )
    assert [e.target for e in data.examples] == [3, 7]
    assert data.examples[0].images == [tmp_path / "images" / f"{rows[0]['image_sha256']}.png"]
    assert data.examples[0].question == "How many boats are there?"
    assert format_prompt(data.examples[0], "\nAnswer with a single number.").endswith(
        "?\nAnswer with a single number."
    )
    assert (
        data.examples[0].extra["image_url"] == "https://example.com/0.png"
        and "points" not in data.examples[0].extra
    )


def test_pixmo_parquet_with_path_column_and_bad_checksum(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq  # with the data extra (dev installs it)

    rows = pixmo_rows(tmp_path, [2, 5])
    for row in rows:
        row["local_path"] = f"images/{row['image_sha256']}.png"
    rows[1]["image_sha256"] = "0" * 64  # the file no longer matches
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "pixmo.parquet")
    data = read_pixmo(tmp_path / "pixmo.parquet", image_column="local_path")
    assert [e.target for e in data.examples] == [2, 5]
    with pytest.raises(MissingImageError, match="sha256 differs"):
        read_pixmo(tmp_path / "pixmo.parquet", image_column="local_path", verify_sha256=True)
    checked = read_pixmo(
        tmp_path / "pixmo.parquet", image_column="local_path", verify_sha256=True, skip_missing=True
    )
    assert len(checked.examples) == 1 and len(checked.skipped) == 1


def test_pixmo_question_column_drops_image_markers(tmp_path):
    rows = pixmo_rows(tmp_path, [4])
    rows[0]["question"] = "<image>\nHow many boats?"
    data = read_pixmo(write_jsonl(tmp_path / "p.jsonl", rows), image_dir=tmp_path / "images")
    assert data.examples[0].question == "How many boats?"


def test_pixmo_sha256_not_in_folder(tmp_path):
    rows = pixmo_rows(tmp_path, [1])
    rows[0]["image_sha256"] = "ab" * 32
    with pytest.raises(MissingImageError, match=f"no image named {'ab' * 32}"):
        read_pixmo(write_jsonl(tmp_path / "p.jsonl", rows), image_dir=tmp_path / "images")


def test_countbenchqa_jsonl_and_embedded_bytes(tmp_path):
    data = read_countbenchqa(write_countbenchqa(tmp_path, [4, 9]))
    assert [e.target for e in data.examples] == [4, 9] and data.examples[1].images == [
        tmp_path / "cb" / "1.png"
    ]
    embedded = {"bytes": (tmp_path / "cb" / "0.png").read_bytes(), "path": "0.png"}
    (tmp_path / "hf.json").write_text(
        json.dumps([{"image": {"path": "cb/0.png", "bytes": None}, "question": "q", "number": 4}])
    )
    assert read_countbenchqa(tmp_path / "hf.json").examples[0].images == [tmp_path / "cb" / "0.png"]
    import pyarrow as pa
    import pyarrow.parquet as pq  # with the data extra (dev installs it)

    pq.write_table(
        pa.Table.from_pylist([{"image": embedded, "question": "q", "number": 4}]), tmp_path / "cb.parquet"
    )
    example = read_countbenchqa(tmp_path / "cb.parquet").examples[0]
    assert isinstance(example.images[0], bytes) and open_image(example.images[0]).size == (32, 32)


def test_mcq_options_and_answers_in_every_form(tmp_path):
    data = read_mcq(write_mcq(tmp_path))
    assert [e.id for e in data.examples] == ["q0", "q1", "q2"]
    assert [e.target for e in data.examples] == ["B", "C", "B"]  # letter, index 2, option text
    assert data.examples[1].options == ["left", "right", "same"] and len(data.examples[1].images) == 2
    assert data.examples[2].options == ["dot", "square"]
    assert (
        format_prompt(data.examples[0], "\nAnswer with the letter.")
        == "What colour?\nA. red\nB. green\nAnswer with the letter."
    )


@pytest.mark.parametrize(
    "row,message",
    [
        ({"image": "x.png", "question": "q", "options": ["a", "b"], "answer": "C"}, "neither a letter A-B"),
        ({"image": "x.png", "question": "q", "options": ["a", "b"], "answer": 5}, "outside the 2 options"),
        ({"image": "x.png", "question": "q", "options": ["a"], "answer": "A"}, "at least two choices"),
        ({"question": "q", "options": ["a", "b"], "answer": "A"}, "lacks 'image'"),
    ],
)
def test_mcq_bad_rows(tmp_path, row, message):
    write_png(tmp_path / "x.png", 0)
    with pytest.raises(ValueError, match=message):
        read_mcq(write_jsonl(tmp_path / "bad.jsonl", [row]))


def test_unknown_file_type_and_missing_file(tmp_path):
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match=r"use a \.jsonl, \.json, \.parquet or \.arrow"):
        read_mcq(tmp_path / "data.csv")
    with pytest.raises(FileNotFoundError, match="nope.jsonl does not exist"):
        read_countbenchqa(tmp_path / "nope.jsonl")


def test_imagefolder_written_by_vlens_data_targets_the_answer(tmp_path):
    from vlens.data import make_task_sample
    from vlens.data import write_imagefolder as write_vlens_imagefolder

    samples = [make_task_sample("counting", seed=seed, style="synpoly") for seed in range(3)]
    data = read_counting_imagefolder(write_vlens_imagefolder(samples, tmp_path / "suite"))
    # "How many squares?" asks for the answer, not for `count` (all objects in the image)
    assert [e.target for e in data.examples] == [int(record["answer"]) for _, record in samples]
    assert [e.extra["count"] for e in data.examples] == [record["count"] for _, record in samples]


def test_imagefolder_with_word_answers_is_refused(tmp_path):
    from vlens.data import make_task_sample
    from vlens.data import write_imagefolder as write_vlens_imagefolder

    write_vlens_imagefolder([make_task_sample("colour", seed=0, style="synpoly")], tmp_path / "colour")
    with pytest.raises(ValueError, match="task 'colour'.*is not a count"):
        read_counting_imagefolder(tmp_path / "colour")
