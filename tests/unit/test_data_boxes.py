"""Object boxes and masks in data: COCO RLE encode / decode and polygon rasterisation against
pycocotools' own outputs (recorded below: pycocotools is not a dependency), the synthetic generators'
per-object boxes and masks (the mask is the object's painted pixels; images unchanged), and the dataset
reader's box formats and bad boxes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vlens.cli import dataset_options
from vlens.data.generators import render_syndot, render_synpoly, render_synreal
from vlens.datasets import DatasetError, load_dataset
from vlens.datasets.boxes import BOX_FORMATS, ObjectBox
from vlens.utils.errors import UserInputError
from vlens.utils.rle import decode_mask, encode_mask, polygons_to_mask, rle_counts

POLYGONS = [  # (height, width, polygons, pycocotools 2.0.11's compressed RLE of their union)
    (45, 33, [[26.51, 8.9, 9.25, 40.99, -1.46, 38.4, 27.28, 20.91, 9.35, 11.53], [1.0, 1.0, 6.0, 1.5, 3.0, 6.5]], 'U127Ol01TO2h0OXO2f00YONi028100O2N10O\\OI37NJ141LN34NJ18OHO:2DM>3=2ROKb05\\OLe05XOMh03VONk091HSO0l00VONk00XOOh0OZO0Y:'),
    (43, 36, [[15.83, 21.72, 20.12, 44.94, 29.59, 27.28, 37.36, 8.03]], 'Uf04W16I6J6K2M0001N1O2N1O1O2N1O1O2M2O1O2M2OI'),
    (41, 14, [[-0.02, -0.44, 7.23, 18.98, 13.42, 26.33, 7.22, 20.36, 3.11, -1.52, 2.26, 29.16], [1.0, 1.0, 6.0, 1.5, 3.0, 6.5]], '15T1LnN?d0D[O:d0K<JQO3V1M3N01M01O]4'),
    (32, 43, [[15.33, -1.47, 37.11, 3.84, 10.51, 29.39]], 'h;4e06K6I6M31O1O1O1O1O1O1O2N1O1O1O2N1O1O1O1O2N1O1O1On6'),
]
MASKS = [  # (height, width, seed, pycocotools' compressed RLE of rng(seed).random((h, w)) < 0.3)
    (9, 13, 0, '1161M0NO016OL060I0O040N0N040L12ON091IO10M10O:1I'),
    (16, 18, 1, '133N01OOO000022O0O22LN20O1O1=OEON00080K2ONN020O21OOO10:0F1N11N40M0N050M12013LM2ON21NO05211IM013O70F12O:0D00020O'),
    (23, 23, 2, '0161KO001050J000012OO0O070J100OO033NMO20N00151KN90G020N020N0113OO0N0O001112NO0O110OOO0023N03NM10N00140MO51NO110OK01060J0010OO040M23NO1MO411OM0;1DOO011OO00000011217NF06000K40L11OOO0023N00N0O120OO000010O13OL02010O11OM00000119OF01011NO70I2:NF'),
]


@pytest.mark.parametrize("height,width,seed,expected", MASKS)
def test_rle_matches_pycocotools(height, width, seed, expected):
    mask = np.random.default_rng(seed).random((height, width)) < 0.3
    assert encode_mask(mask) == {"size": [height, width], "counts": expected}
    assert (decode_mask({"size": [height, width], "counts": expected}) == mask).all()
    # the uncompressed form (a list of runs) decodes to the same mask
    assert (decode_mask({"size": [height, width], "counts": rle_counts(mask)}) == mask).all()


@pytest.mark.parametrize("height,width,polygons,expected", POLYGONS)
def test_polygons_match_pycocotools(height, width, polygons, expected):
    assert (polygons_to_mask(polygons, height, width) == decode_mask({"size": [height, width], "counts": expected})).all()


def test_rle_edge_cases_and_errors():
    for mask in (np.zeros((3, 4), bool), np.ones((3, 4), bool), np.eye(5, dtype=bool)):
        assert (decode_mask(encode_mask(mask)) == mask).all()
    with pytest.raises(UserInputError, match="add up"):
        decode_mask({"size": [2, 2], "counts": [1, 2]})
    with pytest.raises(UserInputError, match="size"):
        decode_mask({"counts": "abc"})
    with pytest.raises(UserInputError, match="at least 3 points"):
        polygons_to_mask([[0, 0, 1, 1]], 4, 4)


@pytest.mark.parametrize("render", [render_syndot, render_synpoly, render_synreal])
def test_generators_record_each_objects_box_and_mask(render):
    """The mask holds the pixels the object was painted on (it covers them at least half), inside its bbox;
    drawing again gives the same record (deterministic)."""
    image, record = render(count=3, seed=5, size=96)
    again_image, again = render(count=3, seed=5, size=96)
    assert again == record and again_image.tobytes() == image.tobytes()
    json.dumps(record)  # stays JSON
    for obj in record["objects"]:
        mask = decode_mask(obj["mask"])
        assert mask.shape == (96, 96) and mask.any()
        x0, y0, x1, y1 = obj["bbox"]
        ys, xs = np.nonzero(mask)
        assert x0 <= xs.min() and xs.max() < x1 and y0 <= ys.min() and ys.max() < y1
        cx, cy = obj["center"]
        assert mask[int(cy), int(cx)] or render is render_synreal  # silhouettes may be hollow at the centre


def test_dot_masks_are_their_discs():
    """A SynDot dot of radius r centred at (cx, cy): its mask holds about pi r^2 pixels (to within the
    antialiased rim) with its centroid at the centre (pixel (i, j) has centre (j + 0.5, i + 0.5))."""
    _, record = render_syndot(count=3, seed=3, size=120)
    for obj in record["objects"]:
        mask = decode_mask(obj["mask"])
        r = obj["size"]
        assert abs(int(mask.sum()) - np.pi * r * r) <= 2 * np.pi * r * 0.5
        ys, xs = np.nonzero(mask)
        assert abs(xs.mean() + 0.5 - obj["center"][0]) < 0.5 and abs(ys.mean() + 0.5 - obj["center"][1]) < 0.5


def _write(folder, rows):
    from PIL import Image

    Image.new("RGB", (40, 30)).save(folder / "a.png")
    with open(folder / "metadata.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps({"file_name": "a.png", "question": "what?", "answer": "x", **row}) + "\n")


@pytest.mark.parametrize("box_format,values", [
    ("xyxy", [4, 6, 20, 18]), ("xywh", [4, 6, 16, 12]), ("cxcywh", [12, 12, 16, 12]),
    ("xyxy_norm", [0.1, 0.2, 0.5, 0.6]), ("xywh_norm", [0.1, 0.2, 0.4, 0.4]), ("cxcywh_norm", [0.3, 0.4, 0.4, 0.4]),
])
def test_reader_box_formats(tmp_path, box_format, values):
    _write(tmp_path, [{"width": 40, "height": 30, "objects": [{"bbox": values, "category": "cat", "id": 7}]}])
    record = load_dataset(tmp_path, box_format=box_format).records[0]
    (obj,) = record.boxes[0]
    assert obj.label == "cat" and obj.id == 7
    assert obj.pixel_box((40, 30)) == pytest.approx((4, 6, 20, 18))


def test_reader_boxes_list_and_masks(tmp_path):
    rle = encode_mask(np.pad(np.ones((5, 6), bool), ((2, 23), (3, 31))))
    polygon = [[3, 2, 9, 2, 9, 7, 3, 7]]
    _write(tmp_path, [{"boxes": [[3, 2, 9, 7], [0, 0, 1, 1]], "labels": ["a", "b"], "masks": [rle, polygon]}])
    record = load_dataset(tmp_path, format="imagefolder").records[0]
    first, second = record.boxes[0]
    assert first.pixel_box() == (3, 2, 9, 7) and first.mask_array().sum() == 30
    assert (second.mask_array((40, 30)) == first.mask_array()).all()  # the polygon around the same pixels


def test_vlens_data_boxes_read_back(tmp_path):
    from vlens.data.imagefolder import write_imagefolder

    write_imagefolder([render_synpoly(count=2, seed=1, size=64)], tmp_path / "data")
    tmp_path = tmp_path / "data"
    record = load_dataset(tmp_path).records[0]
    assert [b.id for b in record.boxes[0]] == [0, 1]
    assert record.boxes[0][0].mask_array((64, 64)).any()


@pytest.mark.parametrize("row,words", [
    ({"width": 40, "height": 30, "objects": [{"bbox": [0, 0, 50, 10]}]}, "outside"),
    ({"objects": [{"bbox": [-3, 0, 5, 10]}]}, "outside"),
    ({"objects": [{"bbox": [5, 0, 5, 10]}]}, "empty"),
    ({"objects": [{"bbox": [0, float("nan"), 5, 10]}]}, "NaN"),
    ({"objects": [{"bbox": [0, 0, 5]}]}, "four numbers"),
    ({"objects": [{"bbox": "wide"}]}, "four numbers"),
    ({"boxes": [[0, 0, 5, 5]], "masks": ["not a mask"]}, "COCO RLE"),
])
def test_bad_boxes_are_one_clear_error(tmp_path, row, words):
    _write(tmp_path, [row])
    with pytest.raises(DatasetError, match=words):
        load_dataset(tmp_path)


def test_normalised_box_outside_unit_square_and_unknown_format(tmp_path):
    _write(tmp_path, [{"objects": [{"bbox": [4, 6, 20, 18]}]}])
    with pytest.raises(DatasetError, match=r"\[0, 1\]"):
        load_dataset(tmp_path, box_format="xyxy_norm")
    with pytest.raises(DatasetError, match="unknown box_format"):
        load_dataset(tmp_path, box_format="yolo")
    with pytest.raises(UserInputError, match="normalised"):
        ObjectBox((0.1, 0.1, 0.2, 0.2), normalized=True).pixel_box()


def test_cli_box_formats_match():
    assert dataset_options.BOX_FORMATS == BOX_FORMATS
