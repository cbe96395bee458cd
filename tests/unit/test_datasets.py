"""The shared dataset layer: every format in every container, detection, and hostile files."""

import json
import os

import pytest

from tests.helpers.real_formats import (
    countbench_table,
    dots_png,
    mmmu_table,
    pixmo_table,
    qa_table,
    write_rows,
)
from vlens.datasets import (
    DatasetError,
    UnreadableImageError,
    detect_format,
    load_dataset,
    load_record_images,
    open_image,
)

CONTAINERS = ["jsonl", "parquet", "arrow", "disk"]


@pytest.mark.parametrize("container", CONTAINERS)
def test_pixmo_in_every_container(tmp_path, container):
    path = write_rows(pixmo_table([3, 1]), tmp_path / "pixmo", container)
    data = load_dataset(path)
    assert data.format == "pixmo"
    assert [(r.target, r.count, r.answer) for r in data.examples] == [(3, 3, "3"), (1, 1, "1")]
    assert data.examples[0].question == "How many dots are there?"
    assert open_image(data.examples[0].images[0]).size == (64, 48)
    assert data.examples[0].objects == [([(1.0, 2.0)] * 3, None)]  # PixMo's points: centres in pixels
    assert "points" not in data.examples[0].extra and "row 0" in data.examples[0].source or "line 1" in \
        data.examples[0].source


@pytest.mark.parametrize("container", CONTAINERS)
def test_countbenchqa_in_every_container(tmp_path, container):
    data = load_dataset(write_rows(countbench_table([2, 5]), tmp_path / "cb", container))
    assert data.format == "countbenchqa" and [r.target for r in data.examples] == [2, 5]
    assert data.examples[1].extra["text"] == "a photo of 5 dots"


@pytest.mark.parametrize("container", CONTAINERS)
def test_mmmu_numbered_image_columns_and_open_questions(tmp_path, container):
    data = load_dataset(write_rows(mmmu_table(), tmp_path / "mmmu", container))
    assert data.format == "mcq"
    assert [r.id for r in data.examples] == ["validation_Art_1", "validation_Art_2"]
    assert [len(r.images) for r in data.examples] == [1, 2] and data.examples[0].options == ["1", "2", "3"]
    assert [r.target for r in data.examples] == ["B", "A"]
    assert len(data.skipped) == 1 and "open question" in data.skipped[0].reason
    assert "image_2" not in data.examples[0].extra


@pytest.mark.parametrize("container", CONTAINERS)
def test_generic_qa_with_word_answers(tmp_path, container):
    data = load_dataset(write_rows(qa_table(["red", "3"]), tmp_path / "qa", container))
    assert data.format == "qa" and [r.target for r in data.examples] == ["red", 3]


def test_save_to_disk_dataset_dict_needs_a_split(tmp_path):
    import datasets

    table = datasets.Dataset.from_list(countbench_table([1, 2]))
    datasets.DatasetDict({"train": table, "test": table}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(DatasetError, match=r"splits \['test', 'train'\]: choose one"):
        load_dataset(tmp_path / "dd")
    assert len(load_dataset(tmp_path / "dd", split="test")) == 2


def test_detection_and_unknown_columns(tmp_path):
    path = tmp_path / "odd.jsonl"
    path.write_text(json.dumps({"picture": "a.png", "caption": "x"}) + "\n")
    with pytest.raises(DatasetError, match=r"cannot tell the format.*\['caption', 'picture'\]"):
        load_dataset(path)
    with pytest.raises(DatasetError, match=r"image_column \(--image-column\) do.*not apply to the countbenchqa"):
        load_dataset(write_rows(countbench_table([1]), tmp_path / "cb", "jsonl"), format="countbenchqa",
                     image_column="x")
    assert detect_format(tmp_path, columns={"options", "question"}) == "mcq"


def test_imagefolder_objects_and_word_answers(tmp_path):
    from vlens.data import make_task_sample, write_imagefolder

    samples = [make_task_sample(task, seed=1, style="synpoly", size=112) for task in ("counting", "colour")]
    data = load_dataset(write_imagefolder(samples, tmp_path / "suite"))
    assert data.format == "imagefolder"
    counting, colour = data.examples
    assert counting.target == int(samples[0][1]["answer"]) and colour.target == samples[1][1]["answer"]
    centres, size = counting.objects[0]
    wanted = [o["center"] for o in samples[0][1]["objects"] if o["id"] in samples[0][1]["targets"]]
    assert [list(c) for c in centres] == wanted and size == (112, 112)


# ---------------------------------------------------------------------- hostile files
def _folder(tmp_path, rows, raw: bytes | None = None):
    folder = tmp_path / "ds"
    folder.mkdir(exist_ok=True)
    (folder / "a.png").write_bytes(dots_png(1))
    text = raw if raw is not None else "".join(json.dumps(r) + "\n" for r in rows).encode()
    (folder / "metadata.jsonl").write_bytes(text)
    return folder


@pytest.mark.parametrize("name,message", [
    ("../a.png", r"leaves the dataset folder"),
    ("/etc/passwd", r"is absolute"),
    ("", r"non-empty string|file path"),
    ("http://example.com/a.png", r"line 1: image 'http://example.com/a.png' is a URL; datasets are read from local"),
])  # fmt: skip
def test_file_name_must_stay_inside_the_folder(tmp_path, name, message):
    folder = _folder(tmp_path, [{"file_name": name, "question": "q", "answer": "1"}])
    for reader in (load_dataset, __import__("vlens.data", fromlist=["read_imagefolder"]).read_imagefolder):
        with pytest.raises(DatasetError, match=message):
            reader(folder)


def test_symlink_out_of_the_folder_is_refused(tmp_path):
    folder = _folder(tmp_path, [{"file_name": "link.png", "question": "q", "answer": "1"}])
    (tmp_path / "secret.png").write_bytes(dots_png(2))
    os.symlink(tmp_path / "secret.png", folder / "link.png")
    with pytest.raises(DatasetError, match="through a symbolic link"):
        load_dataset(folder)


def test_fifo_is_refused_without_blocking(tmp_path):
    folder = _folder(tmp_path, [{"file_name": "pipe.png", "question": "q", "answer": "1"}])
    os.mkfifo(folder / "pipe.png")
    with pytest.raises(UnreadableImageError, match="not a regular file"):
        load_dataset(folder)
    os.mkfifo(tmp_path / "rows.jsonl")
    with pytest.raises(UnreadableImageError, match="not a regular file"):
        load_dataset(tmp_path / "rows.jsonl", format="qa")


def test_size_limit(tmp_path):
    (tmp_path / "big.png").write_bytes(dots_png(1))
    with pytest.raises(UnreadableImageError, match="over the 0 MiB limit"):
        open_image(tmp_path / "big.png", max_bytes=10)


@pytest.mark.parametrize("raw,message", [
    (b'{"file_name": "a.png", "question": "q", "answer": "1"}\nnull\n', r"metadata.jsonl line 2 must be a JSON object.*null"),
    (b'{"file_name": "a.png", "question": "q", "answer": "1"}\n[1, 2]\n', r"line 2 must be a JSON object.*list"),
    (b'{"file_name": "a.png", "question": "caf\xe9"}\n', r"line 1 is not UTF-8"),
    (b'{"file_name": "a.png", "answer": "1"}\n', r"line 1 lacks \['question'\]"),
    (b'{"file_name": "a.png", "question": {"a": 1}, "answer": "1"}\n', r"line 1: question must be text, got dict"),
    (b'{"file_name": "a.png", "question": "q", "count": "many"}\n', r"line 1: count must be a whole number"),
    (b'{"file_name": "a.png", "question": "q", "answer": "1", "objects": [{"centre": 1}]}\n', r"line 1: objects must be"),
    (b'{"file_name": "a.png", "question": "q", "answer": "1"\n', r"line 1 is not valid JSON"),
])  # fmt: skip
def test_malformed_metadata_gives_one_clear_error(tmp_path, raw, message):
    with pytest.raises(DatasetError, match=message):
        load_dataset(_folder(tmp_path, [], raw=raw))


def test_malformed_table_rows(tmp_path):
    rows = countbench_table([1, 2])
    rows[1]["number"] = None
    with pytest.raises(DatasetError, match=r"row 1 lacks \['number'\]"):
        load_dataset(write_rows(rows, tmp_path / "cb", "parquet"), format="countbenchqa")
    rows = mmmu_table()[:1]
    rows[0]["options"] = "[unclosed"
    with pytest.raises(DatasetError, match="options string .* is not a list"):
        load_dataset(write_rows(rows, tmp_path / "mmmu", "parquet"))


def test_undecodable_image_is_skipped_by_name(tmp_path):
    folder = _folder(tmp_path, [{"file_name": "a.png", "question": "q", "answer": "1"},
                                {"file_name": "broken.png", "question": "q", "answer": "2"}])
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    data = load_dataset(folder)
    with pytest.warns(UserWarning, match="broken.png"):
        loaded = load_record_images(data)
    assert [r.id for r, _ in loaded] == ["a.png"]
    assert len(data.skipped) == 1 and "broken.png cannot be decoded" in data.skipped[0].reason
    with pytest.raises(UnreadableImageError, match="broken.png"):
        load_record_images(load_dataset(folder), skip_unreadable=False)


def test_cli_format_names_match_the_layer():
    from vlens.cli import dataset_options
    from vlens.datasets import DATA_FORMATS

    assert dataset_options.DATA_FORMATS == DATA_FORMATS


def test_pixmo_points_in_both_layouts():
    from vlens.datasets.fields import pixmo_points

    assert pixmo_points({"x": [1.0, 3.0], "y": [2.0, 4.0]}, "r") == [([(1.0, 2.0), (3.0, 4.0)], None)]
    assert pixmo_points([], "r") is None and pixmo_points(None, "r") is None
    with pytest.raises(DatasetError, match="r: points must be"):
        pixmo_points([{"x": 1.0}], "r")


def test_another_format_on_an_imagefolder_says_what_the_folder_is(tmp_path):
    folder = _folder(tmp_path, [{"file_name": "a.png", "question": "q", "answer": "1"}])
    with pytest.raises(DatasetError, match=r"is an imagefolder \(metadata\.jsonl\), not a pixmo table.*--format imagefolder"):
        load_dataset(folder, format="pixmo")
    assert len(load_dataset(folder, format="imagefolder").records) == 1
