"""vlens attribute-generation: a greedy generation and a given continuation are attributed end to end, the
folder loads back with its HTML strip; mistakes are one-line user errors."""

from __future__ import annotations

from vlens import load_result
from vlens.cli import main
from vlens.generation_attribution import GenerationAttribution
from vlens.testing import random_image


def test_attribute_generation_end_to_end(tmp_path, capsys):
    image, other = tmp_path / "img.png", tmp_path / "other.png"
    random_image(84, 112, 1).save(image)
    random_image(84, 112, 2).save(other)
    out = tmp_path / "greedy"
    assert main(["attribute-generation", "--model", "random-tiny", "--prompt", "How many dots are there?",
                 "--image", str(image), "--max-new-tokens", "2", "--region-size", "2", "--out", str(out),
                 "--quiet"]) == 0
    result = load_result(out)
    assert isinstance(result, GenerationAttribution) and 1 <= result.n_new <= 2
    assert result.region_grids == [(2, 2)] and result.region_maps["exact"][0].shape == (result.n_new, 4)
    assert (out / "generation_attribution.html").is_file() and result.thumbnails is not None
    assert "attribution_patching vs exact patching" in capsys.readouterr().out
    out2 = tmp_path / "teacher"
    assert main(["attribute-generation", "--model", "random-tiny", "--prompt", "How many dots are there?",
                 "--image", str(image), "--baseline-image", str(other), "--continuation", "red blue",
                 "--no-exact", "--no-lens", "--metric", "logit", "--out", str(out2), "--quiet"]) == 0
    loaded = load_result(out2)
    assert loaded.baseline == "image" and loaded.metric == "logit" and loaded.lens_prob is None
    assert "exact" not in loaded.region_maps and loaded.token_strs[0].strip() == "red"


def test_attribute_generation_user_errors(tmp_path, capsys):
    image = tmp_path / "img.png"
    random_image(56, 56, 1).save(image)
    small = tmp_path / "wide.png"
    random_image(112, 56, 1).save(small)  # another token grid
    assert main(["attribute-generation", "--model", "random-tiny", "--prompt", "red", "--image", str(image),
                 "--baseline-image", str(small), "--continuation", "red", "--out", str(tmp_path / "o")]) == 2
    assert "same size" in capsys.readouterr().err
    assert main(["attribute-generation", "--model", "random-tiny", "--prompt", "red", "--image", str(image),
                 "--image", str(image), "--baseline-image", str(small), "--out", str(tmp_path / "o2")]) == 2
    assert "one per --image" in capsys.readouterr().err
