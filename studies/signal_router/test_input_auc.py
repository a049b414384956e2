"""The input AUCs against a brute-force count of ordered pairs."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from input_auc import auc, input_aucs  # noqa: E402


def _slow_auc(scores, labels):
    pairs = [(p, n) for (p, lp), (n, ln) in itertools.product(zip(scores, labels), repeat=2) if lp and not ln]
    return sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in pairs) / len(pairs)


def test_auc_counts_ordered_pairs_with_ties_as_half():
    scores, labels = [0.3, 0.1, 0.3, 0.9, 0.2, 0.3], [True, False, False, True, False, True]
    assert auc(scores, labels) == pytest.approx(_slow_auc(scores, labels))
    assert auc([0.1, 0.2], [True, True]) != auc([0.1, 0.2], [True, True])  # NaN: one class only


def test_each_input_reads_its_largest_kv_head():
    records = [{"task": "t", "length": 8, "index": index, "statistics": ["mean", "max"], "queries": [1],
                "signal": [[[[value, 0.0]]], [[[0.0, 1.0 - value]]]]} for index, value in enumerate([0.9, 0.1, 0.5])]
    scores = {("t", 8, 0): {"full": 1.0, "sparse": 0.0}, ("t", 8, 1): {"full": 1.0, "sparse": 1.0},
              ("t", 8, 2): {"full": 0.0, "sparse": 0.0}}
    result = input_aucs(records, scores)
    assert result == {"mean q=1 layer 0": 1.0, "max q=1 layer 0": 0.0}
