"""Counting and multiple-choice metrics checked against values worked out by hand."""

import pytest

from vlens.evaluation.metrics import choice_metrics, confusion_matrix, counting_metrics

# targets 2, 2, 3, 3, 5; predictions 2 (hit), 3 (|1|), 3 (hit), None (unparsed), 1 (|4|)
TARGETS = [2, 2, 3, 3, 5]
PREDICTIONS = [2, 3, 3, None, 1]


def test_counting_metrics_by_hand():
    m = counting_metrics(PREDICTIONS, TARGETS)
    assert m.n == 5 and m.n_unparsed == 1
    assert m.accuracy == pytest.approx(2 / 5)  # the unparsed answer counts as wrong
    assert m.mae_n == 4 and m.mae == pytest.approx((0 + 1 + 0 + 4) / 4)  # parsed answers only
    assert sorted(m.per_count) == [2, 3, 5]
    assert (m.per_count[2].n, m.per_count[2].accuracy, m.per_count[2].mae) == (2, 0.5, 0.5)
    assert (m.per_count[3].n, m.per_count[3].accuracy, m.per_count[3].mae, m.per_count[3].n_unparsed) == (
        2,
        0.5,
        0.0,
        1,
    )
    assert (m.per_count[5].accuracy, m.per_count[5].mae) == (0.0, 4.0)


def test_unparsed_value_enters_mae():
    m = counting_metrics(PREDICTIONS, TARGETS, unparsed_value=0)
    assert m.mae_n == 5 and m.mae == pytest.approx((0 + 1 + 0 + 3 + 4) / 5)
    assert m.accuracy == pytest.approx(2 / 5)
    assert m.per_count[3].mae == pytest.approx(1.5)


def test_all_unparsed_has_no_mae():
    m = counting_metrics([None, None], [1, 2])
    assert m.mae is None and m.mae_n == 0 and m.accuracy == 0.0 and m.n_unparsed == 2


def test_confusion_matrix_by_hand():
    rows, columns, matrix = confusion_matrix(PREDICTIONS, TARGETS)
    assert rows == [2, 3, 5]
    assert columns == [1, 2, 3, "unparsed"]
    assert matrix == [
        [0, 1, 1, 0],  # true 2: predicted 2 once, 3 once
        [0, 0, 1, 1],  # true 3: predicted 3 once, unparsed once
        [1, 0, 0, 0],  # true 5: predicted 1
    ]
    assert sum(map(sum, matrix)) == len(TARGETS)


def test_plot_confusion_matrix_cells():
    from vlens.evaluation.plots import plot_confusion_matrix

    heatmap = plot_confusion_matrix(PREDICTIONS, TARGETS).data[0]
    # every target or predicted count is a row and a column; unparsed answers go to "other"
    assert list(heatmap.x) == ["1", "2", "3", "5", "other"] and list(heatmap.y) == ["1", "2", "3", "5"]
    assert [list(row) for row in heatmap.z] == [
        [0, 0, 0, 0, 0],
        [0, 1, 1, 0, 0],
        [0, 0, 1, 0, 1],
        [1, 0, 0, 0, 0],
    ]


def test_choice_metrics_by_hand():
    m = choice_metrics(["A", None, "C", "B"], ["A", "B", "D", "B"], categories=["art", "art", "math", None])
    assert m.n == 4 and m.n_unparsed == 1 and m.accuracy == pytest.approx(0.5)
    assert m.per_category == {"art": {"n": 2, "accuracy": 0.5}, "math": {"n": 1, "accuracy": 0.0}}


def test_mismatched_lengths_are_an_error():
    with pytest.raises(ValueError, match="3 predictions for 2 targets"):
        counting_metrics([1, 2, 3], [1, 2])
