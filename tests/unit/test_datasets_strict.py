"""Datasets read strictly and lazily: a key given twice is refused with file and line, `limit`
reads no further than it needs, images are turned upright by their EXIF orientation, and an image
the model's processor refuses is skipped by name in `vlens eval`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from vlens.datasets import DatasetError, load_dataset, open_image
from vlens.datasets import files as dataset_files
from vlens.utils.images import open_image_file


def _rows(n: int) -> list[dict]:
    return [{"file_name": f"{i}.png", "question": "How many?", "answer": str(i % 5), "count": i % 5} for i in range(n)]


def _imagefolder(folder, n: int):
    folder.mkdir(exist_ok=True)
    Image.new("RGB", (28, 28)).save(folder / "0.png")
    for i in range(1, n):
        (folder / f"{i}.png").write_bytes((folder / "0.png").read_bytes())
    (folder / "metadata.jsonl").write_text("\n".join(json.dumps(r) for r in _rows(n)) + "\n")
    return folder


def test_duplicate_keys_are_refused_with_file_and_line(tmp_path):
    folder = _imagefolder(tmp_path / "d", 3)
    lines = (folder / "metadata.jsonl").read_text().splitlines()
    lines[1] = lines[1].replace('"answer": "1"', '"answer": "1", "answer": "4"')
    (folder / "metadata.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError, match=r"metadata\.jsonl line 2: the key 'answer' appears twice"):
        load_dataset(folder)
    table = tmp_path / "rows.json"
    table.write_text('[\n {"question": "q", "answer": "1", "image": "0.png"},\n {"question": "q", "question": "r", '
                     '"answer": "2", "image": "0.png"}\n]')
    with pytest.raises(DatasetError, match=r"rows\.json line 3: the key 'question' appears twice"):
        load_dataset(table, format="qa")


def test_limit_reads_only_the_rows_it_needs(tmp_path, monkeypatch):
    folder = _imagefolder(tmp_path / "d", 50)
    with (folder / "metadata.jsonl").open("a") as handle:
        handle.write("this line is never read\n")  # a broken row after the ones asked for
    read = []
    real = dataset_files._jsonl_lines

    def counting(path):
        for row in real(path):
            read.append(row)
            yield row
    monkeypatch.setattr(dataset_files, "_jsonl_lines", counting)
    data = load_dataset(folder, limit=3)
    assert [r.id for r in data.examples] == ["0.png", "1.png", "2.png"] and len(read) <= 4
    with pytest.raises(DatasetError, match="line 51 is not valid JSON"):
        load_dataset(folder)


def test_limit_streams_parquet_row_groups(tmp_path):
    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.parquet as parquet

    _imagefolder(tmp_path, 1)
    rows = [{"image": "0.png", "question": "How many?", "answer": str(i)} for i in range(2000)]
    parquet.write_table(pyarrow.Table.from_pylist(rows), tmp_path / "t.parquet", row_group_size=100)
    data = load_dataset(tmp_path / "t.parquet", limit=5)
    assert data.format == "qa" and [r.answer for r in data.examples] == ["0", "1", "2", "3", "4"]
    assert len(load_dataset(tmp_path / "t.parquet").examples) == 2000


def test_exif_orientation_is_applied_wherever_an_image_file_is_opened(tmp_path):
    pixels = np.zeros((20, 40, 3), np.uint8)  # stored landscape, 40 wide: red on the left half
    pixels[:, :20] = (255, 0, 0)
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to view": the photo is portrait
    Image.fromarray(pixels).save(tmp_path / "phone.jpg", exif=exif, quality=95)
    for opened in (open_image(tmp_path / "phone.jpg"), open_image_file(tmp_path / "phone.jpg"),
                   open_image((tmp_path / "phone.jpg").read_bytes())):
        assert opened.size == (20, 40)  # upright: portrait
        top, bottom = np.asarray(opened)[2, 10], np.asarray(opened)[37, 10]
        assert top[0] > 200 and bottom[0] < 60  # the red half is now on top


def test_a_processor_refused_image_is_named_and_skipped_in_eval(tmp_path, capsys, monkeypatch):
    from vlens.cli import main
    from vlens.data import make_task_sample, write_imagefolder

    monkeypatch.chdir(tmp_path)
    write_imagefolder([make_task_sample("counting", seed=i, size=56) for i in range(3)], tmp_path / "d")
    Image.fromarray(np.zeros((28, 28 * 250, 3), np.uint8)).save(tmp_path / "d" / "000001.png")  # ratio 250
    assert main(["eval", "--data", "d", "--out", "o", "--quiet"]) == 0
    report = json.loads((tmp_path / "o" / "results.json").read_text())
    reasons = [s["reason"] for s in report["skipped"]]
    assert len(reasons) == 1 and "000001.png" in reasons[0] and "refuses" in reasons[0] and "200" in reasons[0]
    assert report["metrics"]["n"] == 2
    with pytest.warns(UserWarning, match=r"skipped 1 record.*000001\.png.*refuses"):  # logit-lens skips it too
        assert main(["logit-lens", "--data", "d", "--out", "l", "--quiet"]) == 0


def test_prepare_names_a_refused_image_in_one_line():
    from vlens.core.model import HookedVLM
    from vlens.core.processing import RefusedImageError
    from vlens.testing import tiny_hf_model, tiny_qwen_processor
    from vlens.utils.images import with_source

    model = HookedVLM.from_hf(tiny_hf_model("qwen2_5_vl"), processor=tiny_qwen_processor())
    wide = with_source(Image.new("RGB", (28 * 250, 28)), "wide.png")
    with pytest.raises(RefusedImageError, match=r"image wide\.png \(7000 x 28 px\): the model's image processor "
                                                r"refuses it \(.*200"):
        model.prepare(images=[wide], prompts=["How many?"])


@pytest.mark.parametrize("edit,message", [
    ({"answer": "4"}, r"line 2: the answer '4' disagrees with its count 1 \(the row has no 'task' and a whole-number"),
    ({"task": "counting", "answer": "two"}, r"line 2: the answer 'two' disagrees with its count 1 \(the row has 'task' "
                                            "counting"),
    ({"task": "counting", "targets": [0, 1], "objects": [{"id": 0}, {"id": 1}], "count": 2},
     r"line 2: the answer '1' disagrees with its 2 targets"),
    ({"objects": [{"id": 0}, {"id": 1}]}, r"line 2: the count 1 and the 2 objects the row lists disagree"),
])
def test_a_count_and_answer_that_disagree_are_refused(tmp_path, edit, message):
    folder = _imagefolder(tmp_path / "d", 3)
    rows = [json.loads(line) for line in (folder / "metadata.jsonl").read_text().splitlines()]
    rows[1].update(edit)
    (folder / "metadata.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(DatasetError, match=message):
        load_dataset(folder)


def test_counts_that_agree_and_counts_of_something_else_pass(tmp_path):
    folder = _imagefolder(tmp_path / "d", 3)
    rows = [json.loads(line) for line in (folder / "metadata.jsonl").read_text().splitlines()]
    # a colour question about one of two objects; a count of 3 shapes among 5 objects (vlens data's synpoly)
    def objects(n):
        return [{"id": i, "center": [4.0 * i, 4.0]} for i in range(n)]

    rows[1].update(task="colour", answer="red", count=2, targets=[1], objects=objects(2))
    rows[2].update(task="counting", answer="3", count=5, targets=[0, 1, 2], objects=objects(5))
    (folder / "metadata.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    data = load_dataset(folder)
    assert [r.count for r in data.examples] == [0, 2, 5] and data.examples[2].target == 3
