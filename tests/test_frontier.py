"""evaluation.frontier and scripts/frontier_report.py: retention points, curves, the sensitive target, the plot."""

from __future__ import annotations

import json
import math

import pytest
from conftest import load_script

from elastic_attention.errors import InputError
from elastic_attention.evaluation.frontier import (curve, highest_msr_keeping, plot_pareto, point, routed_by_kind,
                                                   routed_by_task, with_full)

KINDS = {"needle": "sensitive", "chain": "sensitive", "recent": "robust"}
FULL = {"needle": 1.0, "chain": 0.8, "recent": 0.5}
#: mode -> (MSR, accuracy per task) at 16K
MODES = {
    "sparse": (1.0, {"needle": 0.0, "chain": 0.0, "recent": 0.5}),
    "heads@0.25": (0.25, {"needle": 1.0, "chain": 0.8, "recent": 0.5}),
    "heads@0.5": (0.5, {"needle": 1.0, "chain": 0.79, "recent": 0.55}),
    "heads@0.75": (0.75, {"needle": 1.0, "chain": 0.4, "recent": 0.5}),
    "static@0.5": (0.5, {"needle": 0.2, "chain": 0.0, "recent": 0.5}),
    "elastic": (0.6, {"needle": 1.0, "chain": 0.8, "recent": 0.5}),
}


def rows(length=16384, modes=MODES):
    made = [{"mode": "full", "task": task, "kind": KINDS[task], "length": length, "accuracy": FULL[task], "msr": 0.0}
            for task in KINDS]
    for mode, (msr, accuracy) in modes.items():
        made += [{"mode": mode, "task": task, "kind": KINDS[task], "length": length, "accuracy": accuracy[task],
                  "msr": msr + (0.1 if mode == "elastic" and KINDS[task] == "robust" else 0.0)} for task in KINDS]
    return made


def test_a_point_is_the_equal_weight_mean_of_each_tasks_retention():
    found = point(rows(), "heads@0.5", 16384)
    assert found.tasks == pytest.approx({"needle": 1.0, "chain": 0.79 / 0.8, "recent": 1.1})
    assert found.retention == pytest.approx((1.0 + 0.79 / 0.8 + 1.1) / 3) and found.msr == 0.5
    elastic = point(rows(), "elastic", 16384)
    assert elastic.msr == pytest.approx((0.6 + 0.6 + 0.7) / 3)
    assert point(rows(), "heads@0.5", 8192) is None  # no cells at that length
    partial = [row for row in rows() if not (row["mode"] == "heads@0.5" and row["task"] == "chain")]
    assert point(partial, "heads@0.5", 16384) is None  # a task without its cell leaves no point
    assert [p.mode for p in curve(partial, "heads@", 16384)] == ["heads@0.25", "heads@0.75"]
    zero = [dict(row, accuracy=0.0) if row["mode"] == "full" and row["task"] == "recent" else row for row in rows()]
    assert math.isnan(point(zero, "heads@0.5", 16384).tasks["recent"])


def test_routing_by_kind_takes_each_kinds_cells_from_its_mode():
    """Oracle, by hand: needle and chain (sensitive) from heads@0.25, recent (robust) from sparse."""
    found = routed_by_kind(rows(), "heads@0.25", "sparse", 16384)
    assert found.tasks == pytest.approx({"needle": 1.0, "chain": 1.0, "recent": 1.0})
    assert found.msr == pytest.approx((0.25 + 0.25 + 1.0) / 3) and found.mode == "by kind"
    assert routed_by_kind(rows(), "heads@0.3", "sparse", 16384) is None  # no such mode: a cell is missing
    unlabelled = [{key: value for key, value in row.items() if key != "kind"} if row["task"] == "recent" else row
                  for row in rows()]
    with pytest.raises(ValueError, match="the rows of \\['recent'\\] at 16384 tokens have none"):
        routed_by_kind(unlabelled, "heads@0.25", "sparse", 16384)
    report = load_script("frontier_report").by_kind_lines(rows(), [16384], ("heads@0.25", "sparse"))
    # the searched set at MSR 0.5 (between heads@0.5 at 102.9% and heads@0.75 at 83.3%): 102.9%
    assert report == ("by task kind (heads@0.25 / sparse) at 16384 tokens: MSR 0.500, mean retention 100.0%; the "
                      "searched set there keeps 102.9% (-2.9 points)\n")


def test_routing_by_task_takes_each_tasks_sparsest_mode_that_keeps_its_share():
    """Oracle, by hand (retention per mode: needle 100% up to heads@0.75, 0% on sparse; chain 100% / 98.75% / 50% /
    0% on heads@0.25 / 0.5 / 0.75 / sparse; recent 100% / 110% / 100% / 100%)."""
    modes = ["heads@0.25", "heads@0.5", "heads@0.75", "sparse"]
    found, chosen = routed_by_task(rows(), modes, 16384, {"sensitive": 0.97, "robust": 0.99})
    assert chosen == {"needle": "heads@0.75", "chain": "heads@0.5", "recent": "sparse"}
    assert found.mode == "by task" and found.msr == pytest.approx((0.75 + 0.5 + 1.0) / 3)
    assert found.retention == pytest.approx((1.0 + 0.79 / 0.8 + 1.0) / 3)
    _, chosen = routed_by_task(rows(), modes, 16384, {"sensitive": 0.99, "robust": 0.99})
    assert chosen["chain"] == "heads@0.25"
    found, chosen = routed_by_task(rows(), modes, 16384, {"sensitive": 1.01, "robust": 1.05})
    assert chosen == {"needle": "full", "chain": "full", "recent": "heads@0.5"}  # none keeps 101%: full attention
    assert found.msr == pytest.approx(0.5 / 3) and found.retention == pytest.approx((1.0 + 1.0 + 1.1) / 3)
    partial = [row for row in rows() if not (row["mode"] == "heads@0.75" and row["task"] == "needle")]
    assert routed_by_task(partial, modes, 16384, {"sensitive": 0.97, "robust": 0.99})[1]["needle"] == "heads@0.5"
    assert routed_by_task(rows(), modes, 8192, {"sensitive": 0.97, "robust": 0.99}) is None  # nothing at 8K
    with pytest.raises(ValueError, match="task recent at 16384 tokens is of kind 'robust'"):
        routed_by_task(rows(), modes, 16384, {"sensitive": 0.97})
    report = load_script("frontier_report").by_task_lines(rows(), [16384], modes)
    # the searched set at MSR 0.75: heads@0.75 keeps (1 + 0.5 + 1) / 3 = 83.3%; 99.58% - 83.33% prints as +16.2
    assert report == ("by task, at the bars (sensitive >= 97%, robust >= 99%), at 16384 tokens: MSR 0.750, "
                      "MSR(robust) - MSR(sensitive) 0.375, mean retention 99.6%; the searched set there keeps 83.3% "
                      "(+16.2 points); needle heads@0.75 (100%), chain heads@0.5 (99%), recent sparse (100%)\n")


def test_the_report_shows_a_point_measured_on_some_tasks_without_a_mean():
    report = load_script("frontier_report")
    sensitive_only = rows() + [{"mode": "heads@0.1", "task": task, "kind": "sensitive", "length": 16384,
                                "accuracy": FULL[task] * 0.5, "msr": 0.1} for task in ("needle", "chain")]
    table = report.frontier_tables(sensitive_only, [16384])
    assert "| heads@0.1 | 0.100 | - | 50% | 50% | - |" in table
    assert "| heads@0.25 | 0.250 | 100.0% | 100% | 100% | 100% |" in table
    # the target reads the sensitive tasks' cells only: heads@0.1 is a point of it, and misses
    assert "below it heads@0.1 keeps chain 50%, needle 50%" in report.sensitive_target(sensitive_only, 16384, 0.98)


def test_the_target_is_the_highest_point_keeping_every_task():
    from elastic_attention.evaluation.frontier import points_missing

    points = curve(rows(), "heads@", 16384)
    assert [p.mode for p in points] == ["heads@0.25", "heads@0.5", "heads@0.75"]
    assert highest_msr_keeping(points, ["needle", "chain"], 0.98).mode == "heads@0.5"  # chain keeps 98.75%
    assert highest_msr_keeping(points, ["needle", "chain"], 0.99).mode == "heads@0.25"
    assert highest_msr_keeping(points, ["needle"], 0.98).mode == "heads@0.75"
    dip = dict(MODES, **{"heads@0.25": (0.25, {"needle": 0.5, "chain": 0.8, "recent": 0.5})})
    noisy = curve(rows(modes=dip), "heads@", 16384)
    assert highest_msr_keeping(noisy, ["needle"], 0.98).mode == "heads@0.75"  # a dip below does not stop it
    assert [p.mode for p in points_missing(noisy, ["needle"], 0.98, 0.75)] == ["heads@0.25"]
    assert highest_msr_keeping(noisy, ["needle", "chain"], 1.0) is None


def test_the_report_and_the_plot(tmp_path):
    report = load_script("frontier_report")
    frontier = tmp_path / "frontier.json"
    frontier.write_text(json.dumps({"results": [row for row in rows() + rows(8192) if row["mode"] != "elastic"]}))
    router = tmp_path / "router.json"
    router.write_text(json.dumps({"results": [row for row in rows() if row["mode"] == "elastic"]}))
    text = report.main([str(frontier), "--router", f"run one={router}", "--plot", str(tmp_path / "pareto.png"),
                        "--out", str(tmp_path / "frontier.md")])
    assert "sensitive target at 16384 tokens: MSR 0.500 (heads@0.5 keeps >= 98% on chain, needle); at heads@0.75 " \
           "chain keeps 50%\n" in text
    assert "MSR 0.750 (heads@0.75 keeps >= 98% on needle)" in report.main([str(frontier), "--target-tasks", "needle"])
    assert "| heads@0.5 | 0.500 | 102.9% | 100% | 99% | 110% |" in text and "### 8K" in text
    assert (tmp_path / "frontier.md").read_text() == text and (tmp_path / "pareto.png").stat().st_size > 10_000
    with pytest.raises(SystemExit):
        report.main([str(frontier), "--router", str(router)])


def test_the_plot_draws_every_router_run(tmp_path, monkeypatch):
    import matplotlib.axes

    drawn = []
    original = matplotlib.axes.Axes.plot
    monkeypatch.setattr(matplotlib.axes.Axes, "plot",
                        lambda self, *args, **kwargs: drawn.append(kwargs.get("label")) or original(self, *args, **kwargs))
    second = [dict(row, accuracy=row["accuracy"] / 2) if row["mode"] == "elastic" else row for row in rows()]
    plot_pareto([row for row in rows() if row["mode"] != "elastic"], {"first": rows(), "second": second}, [16384],
                tmp_path / "p.png", by_kind=("heads@0.25", "sparse"))
    assert drawn == ["joint searched head set", "retrieval-score static hybrid", "full attention", "all SSA",
                     "by task kind, no router (heads@0.25 / sparse)", "elastic: first", "elastic: second"]
    # more runs than colours: each still drawn, in a style of its own; more than the styles: refused, none dropped
    from elastic_attention.evaluation.frontier import ROUTER_STYLES

    drawn.clear()
    many = {f"run {index}": rows() for index in range(9)}
    plot_pareto([row for row in rows() if row["mode"] != "elastic"], many, [16384], tmp_path / "many.png")
    assert [label for label in drawn if label.startswith("elastic")] == [f"elastic: run {index}" for index in range(9)]
    with pytest.raises(InputError, match="router runs for one plot"):
        plot_pareto(rows(), {f"run {index}": rows() for index in range(len(ROUTER_STYLES) + 1)}, [16384],
                    tmp_path / "too_many.png")


def test_real_model_bars_compare_elastic_with_the_searched_set_at_its_msr():
    bars_script = load_script("studies/router_recipes_1.5b/real_model_bars.py")
    at_16k = rows(modes={"elastic": MODES["elastic"], "heads": (0.6, {"needle": 1.0, "chain": 0.6, "recent": 0.5})})
    at_8k = rows(8192, modes={"elastic": MODES["elastic"], "heads": (0.6, {"needle": 1.0, "chain": 0.8, "recent": 0.5})})
    lines = bars_script.heads_bar(at_16k + at_8k, [8192, 16384])
    # 16K: elastic keeps every task (100%), the set keeps chain 0.6 / 0.8: (1 + 0.75 + 1) / 3 = 91.7%, 8.3 points less
    assert lines == [
        "elastic's mean retention >= the searched set's + 2 points at 8K: missed (elastic 100.0% at MSR 0.633, heads "
        "100.0% at MSR 0.600: +0.0 points)",
        "elastic's mean retention >= the searched set's + 2 points at 16K: met (elastic 100.0% at MSR 0.633, heads "
        "91.7% at MSR 0.600: +8.3 points)"]
    table = bars_script.table(at_16k)
    assert table.splitlines()[0] == "| task | kind | length | full | elastic (MSR) | kept | heads (MSR) |"
    assert "| chain | sensitive | 16K | 0.800 | 0.800 (0.60) | 100% | 0.600 (0.60) |" in table


def test_a_router_point_divides_by_its_own_full_attention_cells_where_it_has_them():
    frontier = [row for row in rows() if row["mode"] != "elastic"]
    own_full = [dict(row, accuracy=row["accuracy"] * 0.5) for row in rows() if row["mode"] == "full"][:2]
    elastic = [row for row in rows() if row["mode"] == "elastic"]
    pooled = with_full(elastic + own_full, frontier)
    full = {row["task"]: row["accuracy"] for row in pooled if row["mode"] == "full"}
    assert full == {"needle": 0.5, "chain": 0.4, "recent": 0.5}  # needle and chain its own, recent the frontier's
    assert point(pooled, "elastic", 16384).tasks == pytest.approx({"needle": 2.0, "chain": 2.0, "recent": 1.0})
