"""The cross-task ablation study (`vlens ablate`): the patching overlap on known head sets, and the
command end to end on a random model whose tokenizer knows every task answer."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers.ablation_models import SIZE, report_with_known_sets, task_vocab_model
from vlens.studies.ablation import add_patching_overlap

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model():
    return task_vocab_model()


def test_patching_overlap_on_known_sets():
    report = report_with_known_sets()  # top-2: a {(0,0),(0,1)}, b {(1,0),(0,1)}
    overlap = add_patching_overlap(report, {"head_scores": [[0.0, -5.0], [4.0, 0.1]]}, k=2)
    assert overlap["jaccard"] == {"a": pytest.approx(1 / 3), "b": 1.0}
    assert report.to_dict()["patching"]["jaccard"]["b"] == 1.0


def test_vlens_ablate_command(tmp_path, monkeypatch, model, capsys):
    import vlens.cli.ablate as ablate_cli
    from vlens.cli import main

    monkeypatch.setattr(ablate_cli, "load_model_from_args", lambda args: model)
    patching = tmp_path / "vap.json"
    patching.write_text(json.dumps({"heads": [[1, 0], [1, 1]]}))
    out = tmp_path / "ablation"
    code = main(["ablate", "--model", "random-tiny", "--tasks", "counting,colour,counting@synreal", "--top-k", "3",
                 "--n-examples", "3", "--n-reference", "3", "--image-size", str(SIZE), "--quiet",
                 "--patching", str(patching), "--out", str(out), "--retest-seed", "50"])
    assert code == 0
    data = json.loads((out / "results.json").read_text())
    assert data["tasks"] == ["counting", "colour", "counting@synreal"] and data["top_k"] == 3
    assert data["n_heads_total"] == 8
    matrix = torch.tensor(data["jaccard"]["matrix"])
    assert torch.allclose(matrix.diag(), torch.ones(3)) and torch.allclose(matrix, matrix.T)
    for task in data["tasks"]:
        assert len(data["results"][task]["top_heads"]) == 3
        assert len(data["results"][task]["ranked_heads"]) == 8
    assert set(data["patching"]["jaccard"]) == set(data["tasks"])
    assert set(data["reliability"]) == set(data["tasks"])
    assert all(0.0 <= v <= 1.0 for v in data["reliability"].values())
    capsys.readouterr()
    assert main(["ablate", "--model", "random-tiny", "--tasks", "counting", "--n-examples", "3", "--retest-seed", "2",
                 "--top-k", "3", "--out", str(tmp_path / "retest")]) == 2
    assert "overlap the evaluation seeds" in capsys.readouterr().err
    html = (out / "report.html").read_text()
    assert (out / "summary.md").read_text().startswith("Jaccard overlap of each task's top-3 heads (of 8)")
    assert "Jaccard overlap of top-k head sets" in html and "counting@synreal: damage per head" in html
    assert '<ul class="findings">' in html and "its top-k set on a second sample overlaps the first" in html
    with pytest.raises(SystemExit) as exit_info:
        main(["ablate", "--tasks", "counting", "--top-k", "0", "--out", str(out)])
    assert exit_info.value.code == 2 and "--top-k: must be an integer >= 1" in capsys.readouterr().err
