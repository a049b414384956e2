"""The held-out report's bars against numbers worked out by hand on a small made-up table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from heldout_report import bars, markdown, plot  # noqa: E402

from elastic_attention.evaluation.suites import suite_of  # noqa: E402

#: (task, full, elastic, elastic MSR, heads, set shares)
CELLS = [("niah_single_1", 1.0, 0.96, 0.5, 0.9, [0.9, 0.1]), ("ruler_vt", 0.9, 0.81, 0.4, 0.7, [1.0, 0.0]),
         ("ruler_cwe", 0.3, 0.3, 0.9, 0.3, [0.0, 1.0]), ("passkey", 1.0, 0.98, 0.5, 1.0, [1.0, 0.0]),
         ("next_line", 0.5, 0.5, 0.9, 0.5, [0.0, 1.0])]


def _rows(length):
    rows = []
    for task, full, elastic, msr, heads, shares in CELLS:
        kind = suite_of(task).kind(task)
        base = {"task": task, "kind": kind, "length": length, "samples": 10}
        rows += [{**base, "mode": "full", "accuracy": full, "msr": 0.0},
                 {**base, "mode": "elastic", "accuracy": elastic, "msr": msr, "set_shares": shares},
                 {**base, "mode": "heads", "accuracy": heads, "msr": 0.64},
                 {**base, "mode": "sparse", "accuracy": 0.0, "msr": 1.0}]
    return rows


def test_the_bars_as_worked_out_by_hand(tmp_path):
    rows = _rows(8192) + _rows(16384) + _rows(4096)
    suites = {row["task"]: suite_of(row["task"]).name for row in rows}
    report = bars(rows, suites)
    assert sorted(report) == [8192, 16384]
    item = report[8192]
    assert item["ruler_tasks"] == ["niah_single_1", "ruler_vt"]  # cwe: full 0.3 < 0.5
    assert item["ruler"] == pytest.approx({"niah_single_1": 0.96, "ruler_vt": 0.9})
    assert item["code"] == pytest.approx({"passkey": 0.98, "next_line": 1.0})
    assert item["ruler_mean"]["elastic"] == pytest.approx(0.93)
    assert item["ruler_mean"]["heads"] == pytest.approx((0.9 + 0.7 / 0.9) / 2)
    assert item["msr"] == pytest.approx((0.5 + 0.4 + 0.9 + 0.5 + 0.9) / 5)
    assert item["niah_on_sparsest"] == {"niah_single_1": 0.1}
    assert item["met"] == {"ruler_keep": False, "code_keep": True, "no_niah_on_sparsest": False, "ruler_margin": True,
                           "msr": True}
    text = markdown(rows, report)
    assert "| niah_single_1 | sensitive | 8192 | 1.00 | 0.96 (0.50) | 0.96 | 0.90 / 0.10 | 0.90 (0.64) | 0.00 |" in text
    assert "ruler_keep MISSED" in text and "msr met" in text
    plot(rows, suites, tmp_path / "pareto.png")
    assert (tmp_path / "pareto.png").stat().st_size > 0
