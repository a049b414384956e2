"""set_split.split_rows against a cell worked out by hand (odd row count, one set empty)."""

from set_split import split_rows


def test_rows_split_by_set_with_their_full_and_elastic_scores():
    results = [
        {"mode": "full", "task": "t", "length": 8192, "row_accuracy": [1.0, 1.0, 0.0, 1.0, 0.5]},
        {"mode": "elastic", "task": "t", "length": 8192, "row_accuracy": [1.0, 0.0, 0.0, 1.0, 0.5],
         "row_sets": [0, 1, 1, 0, 0], "row_signals": [0.9, 0.2, 0.4, 0.8, 0.7]},
        {"mode": "elastic", "task": "u", "length": 8192, "row_accuracy": [1.0, 1.0, 1.0],
         "row_sets": [1, 1, 1], "row_signals": [0.1, 0.3, 0.2]},  # no full cell: left out
    ]
    floor, sparse = split_rows(results)
    assert (floor["set"], floor["rows"], floor["full"], floor["elastic"]) == (0, 3, 2.5 / 3, 2.5 / 3)
    assert (sparse["set"], sparse["rows"], sparse["full"], sparse["elastic"]) == (1, 2, 0.5, 0.0)
    assert floor["signal_min"] == 0.2 and floor["signal_median"] == 0.7
