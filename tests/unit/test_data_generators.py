"""SynDot / SynPoly / SynReal-lite: determinism, metadata against pixels, clear errors."""

import io
import time

import numpy as np
import pytest
from scipy import ndimage

from vlens.data import LayoutError, render_syndot, render_synpoly, render_synreal
from vlens.data.imagefolder import save_png

RENDERERS = [render_syndot, render_synpoly, render_synreal]


def png_bytes(image) -> bytes:
    buf = io.BytesIO()
    save_png(image, buf)
    return buf.getvalue()


def n_components(mask: np.ndarray) -> int:
    return ndimage.label(mask, structure=np.ones((3, 3)))[1]


@pytest.mark.parametrize("render", RENDERERS)
def test_same_seed_gives_identical_bytes_and_record(render):
    a_img, a_rec = render(7, seed=11, size=96)
    b_img, b_rec = render(7, seed=11, size=96)
    assert png_bytes(a_img) == png_bytes(b_img)
    assert a_rec == b_rec
    assert png_bytes(render(7, seed=12, size=96)[0]) != png_bytes(a_img)


@pytest.mark.parametrize("render", RENDERERS)
def test_objects_inside_and_apart(render):
    for seed in range(20):
        img, rec = render(10, seed=seed, size=128)
        assert rec["count"] == len(rec["objects"]) == 10 and rec["answer"] == "10"
        objs = rec["objects"]
        for o in objs:
            x0, y0, x1, y1 = o["bbox"]
            assert 0 <= x0 < x1 <= 128 and 0 <= y0 < y1 <= 128
        for i, a in enumerate(objs):
            for b in objs[i + 1 :]:
                gap = np.hypot(*np.subtract(a["center"], b["center"])) - a["size"] - b["size"]
                assert gap >= 2  # default min gap is max(2, 2% of size)


def test_syndot_connected_components_match_count():
    for seed in range(40):
        count = 1 + seed % 10
        img, rec = render_syndot(count, seed=seed, size=112)
        dark = np.asarray(img.convert("L")) < 128
        assert n_components(dark) == count == rec["count"]
        for o in rec["objects"]:  # dot centres are black, and the record says so
            assert img.getpixel(tuple(int(c) for c in o["center"])) == (0, 0, 0) == tuple(o["rgb"])


@pytest.mark.parametrize("background", ["white", "tint", "gradient"])
def test_synpoly_pixels_match_metadata(background):
    for seed in range(15):
        img, rec = render_synpoly(1 + seed % 10, seed=seed, size=128, background=background)
        pixels = np.asarray(img).astype(int)
        bg = render_synpoly(0, seed=seed, size=128, background=background, allow_empty=True)[0]
        changed = np.abs(pixels - np.asarray(bg).astype(int)).sum(-1) > 0
        assert n_components(changed) == rec["count"]
        inside_any = np.zeros_like(changed)
        for o in rec["objects"]:
            x0, y0, x1, y1 = o["bbox"]
            inside_any[y0:y1, x0:x1] = True
            assert img.getpixel(tuple(int(c) for c in o["center"])) == tuple(o["rgb"])
        assert not (changed & ~inside_any).any(), "pixels changed outside every object's bbox"


def test_synreal_is_a_different_distribution():
    img, rec = render_synreal(6, seed=3, size=128)
    pixels = np.asarray(img).astype(float)
    assert pixels.std(axis=(0, 1)).mean() > 10  # textured / noisy background, not flat
    sizes = [o["size"] for s in range(10) for o in render_synreal(8, seed=s, size=128)[1]["objects"]]
    assert max(sizes) / min(sizes) > 2.5  # scale variation
    assert rec["style"] == "synreal" and rec["question"] == "How many objects are there?"


def test_impossible_requests_fail_fast_with_clear_errors():
    start = time.perf_counter()
    with pytest.raises(LayoutError, match="fewer objects"):
        render_syndot(50, seed=0, size=64, radius=20)
    with pytest.raises(LayoutError, match="too crowded"):  # passes the area bound, fails placement
        render_syndot(30, seed=0, size=128, radius=10)
    with pytest.raises(LayoutError, match="does not fit"):
        render_syndot(1, seed=0, size=32, radius=20)
    assert time.perf_counter() - start < 10
    with pytest.raises(ValueError, match="allow_empty"):
        render_syndot(0, seed=0)
    with pytest.raises(ValueError, match="min_gap"):
        render_syndot(3, seed=0, min_gap=1)
    with pytest.raises(ValueError, match="seed"):
        render_syndot(3, seed=-1)
    with pytest.raises(ValueError, match="background"):
        render_synpoly(3, seed=0, background="plaid")


def test_empty_image_when_allowed():
    img, rec = render_syndot(0, seed=0, size=64, allow_empty=True)
    assert rec["count"] == 0 and rec["answer"] == "0" and rec["objects"] == []
    assert np.asarray(img).min() == 255
