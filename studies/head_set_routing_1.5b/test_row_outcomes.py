"""row_outcomes.py: the rescored rows, the per-row ceiling, the full-or-all-SSA choice and elastic's losses
against a brute-force count over hand-made predictions of synthetic rows."""

import json

import pytest

import row_outcomes

LENGTH, ROWS = 256, 7
#: mode -> task -> which rows it answers (1) or misses (0).
ANSWERED = {
    "full": {"needle_single": [1, 1, 1, 0, 1, 1, 0], "local_recall": [1, 0, 1, 1, 0, 1, 1]},
    "sparse": {"needle_single": [0, 0, 1, 0, 0, 0, 0], "local_recall": [1, 1, 1, 1, 0, 1, 1]},
    "elastic": {"needle_single": [1, 0, 1, 1, 1, 0, 0], "local_recall": [1, 1, 0, 1, 0, 1, 1]},
}


def _results() -> list[dict]:
    from elastic_attention.evaluation.suites import suite_of

    results = []
    for task in ("needle_single", "local_recall"):
        rows = suite_of(task).generate(task, LENGTH, 0, ROWS, None)
        for mode, answered in ANSWERED.items():
            predictions = [row.answer if hit else "no idea" for row, hit in zip(rows, answered[task])]
            results.append({"mode": mode, "task": task, "kind": suite_of(task).kind(task), "length": LENGTH,
                            "samples": ROWS, "accuracy": sum(answered[task]) / ROWS, "msr": 0.5,
                            "predictions": predictions})
    return results


def test_ceiling_full_or_sparse_and_losses_match_a_brute_force_count():
    script = row_outcomes
    from elastic_attention.evaluation.frontier import point

    results = _results()
    scores = script.row_scores(results, None, seed=0)
    assert scores[("elastic", "needle_single", LENGTH)] == [1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    full = [r for r in results if r["mode"] == "full"]

    expected_ceiling, expected_either, expected_msr = 0.0, 0.0, 0.0
    for task in ("needle_single", "local_recall"):
        columns = [ANSWERED[mode][task] for mode in ANSWERED]
        full_accuracy = sum(ANSWERED["full"][task]) / ROWS
        expected_ceiling += sum(max(column) for column in zip(*columns)) / ROWS / full_accuracy / 2
        f, s = ANSWERED["full"][task], ANSWERED["sparse"][task]
        expected_either += sum(s[i] if s[i] >= f[i] else f[i] for i in range(ROWS)) / ROWS / full_accuracy / 2
        expected_msr += sum(s[i] >= f[i] for i in range(ROWS)) / ROWS / 2
    ceiling = point([*script.best_of_rows(scores, LENGTH), *full], script.CEILING, LENGTH)
    either = point([*script.full_or_sparse_rows(scores, LENGTH), *full], script.FULL_OR_SPARSE, LENGTH)
    assert ceiling.retention == pytest.approx(expected_ceiling)
    assert either.retention == pytest.approx(expected_either)
    assert either.msr == pytest.approx(expected_msr)
    only_full = point([*script.best_of_rows(scores, LENGTH, modes=["full"]), *full], script.CEILING, LENGTH)
    assert only_full.retention == pytest.approx(1.0)

    assert script.losses_against_full(scores, "needle_single", LENGTH) == [1, 5]
    assert script.losses_against_full(scores, "local_recall", LENGTH) == [2]
    choices = {"set_msrs": [0.25, 0.5, 1.0], "logits": {f"needle_single@{LENGTH}": [[0, 3, 1]] * 5 + [[9, 0, 0]] * 2}}
    assert script.chosen_msrs(choices, "needle_single", LENGTH) == [0.5] * 5 + [0.25] * 2
    assert script.chosen_msrs(choices, "local_recall", LENGTH) is None
    with pytest.raises(ValueError, match="7 rows of needle_single at 256 tokens, the choices 5"):
        script.chosen_msrs({**choices, "logits": {f"needle_single@{LENGTH}": [[0, 1, 2]] * 5}}, "needle_single",
                           LENGTH, rows=ROWS)


def test_a_cell_whose_rows_do_not_score_its_accuracy_is_refused():
    script = row_outcomes
    results = _results()
    results[0]["accuracy"] = 1.0
    with pytest.raises(ValueError, match="pass the evaluation's --seed"):
        script.row_scores(results, None, seed=0)
    with pytest.raises(ValueError, match="rebuilt here score"):
        script.row_scores(_results(), None, seed=1)
    results = _results()
    results[2]["predictions"] = results[2]["predictions"][:-1]
    with pytest.raises(ValueError, match="6 predictions for 7 samples"):
        script.row_scores(results, None, seed=0)


def test_main_reads_an_eval_file_and_its_choices(tmp_path, capsys):
    from elastic_attention.assets import TINY_BACKBONE

    script = row_outcomes
    eval_json, choices_json = tmp_path / "eval.json", tmp_path / "choices.json"
    eval_json.write_text(json.dumps({"seed": 0, "results": _results()}))
    choices_json.write_text(json.dumps({"set_msrs": [0.5, 1.0],
                                        "logits": {f"needle_single@{LENGTH}": [[1, 0]] * 3 + [[0, 1]] * 4}}))
    out = tmp_path / "outcomes.json"
    summary = script.main([str(eval_json), "--model", str(TINY_BACKBONE), "--choices", str(choices_json),
                           "--out", str(out)])
    assert json.loads(out.read_text())["lengths"][str(LENGTH)]["elastic_losses"]["local_recall"]["rows"] == [2]
    at = summary["lengths"][LENGTH]
    assert at["elastic_losses"]["needle_single"] == {"rows": [1, 5], "chosen_set_msr": ["0.500", "1.000"]}
    assert at["elastic_losses"]["local_recall"] == {"rows": [2], "chosen_set_msr": []}
    assert at["full_or_sparse"]["msr"] == pytest.approx((3 / 7 + 7 / 7) / 2)  # all-SSA ties full on rows 2, 3, 6
    assert "elastic below full on needle_single: 2 rows (chosen sets' MSR: 0.500, 1.000)" in capsys.readouterr().out
    # the same for other modes; a mode the file does not hold is left out
    summary = script.main([str(eval_json), "--model", str(TINY_BACKBONE), "--losses-of", "sparse,heads@0.5"])
    assert summary["lengths"][LENGTH]["losses"] == {"sparse": {"needle_single": [0, 1, 4, 5], "local_recall": []},
                                                    "heads@0.5": {}}
    assert "below full on needle_single: sparse [0, 1, 4, 5]\n" in capsys.readouterr().out


def test_the_choice_under_an_msr_floor_against_every_choice_enumerated():
    """Oracle: every per-row (3^8) and per-task (3^2) choice enumerated, the best that reaches each floor."""
    import itertools
    import random

    script = row_outcomes
    rng = random.Random(4)
    msrs = {"full": 0.0, "half": 0.5, "sparse": 1.0}
    rows = {"a": 5, "b": 3}  # tasks of unequal row counts: each task's rows share its weight
    scores = {(mode, task, LENGTH): [float(rng.random() < p) if task == "a" else rng.random() for _ in range(n)]
              for mode, p in (("full", 0.9), ("half", 0.7), ("sparse", 0.3)) for task, n in rows.items()}
    full = {task: sum(scores[("full", task, LENGTH)]) for task in rows}
    assert all(full.values())

    def outcome(choice):  # choice: one mode per row of task a then task b
        retention, msr, start = 0.0, 0.0, 0
        for task, n in rows.items():
            picked = choice[start : start + n]
            retention += sum(scores[(m, task, LENGTH)][i] for i, m in enumerate(picked)) / full[task] / 2
            msr += sum(msrs[m] for m in picked) / n / 2
            start += n
        return retention, msr

    every_row = [outcome(c) for c in itertools.product(msrs, repeat=8)]
    every_task = [outcome((a,) * 5 + (b,) * 3) for a, b in itertools.product(msrs, repeat=2)]
    floors = [0.0, 0.3, 0.55, 0.8, 1.0]
    largest_row_value = max(max(scores[(m, t, LENGTH)]) / full[t] / 2 for m in msrs for t in rows)
    for per_task, enumerated in ((False, every_row), (True, every_task)):
        for found in script.oracle_frontier(scores, LENGTH, msrs, floors, per_task=per_task):
            best = max(r for r, m in enumerated if m >= found["msr_floor"] - 1e-12)
            assert found["bound"] >= best - 1e-12  # the relaxation bounds every choice
            assert found["reached_msr"] >= found["msr_floor"] - 1e-12
            assert found["reached"] <= best + 1e-12  # and the choice it gives exists
            assert (found["reached"], found["reached_msr"]) in [(pytest.approx(r), pytest.approx(m))
                                                               for r, m in enumerated]
            assert found["reached"] >= found["bound"] - (1.0 if per_task else largest_row_value) - 1e-12
    with pytest.raises(ValueError, match="above every mode's MSR"):
        script.oracle_frontier(scores, LENGTH, {"full": 0.0, "half": 0.5}, [0.6])
    del scores[("half", "b", LENGTH)]
    with pytest.raises(ValueError, match="no cell at 256 tokens for half b: leave those modes out"):
        script.oracle_frontier(scores, LENGTH, msrs, [0.5])


def test_modes_of_one_msr_each():
    script = row_outcomes
    results = [{"mode": "heads@0.4", "length": 8, "msr": 0.39}, {"mode": "heads@0.4", "length": 8, "msr": 0.39},
               {"mode": "elastic", "length": 8, "msr": 0.5}, {"mode": "elastic", "length": 8, "msr": 0.7}]
    assert script.mode_msrs_of(results, ["heads@0.4"], 8) == {"heads@0.4": pytest.approx(0.39)}
    with pytest.raises(ValueError, match="elastic cells at 8 tokens have MSRs from 0.5000 to 0.7000"):
        script.mode_msrs_of(results, ["elastic"], 8)
    with pytest.raises(ValueError, match="no sparse cell at 8 tokens"):
        script.mode_msrs_of(results, ["sparse"], 8)


def test_main_gives_the_choice_under_msr_floors(tmp_path, capsys):
    from elastic_attention.assets import TINY_BACKBONE

    script = row_outcomes
    eval_json = tmp_path / "eval.json"
    results = _results()
    for cell in results:
        cell["msr"] = {"full": 0.0, "sparse": 1.0}.get(cell["mode"], 0.5)
    eval_json.write_text(json.dumps({"seed": 0, "results": results}))
    summary = script.main([str(eval_json), "--model", str(TINY_BACKBONE), "--oracle-modes", "full,sparse",
                           "--msr-floors", "0.2,0.9"])
    oracle = summary["lengths"][LENGTH]["oracle"]
    assert oracle["modes"] == {"full": 0.0, "sparse": 1.0}
    # per row, each row's better mode: needle_single keeps 5/5 of full attention, local_recall 6/5 (all-SSA answers
    # its row 1); the floor is met by moving rows where the two tie to all-SSA, one row (1/14 of MSR) at a time
    assert oracle["per_row"][0] == {"msr_floor": 0.2, "bound": pytest.approx(1.1), "reached": pytest.approx(1.1),
                                    "reached_msr": pytest.approx(3 / 14)}
    assert oracle["per_task"][1]["reached_msr"] >= 0.9
    assert "per task, average MSR >= 0.90: at most" in capsys.readouterr().out


def test_a_routers_score_predicted_from_its_choices_and_the_sets_cells():
    """Oracle: the rows' scores picked by hand from each chosen set's cell."""
    script = row_outcomes
    from elastic_attention.evaluation.frontier import point

    results = _results()
    for cell in results:  # "elastic" plays a set's cell here: the set at MSR 0.5; all-SSA the set at 1.0
        cell["mode"] = {"elastic": "heads@0.5"}.get(cell["mode"], cell["mode"])
    scores = script.row_scores(results, None, seed=0)
    choices = {"set_msrs": [0.5, 1.0], "logits": {  # 9 rows of needle_single chosen: only the 7 of the cells count
        f"needle_single@{LENGTH}": [[1, 0], [0, 1], [1, 0], [1, 0], [0, 1], [0, 1], [1, 0], [0, 1], [0, 1]],
        f"local_recall@{LENGTH}": [[0, 1]] * 7}}
    with pytest.raises(ValueError, match="names 1 modes, the router has 2 sets"):
        script.predicted_rows(scores, choices, ["sparse"], LENGTH)
    rows = {row["task"]: row for row in script.predicted_rows(scores, choices, ["heads@0.5", "sparse"], LENGTH)}
    chosen = [ANSWERED["elastic"]["needle_single"], ANSWERED["sparse"]["needle_single"]]
    by_hand = [chosen[c][r] for r, c in enumerate([0, 1, 0, 0, 1, 1, 0])]
    assert rows["needle_single"]["accuracy"] == pytest.approx(sum(by_hand) / 7)
    assert rows["needle_single"]["msr"] == pytest.approx((4 * 0.5 + 3 * 1.0) / 7)
    assert rows["needle_single"]["samples"] == 7
    assert rows["local_recall"]["accuracy"] == pytest.approx(sum(ANSWERED["sparse"]["local_recall"]) / 7)
    full = [r for r in results if r["mode"] == "full"]
    measured = {("elastic", "needle_single", LENGTH): [1.0] * 7 + [0.0] * 3,
                ("elastic", "local_recall", LENGTH): [0.0] * 10}
    compared = script.compare_prediction(scores, choices, ["heads@0.5", "sparse"], LENGTH, full, measured)
    expected = point([*rows.values(), *full], "predicted", LENGTH)
    assert compared["retention"] == pytest.approx(expected.retention)
    full_accuracy = {t: sum(ANSWERED["full"][t]) / 7 for t in ANSWERED["full"]}
    assert compared["measured_retention"] == pytest.approx((1.0 / full_accuracy["needle_single"] + 0.0) / 2)
    assert compared["not_predicted"] == []
    del choices["logits"][f"local_recall@{LENGTH}"]  # a task without choices is named, and no mean is made up
    partial = script.compare_prediction(scores, choices, ["heads@0.5", "sparse"], LENGTH, full, measured)
    assert partial["not_predicted"] == ["local_recall"] and partial["retention"] is None
