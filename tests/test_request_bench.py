"""`bench request` on a CPU with the tiny backbone: every field the results scripts read, the dense cache's bytes by
formula, the routed cache within the issue's 10% of what its routing implies, tokens equal the reference path."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import load_script

from elastic_attention.assets import TINY_BACKBONE
from elastic_attention.bench import request
from elastic_attention.bench.merge_runs import RULES, merge_runs
from elastic_attention.cli import main as cli_main
from elastic_attention.errors import InputError

#: The studies' scripts these tests run (the request benchmark's bars, the adapter's stored precision, a profile)
REQUEST_BARS = "studies/request_speed_1.5b/request_bars.py"
ADAPTER_PRECISION = "studies/router_recipes_1.5b/adapter_precision.py"
PROFILE_DECODE_GRAPH = "studies/kernel_tuning/profile_decode_graph.py"


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    import elastic_attention as ea
    from elastic_attention.evaluation.pipeline import load_backbone

    model, _ = load_backbone(TINY_BACKBONE, "cpu")
    torch.manual_seed(0)  # untrained routers: with this seed they send 4 of the 8 heads to sparse attention
    ea.attach(model, ea.ElasticConfig(block_size=32, sink_tokens=32, local_tokens=128, xa_stride=8))
    return ea.save_router(model, tmp_path_factory.mktemp("router") / "router")


@pytest.mark.slow  # about 35 s on a 2-core Xeon: four request cells end to end through the benchmark
def test_request_rows_carry_the_issues_fields_and_true_cache_sizes(router, tmp_path):
    out = tmp_path / "request_tiny.json"
    assert cli_main(["bench", "request", "--model", str(TINY_BACKBONE), "--router", str(router), "--tasks",
                     "needle_single,local_recall", "--suite", "synthetic", "--lengths", "600", "--batch", "1,3",
                     "--rows", "2", "--new-tokens", "5", "--reference-rows", "2", "--device", "cpu", "--dtype",
                     "float32", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = result["results"]
    assert result["dense_setups"] == ["sdpa"]  # no FlashAttention-4 and no CUDA graphs on a CPU, each said why
    assert set(result["dense_setups_missing"]) == {"flash_attention_4", "static_cache_compiled", "static_cache_graph",
                                                   "sdpa_compiled_layers"}
    # elastic under generate (captured steps as they are, compiled), then in the bench's own loop (its tokens equal
    # the reference path's below, as generate's do)
    assert [(r["prompt_kind"], r["batch"], r["mode"], r.get("compile_decode"), r["decode_loop"]) for r in rows] == [
        (kind, batch, *setup) for batch in (1, 3) for kind in ("sensitive", "robust")
        for setup in (("dense", None, "generate"), ("elastic", False, "generate"), ("elastic", True, "generate"),
                      ("elastic", True, "own"))]
    config = json.loads((TINY_BACKBONE / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    for row in rows:
        assert set(request.ROW_FIELDS) <= set(row) and row["length"] == 600
        assert row["first_call_s"] > 0 and row["timed_calls"] == 3 and row["tokens_same_in_every_call"] is True
        if row["mode"] == "dense":
            assert row["baseline"] == "sdpa" and row["msr"] == 0.0 and row["tokens_equal_reference"] is None
            assert row["leading_tokens_equal"] == [5] * row["batch"]  # against itself: the first dense setup
            cached = row["prompt_tokens"] + 5 - 1
            assert row["kv_cache_bytes"] == (2 * config["num_hidden_layers"] * config["num_key_value_heads"]
                                             * row["batch"] * cached * head_dim * 4)
        else:
            assert row["baseline"] is None and row["msr"] == pytest.approx(0.5)
            assert row["tokens_equal_reference"] is True  # float32 on the CPU: the same tokens as the reference path
            assert row["reference_rows_checked"] == min(2, row["batch"])
            assert row["leading_tokens_equal"] == [5] * row["reference_rows_checked"]
            assert row["divergences"] == [None] * row["reference_rows_checked"]
            assert 1.0 <= row["kv_cache_bytes"] / row["kv_cache_bytes_implied"] <= 1.10
            assert row["ttft_s"] > 0 and row["decode_tokens_per_s"] > 0 and row["speedup_ttft_over"] == "sdpa"
        # the decode time's parts: the first step, then the median of the three later ones
        assert 0 < row["first_step_s"] < row["decode_s"] and 0 < row["median_step_s"] < row["decode_s"]
        assert row["steady_decode_tokens_per_s"] == pytest.approx(row["batch"] / row["median_step_s"])
    table = out.with_suffix(".md").read_text()
    assert table.count("| sensitive | 600 |") == 8 and "| elastic | router | 0.50 |" in table
    assert "| elastic | router, compiled, own loop | 0.50 |" in table
    assert "| elastic | router, compiled | 0.50 |" in table and "| true | 5 of 5 |" in table
    lines = load_script(REQUEST_BARS).main([str(out)])  # the bars script reads what the bench writes
    assert lines[0].endswith("not measured (no cell of dense and elastic rows)")  # no 32K cell
    assert lines[1].endswith("not measured (no cell of dense and elastic rows)")  # no batch-8 cell
    assert "(600 batch 1: " in lines[2] and ", 600 batch 3: " in lines[2]
    assert lines[4].startswith("KV-cache bytes within 10% of what the routing implies: met")
    assert lines[5] == "tokens equal the reference path's: met"


def test_token_clock_splits_the_decode_time_into_its_first_step_and_the_median_later_one():
    """Oracle: stamps set by hand (seconds since the start)."""
    from elastic_attention.bench.timing import TIMING_FIELDS, TokenClock

    clock = TokenClock(torch.device("cpu"))
    clock.stamps = [0.5, 0.9, 0.91, 0.93, 0.94]  # first token, a 0.4 s first step, then steps of 10, 20, 10 ms
    timings = clock.timings(batch=4)
    assert tuple(timings) == TIMING_FIELDS  # warm_then_timed takes the median of each
    assert timings["ttft_s"] == 0.5 and timings["decode_s"] == pytest.approx(0.44)
    assert timings["decode_tokens_per_s"] == pytest.approx(4 * 4 / 0.44)
    assert timings["first_step_s"] == pytest.approx(0.4) and timings["median_step_s"] == pytest.approx(0.01)
    assert timings["steady_decode_tokens_per_s"] == pytest.approx(400)
    clock.stamps = [0.5, 0.9]  # two tokens: no later step to take a median of
    timings = clock.timings(batch=1)
    assert timings["first_step_s"] == pytest.approx(0.4)
    assert timings["median_step_s"] is None and timings["steady_decode_tokens_per_s"] is None


def test_warm_then_timed_reports_each_timing_as_its_median_over_the_timed_calls():
    """Oracle: scripted calls (a warm one, then three timed ones with timings set by hand); each field's median and
    the largest peak picked by hand."""
    from elastic_attention.bench.timing import TIMING_FIELDS, warm_then_timed
    from elastic_attention.errors import InputError

    tokens = torch.tensor([[5, 6]])
    scripted = [  # ttft_s, decode_s, first_step_s, peak_memory_bytes, tokens
        (9.0, 5.0, 4.0, 70, tokens),  # the warm call: only its time to the last token counts
        (0.30, 0.20, 0.011, 10, tokens), (0.10, 0.40, 0.013, 30, tokens), (0.20, 0.30, 0.012, 20, tokens + 1)]
    calls = iter(scripted)

    def generate(model, ids, mask, new_tokens, pad_id):
        ttft, decode, first_step, peak, generated = next(calls)
        return {"ttft_s": ttft, "decode_s": decode, "decode_tokens_per_s": 2 / decode, "first_step_s": first_step,
                "median_step_s": decode / 10, "steady_decode_tokens_per_s": 10 / decode,
                "peak_memory_bytes": peak, "kv_cache_bytes": 7, "tokens": generated}

    measured = warm_then_timed(None, None, None, 2, 0, generate=generate, timed_calls=3)
    assert measured["ttft_s"] == 0.20 and measured["decode_s"] == 0.30 and measured["first_step_s"] == 0.012
    assert measured["decode_tokens_per_s"] == pytest.approx(2 / 0.30)  # the median call's rate, not a mean
    assert measured["median_step_s"] == pytest.approx(0.03)
    assert measured["steady_decode_tokens_per_s"] == pytest.approx(10 / 0.30)
    assert set(TIMING_FIELDS) <= set(measured) and measured["peak_memory_bytes"] == 30
    assert measured["first_call_s"] == 14.0 and measured["timed_calls"] == 3 and measured["kv_cache_bytes"] == 7
    assert torch.equal(measured["tokens"], tokens + 1) and measured["tokens_same_in_every_call"] is False
    with pytest.raises(InputError, match="timed_calls must be at least 1"):
        warm_then_timed(None, None, None, 2, 0, generate=generate, timed_calls=0)


def request_row(kind, length, batch, mode, ttft, decode, setup, kv=1.0, equal=True):
    row = {"prompt_kind": kind, "length": length, "batch": batch, "mode": mode, "ttft_s": ttft,
           "decode_tokens_per_s": decode}
    if mode == "dense":
        return {**row, "baseline": setup}
    return {**row, "baseline": None, "compile_decode": setup == "compiled", "kv_cache_bytes": 100 * kv,
            "kv_cache_bytes_implied": 100, "tokens_equal_reference": equal}


def test_request_bars_judge_the_best_setups_against_the_best_baseline():
    """Oracle: verdicts worked out by hand from the timings (the best dense setup per metric: SDPA's first token,
    the static graph's decode; the best elastic setup per metric)."""
    rows = [
        request_row("robust", 32768, 8, "dense", 3.0, 100.0, "sdpa"),
        request_row("robust", 32768, 8, "dense", 3.3, 150.0, "static_cache_graph"),
        request_row("robust", 32768, 8, "elastic", 2.0, 230.0, "plain"),    # ttft 1.50x, decode 1.53x
        request_row("robust", 32768, 8, "elastic", 2.2, 250.0, "compiled"),  # decode 1.67x: the best
        request_row("robust", 32768, 1, "dense", 1.0, 40.0, "sdpa"),
        request_row("robust", 32768, 1, "elastic", 0.75, 45.0, "plain"),     # ttft 1.33x < 1.4
        request_row("sensitive", 16384, 1, "dense", 1.0, 40.0, "sdpa"),
        request_row("sensitive", 16384, 1, "elastic", 1.04, 39.0, "plain", kv=1.12, equal=False),  # 0.96x, 0.975x
    ]
    rows[-1]["divergences"] = [None, {"step": 3, "margin": 0.125, "top_logit": 21.5}]
    lines = load_script(REQUEST_BARS).bars(rows)
    assert lines[0].startswith("time to first token >= 1.4x faster, robust prompts at 32K: missed (32K batch 1: "
                               "1.33x (router over sdpa), 32K batch 8: 1.50x (router over sdpa))")
    assert lines[1] == ("decode >= 1.6x faster, robust prompts at batch 8: met (32K batch 8: 1.67x "
                        "(router, compiled over static_cache_graph))")
    assert lines[2].startswith("time to first token at most 5% slower, sensitive prompts: met (16K batch 1: 0.96x")
    assert lines[3].startswith("decode at most 5% slower, sensitive prompts: met (16K batch 1: 0.97x")
    assert lines[4] == "KV-cache bytes within 10% of what the routing implies: missed (farthest 1.120x)"
    assert lines[5] == ("tokens equal the reference path's: missed: sensitive 16K batch 1 (router; widest margin 0.125 "
                        "at logit 21.5)")
    assert len(lines) == 6  # no row has a steady-state rate
    for row, steady in zip(rows[:4], (110.0, 200.0, 330.0, 300.0)):
        row["steady_decode_tokens_per_s"] = steady
    lines = load_script(REQUEST_BARS).bars(rows)
    assert lines[1].startswith("decode >= 1.6x faster, robust prompts at batch 8: met (32K batch 8: 1.67x")
    assert lines[6] == ("not a bar: decode at batch 8 in the steady state (median step after the first): robust 32K: "
                        "1.65x (router over static_cache_graph)")


def test_divergences_read_the_reference_logits_where_each_sequence_first_differs():
    """Oracle: margins worked out by hand from the reference's scores at the first differing step."""
    reference = torch.tensor([[5, 6, 7], [1, 2, 3], [4, 4, 4]])
    tokens = torch.tensor([[5, 6, 7], [1, 0, 9], [8, 4, 4], [0, 0, 0]])  # the fourth row is not checked
    logits = torch.zeros(3, 3, 10)
    logits[1, 1, 2], logits[1, 1, 0] = 20.0, 19.875  # row 1 differs at step 1: a near-tie
    logits[2, 0, 4], logits[2, 0, 8] = 12.0, 3.0      # row 2 differs at step 0 by a wide margin
    assert request.divergences(tokens, reference, logits) == [
        None, {"step": 1, "margin": 0.125, "top_logit": 20.0}, {"step": 0, "margin": 9.0, "top_logit": 12.0}]
    assert request.widest_margin({"divergences": request.divergences(tokens, reference, logits)}) == (
        "widest margin 9 at logit 12.0")


def test_leading_tokens_equal_counts_each_sequences_agreeing_prefix():
    """Oracle: a per-token walk of each row."""
    generator = torch.Generator().manual_seed(3)
    reference = torch.randint(0, 4, (5, 9), generator=generator)
    tokens = torch.cat([reference, torch.randint(0, 4, (2, 9), generator=generator)])  # 2 more rows, not compared
    tokens[1, 6], tokens[2, 0], tokens[4, 8] = (tokens[1, 6] + 1) % 4, (tokens[2, 0] + 1) % 4, (tokens[4, 8] + 1) % 4
    expected = []
    for row in range(5):
        count = 0
        while count < 9 and tokens[row, count] == reference[row, count]:
            count += 1
        expected.append(count)
    assert request.leading_tokens_equal(tokens, reference) == expected == [9, 6, 0, 9, 8]


def test_dense_setups_asked_for_run_in_their_order_and_the_rest_say_why_not():
    setups = [("sdpa", "sdpa", {}), ("flash_attention_4", "flash_attention_4", {}),
              ("static_cache_graph", "flash_attention_4", {})]
    chosen, missing = request.chosen_setups(setups, {"static_cache_compiled": "CUDA graphs need a GPU"},
                                            ["static_cache_graph", "flash_attention_4"])
    assert [name for name, _, _ in chosen] == ["flash_attention_4", "static_cache_graph"]
    assert missing == {"static_cache_compiled": "CUDA graphs need a GPU", "sdpa": "not asked for (--dense-setups)"}


def test_bad_request_arguments_are_refused(capsys):
    for argv, message in ((["--tasks", "passkey"], "--tasks takes SENSITIVE,ROBUST"),
                          (["--new-tokens", "1"], "--new-tokens must be at least 2"),
                          (["--compile-decode", "yes"], "takes off, on or off,on; got 'yes'"),
                          (["--reference-rows", "0"], "--reference-rows must be at least 1, got 0"),
                          (["--dense-setups", "sdpa,fa5"], "--dense-setups takes names among sdpa,flash_attention_4,")):
        with pytest.raises(SystemExit):
            request.parse_args(["--model", "m", "--router", "r", "--out", "o.json", *argv])
        assert message in capsys.readouterr().err


def test_adapter_precision_counts_the_decisions_a_rounded_adapter_changes(router, tmp_path):
    """The 1.5B study's adapter_precision.py on the tiny backbone: one row per prompt, decisions counted against
    float32 (float32 itself differs nowhere, so the float16 and bfloat16 counts are the only ones reported)."""
    from conftest import load_script

    out = tmp_path / "precision.json"
    result = load_script(ADAPTER_PRECISION).main([
        "--model", str(TINY_BACKBONE), "--router", str(router), "--suite", "synthetic", "--tasks",
        "needle_single,local_recall", "--length", "600", "--rows", "2", "--device", "cpu", "--dtype", "float32",
        "--out", str(out)])
    assert json.loads(out.read_text()) == result and len(result["rows"]) == 4
    for row in result["rows"]:
        assert row["decisions"] == 8 and 0 <= row["differ_float16"] <= row["decisions"]
    assert result["differ"] == {name: sum(row[f"differ_{name}"] for row in result["rows"]) / 32
                                for name in ("float16", "bfloat16")}


def _run_document(date: str, cells: list[tuple[str, int, int]], ttft: float, **header) -> dict:
    rows = [{"prompt_kind": kind, "length": length, "batch": batch, "mode": mode, "baseline": baseline, "msr": 0.5,
             "ttft_s": ttft, "decode_tokens_per_s": 100.0, "peak_memory_bytes": None, "kv_cache_bytes": 2**20,
             "tokens_equal_reference": None, "first_call_s": 1.0, "compile_decode": True, "decode_loop": "own"}
            for kind, length, batch in cells for mode, baseline in (("dense", "sdpa"), ("elastic", None))]
    return {"date": date, "device": "cpu", "torch": "x", "transformers": "y", "command": f"run of {date}",
            "model": "m", "router": "r", "new_tokens": 5, "rows_per_kind": 2, "tasks": {"sensitive": "a"},
            "dense_setups": ["sdpa"], "results": rows, **header}


def test_merged_request_runs_let_a_later_cell_replace_an_earlier_one_in_place(tmp_path):
    old = _run_document("d0", [("sensitive", 32, 8), ("sensitive", 16, 8), ("robust", 16, 1)], ttft=2.0)
    new = _run_document("d1", [("sensitive", 16, 8)], ttft=1.0, dense_setups=["sdpa", "static_cache_graph"])
    merged = merge_runs([("old.json", old), ("new.json", new)], RULES["request"])
    assert [(r["prompt_kind"], r["length"], r["batch"], r["run"]) for r in merged["results"]] == [
        ("sensitive", 32, 8, 0), ("sensitive", 32, 8, 0), ("sensitive", 16, 8, 1), ("sensitive", 16, 8, 1),
        ("robust", 16, 1, 0), ("robust", 16, 1, 0)]
    assert [r["ttft_s"] for r in merged["results"] if r["run"] == 1] == [1.0, 1.0]
    assert [(run["date"], run["source"]) for run in merged["runs"]] == [("d0", "old.json"), ("d1", "new.json")]
    assert merged["date"] == "d1" and merged["dense_setups"] == ["sdpa", "static_cache_graph"]
    table = request.markdown(merged)
    assert "run 0, cpu, d0: `run of d0`" in table and "run 1, cpu, d1" in table and "sdpa (run 1)" in table
    paths = []
    for name, document in (("old.json", old), ("new.json", new)):
        paths.append(tmp_path / name)
        paths[-1].write_text(json.dumps(document))
    load_script("merge_bench_results").main(["request", *map(str, paths), "--out", str(tmp_path / "merged.json")])
    assert json.loads((tmp_path / "merged.json").read_text()) == merged
    assert (tmp_path / "merged.md").read_text() == table


def test_request_runs_of_different_models_devices_or_token_counts_are_not_merged():
    old = _run_document("d0", [("sensitive", 16, 8)], ttft=2.0)
    with pytest.raises(InputError, match="new_tokens"):
        merge_runs([("old.json", old), ("new.json", {**old, "new_tokens": 64})], RULES["request"])
    with pytest.raises(InputError, match="device"):
        merge_runs([("old.json", old), ("new.json", {**old, "device": "NVIDIA H100"})], RULES["request"])
    with pytest.raises(InputError, match="no result rows"):
        merge_runs([("old.json", old), ("empty.json", {**old, "results": []})], RULES["request"])
    with pytest.raises(InputError, match="at least one"):
        merge_runs([], RULES["request"])


@pytest.mark.slow
def test_compiled_prefill_rows_run_beside_a_dense_setup_with_compiled_layers(router, tmp_path):
    out = tmp_path / "request_compiled.json"
    assert cli_main(["bench", "request", "--model", str(TINY_BACKBONE), "--router", str(router), "--tasks",
                     "needle_single,local_recall", "--suite", "synthetic", "--lengths", "600", "--batch", "1",
                     "--rows", "1", "--new-tokens", "3", "--compile-decode", "off", "--compile-prefill", "on",
                     "--dense-setups", "sdpa,sdpa_compiled_layers", "--device", "cpu", "--dtype", "float32",
                     "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["dense_setups"] == ["sdpa", "sdpa_compiled_layers"]
    for kind in ("sensitive", "robust"):
        rows = [row for row in result["results"] if row["prompt_kind"] == kind]
        assert [row.get("baseline") for row in rows if row["mode"] == "dense"] == ["sdpa", "sdpa_compiled_layers"]
        assert rows[1]["leading_tokens_equal"] == [3]  # the compiled dense layers decode as the plain ones
        elastic = [row for row in rows if row["mode"] == "elastic"]
        assert elastic and all(row["compile_prefill"] and row["tokens_equal_reference"] for row in elastic)
    assert "| elastic | router, compiled prefill |" in out.with_suffix(".md").read_text()


def test_first_step_phases_time_each_phase_once_and_put_everything_back(monkeypatch):
    """`FirstStepPhases` of the kernel study's profile_decode_graph.py on stand-ins for the CUDA calls (synchronize,
    the graph's capture and replay): each phase is the time between its stamps, the eager run is `capture_graph`'s
    time outside the capture and empty_cache, only the first replay counts, and every patched attribute is put
    back."""
    import time

    import elastic_attention.bench.decode_graphs as decode_graphs_module
    import elastic_attention.integration.decode_graph as decode_graph_module
    from elastic_attention.cache.bounded import ElasticCache

    clock = {"now": 0.0}
    monkeypatch.setattr(time, "perf_counter", lambda: clock["now"])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)

    def spends(seconds):
        def call(*args, **kwargs):
            clock["now"] += seconds
        return call

    graph_class = torch.cuda.CUDAGraph
    for name, seconds in (("capture_begin", 0.001), ("capture_end", 0.030), ("replay", 0.002)):
        monkeypatch.setattr(graph_class, name, spends(seconds))
    monkeypatch.setattr(torch.cuda, "empty_cache", spends(0.004))
    monkeypatch.setattr(ElasticCache, "begin_static", spends(0.010))
    graph = object.__new__(graph_class)

    def capture_graph(run, device_state):  # an eager run of 0.020 s, then torch.cuda.graph's empty_cache and capture
        clock["now"] += 0.020
        torch.cuda.empty_cache()
        graph_class.capture_begin(graph)
        graph_class.capture_end(graph)
        return graph, None

    monkeypatch.setattr(decode_graph_module, "capture_graph", capture_graph)
    before = {name: graph_class.__dict__[name] for name in ("capture_begin", "capture_end", "replay")}
    phases = load_script(PROFILE_DECODE_GRAPH).FirstStepPhases()
    with phases.recording():
        ElasticCache.begin_static(None, 0)
        decode_graph_module.capture_graph(None, [])
        graph_class.replay(graph)
        graph_class.replay(graph)  # a later replay: not the first step's
    seconds = {name: round(value, 6) for name, value in phases.seconds.items()}
    assert seconds == {"static storage": 0.010, "eager run": 0.020, "empty_cache": 0.004, "capture": 0.031,
                       "first replay": 0.002}
    assert phases.line(0.070) == ("   first step (ms): static storage 10.0, empty_cache 4.0, capture 31.0, eager run "
                                  "20.0, first replay 2.0, rest 3.0")
    assert decode_graph_module.capture_graph is capture_graph and torch.cuda.empty_cache.__name__ == "call"
    assert {name: graph_class.__dict__[name] for name in before} == before
