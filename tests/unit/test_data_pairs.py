"""Controlled pairs: exact count difference, unchanged objects pixel-identical."""

import numpy as np
import pytest
from scipy import ndimage

from vlens.data import make_pair


def differing_pixels(pair) -> np.ndarray:
    a, b = np.asarray(pair.clean_image), np.asarray(pair.corrupt_image)
    return (a != b).any(-1)


def bbox_mask(records, ids, size) -> np.ndarray:
    mask = np.zeros((size, size), dtype=bool)
    for rec in records:
        for o in rec["objects"]:
            if o["id"] in ids:
                x0, y0, x1, y1 = o["bbox"]
                mask[y0:y1, x0:x1] = True
    return mask


def check_pair_invariants(pair, size):
    clean, corrupt = pair.clean_record, pair.corrupt_record
    assert pair.clean_image.size == pair.corrupt_image.size == (size, size)
    assert clean["pair_id"] == corrupt["pair_id"] == pair.pair_id
    assert (clean["role"], corrupt["role"]) == ("clean", "corrupt")
    assert clean["changed"] == corrupt["changed"] == pair.changed
    # every differing pixel belongs to a changed object; unchanged ones are pixel-identical
    changed_area = bbox_mask([clean, corrupt], set(pair.changed), size)
    assert not (differing_pixels(pair) & ~changed_area).any()
    a, b = np.asarray(pair.clean_image), np.asarray(pair.corrupt_image)
    unchanged = {o["id"]: o for o in clean["objects"] if o["id"] not in pair.changed}
    for o in corrupt["objects"]:
        if o["id"] in unchanged:
            assert o == unchanged[o["id"]]
            x0, y0, x1, y1 = o["bbox"]
            assert np.array_equal(a[y0:y1, x0:x1], b[y0:y1, x0:x1])
    for rec in (clean, corrupt):
        for i, p in enumerate(rec["objects"]):
            x0, y0, x1, y1 = p["bbox"]
            assert 0 <= x0 < x1 <= size and 0 <= y0 < y1 <= size
            for q in rec["objects"][i + 1 :]:
                assert np.hypot(*np.subtract(p["center"], q["center"])) >= p["size"] + q["size"] + 2


@pytest.mark.parametrize("style", ["syndot", "synpoly", "synreal"])
@pytest.mark.parametrize("n_clean,n_corrupt", [(3, 5), (6, 2), (1, 2)])
def test_count_pairs(style, n_clean, n_corrupt):
    for seed in range(4):
        pair = make_pair(n_clean, n_corrupt, seed=seed, style=style, size=128)
        check_pair_invariants(pair, 128)
        assert pair.clean_record["count"] == n_clean and pair.corrupt_record["count"] == n_corrupt
        assert len(pair.changed) == abs(n_clean - n_corrupt)
        assert pair.clean_record["answer"] == str(n_clean)


def test_syndot_pair_components_match_counts():
    for seed in range(10):
        pair = make_pair(2 + seed % 5, 7 - seed % 5 + (seed % 5 == 2), seed=seed, size=112)
        for image, rec in pair.samples():
            dark = np.asarray(image.convert("L")) < 128
            assert ndimage.label(dark, structure=np.ones((3, 3)))[1] == rec["count"]


@pytest.mark.parametrize("style", ["syndot", "synpoly", "synreal"])
def test_control_pairs(style):
    for seed in range(4):
        moved = make_pair(5, None, seed=seed, style=style, kind="move", n_changed=2, size=128)
        check_pair_invariants(moved, 128)
        assert moved.clean_record["count"] == moved.corrupt_record["count"] == 5
        before = {o["id"]: o for o in moved.clean_record["objects"]}
        for o in moved.corrupt_record["objects"]:
            assert (o["center"] != before[o["id"]]["center"]) == (o["id"] in moved.changed)
            assert o["color"] == before[o["id"]]["color"]

        recoloured = make_pair(4, 4, seed=seed, style=style, kind="colour", size=128)
        check_pair_invariants(recoloured, 128)
        before = {o["id"]: o for o in recoloured.clean_record["objects"]}
        for o in recoloured.corrupt_record["objects"]:
            assert (o["color"] != before[o["id"]]["color"]) == (o["id"] in recoloured.changed)
            assert o["center"] == before[o["id"]]["center"]
        assert differing_pixels(recoloured).any()


def test_pair_is_deterministic_and_validates():
    a, b = make_pair(3, 5, seed=9), make_pair(3, 5, seed=9)
    assert np.array_equal(np.asarray(a.corrupt_image), np.asarray(b.corrupt_image))
    assert a.corrupt_record == b.corrupt_record
    with pytest.raises(ValueError, match="n_corrupt != n_clean"):
        make_pair(3, 3, seed=0)
    with pytest.raises(ValueError, match="keeps the count"):
        make_pair(3, 4, seed=0, kind="move")
    with pytest.raises(ValueError, match="pair kind"):
        make_pair(3, 4, seed=0, kind="swap")
