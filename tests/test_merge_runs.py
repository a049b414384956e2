"""`scripts/merge_bench_results.py prefill`: runs of the prefill benchmark become one table whose elastic rows keep
the speedups over the dense models of their own run, whichever run the dense rows shown beside them came from."""

import json

import pytest

from conftest import load_script


def _prefill_run(date: str, seconds: dict[tuple[int, str], float]) -> dict:
    rows = [{"length": length, "model": model, "seconds": value, "peak_memory_gib": 1.0,
             **({"msr": 0.7, "esr_mean": 0.6} if model.startswith("elastic-") else {})}
            for (length, model), value in seconds.items()]
    return {"date": date, "device": "NVIDIA H200", "torch": "x", "command": f"bench prefill of {date}",
            "model": {"layers": 2}, "elastic": {"msr": 0.7}, "rows": rows}  # files before 2026-12 say "rows"


def test_merged_prefill_runs_keep_each_elastic_rows_own_speedups(tmp_path):
    old = _prefill_run("d0", {(8, "sdpa"): 3.0, (8, "fa4_dense"): 2.0, (8, "elastic-fa-ssa"): 1.0,
                              (16, "fa4_dense"): 8.0, (16, "elastic-xa-ssa"): 2.0})
    new = _prefill_run("d1", {(8, "fa4_dense"): 4.0, (8, "elastic-fa-xa"): 0.5})
    paths = []
    for name, document in (("old.json", old), ("new.json", new)):
        paths.append(tmp_path / name)
        paths[-1].write_text(json.dumps(document))
    load_script("merge_bench_results").main(["prefill", *map(str, paths), "--out", str(tmp_path / "prefill.json")])
    merged = json.loads((tmp_path / "prefill.json").read_text())
    rows = {(row["length"], row["model"]): row for row in merged["results"]}
    assert [(row["length"], row["model"], row["run"]) for row in merged["results"]] == [
        (8, "sdpa", 0), (8, "fa4_dense", 1), (8, "elastic-fa-ssa", 0), (16, "fa4_dense", 0),
        (16, "elastic-xa-ssa", 0), (8, "elastic-fa-xa", 1)]
    assert rows[8, "elastic-fa-ssa"]["speedup_vs_fa4_dense"] == pytest.approx(2.0)  # its run's 2.0 s, not 4.0
    assert rows[8, "elastic-fa-ssa"]["speedup_vs_sdpa"] == pytest.approx(3.0)
    assert rows[8, "elastic-fa-xa"]["speedup_vs_fa4_dense"] == pytest.approx(8.0)
    assert "speedup_vs_sdpa" not in rows[8, "elastic-fa-xa"]  # its run timed no sdpa
    assert [run["source"] for run in merged["runs"]] == ["old.json", "new.json"] and "rows" not in merged
    table = (tmp_path / "prefill.md").read_text()
    assert "Prefill benchmark, run 1, NVIDIA H200, d1: `bench prefill of d1`" in table
    assert "| 8 | elastic-fa-xa | 0.500 | - | 8.00x | 0.70 | 0.60 | 1.0 | 1 |" in table


def test_prefill_runs_of_another_shape_are_refused(tmp_path):
    from elastic_attention.errors import InputError

    paths = []
    for name, document in (("a.json", _prefill_run("d0", {(8, "sdpa"): 1.0})),
                           ("b.json", {**_prefill_run("d1", {(8, "sdpa"): 1.0}), "model": {"layers": 32}})):
        paths.append(tmp_path / name)
        paths[-1].write_text(json.dumps(document))
    with pytest.raises(InputError, match="model"):
        load_script("merge_bench_results").main(["prefill", *map(str, paths), "--out", str(tmp_path / "m.json")])
