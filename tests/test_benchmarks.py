"""The GPU benchmarks run end to end at CPU-sized shapes (their numbers come from the device machine)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
#: A decoder small enough for a CPU, with the patterns of the tiny configs.
TINY_MODEL = ["--device", "cpu", "--layers", "2", "--hidden", "128", "--heads", "4", "--kv-heads", "2",
              "--intermediate", "256", "--vocab", "500", "--block-size", "64", "--sink", "64", "--local", "128"]


def run_bench(name: str, tmp_path: Path, *options: str) -> dict:
    """Run `elastic-attention bench NAME OPTIONS --out ...` and return the JSON it wrote."""
    out = tmp_path / f"{name}.json"
    subprocess.run([sys.executable, "-m", "elastic_attention.cli", "bench", name, *options, "--out", str(out)],
                   check=True, capture_output=True, env=ENV)
    return json.loads(out.read_text())


@pytest.mark.slow
def test_layer_benchmark_smoke_run_on_cpu(tmp_path):
    result = run_bench("layer", tmp_path, "--device", "cpu", "--lengths", "300", "--msr", "0.5", "--heads", "4",
                       "--kv-heads", "2", "--head-dim", "32", "--block-size", "64", "--sink", "64", "--local", "128",
                       "--repeats", "1", "--tolerance", "1e-4", "--backends", "flex,flex_one_launch")
    row = result["results"][0]
    assert result["device"] == "cpu" and result["command"]
    assert row["flex_max_error"] < 1e-4 and row["flex_one_launch_max_error"] < 1e-4
    assert 0 < row["attended_block_fraction"] <= 1
    assert row["ideal_s"] == pytest.approx(row["dense_sdpa_s"] * row["attended_block_fraction"])
    assert row["flex_pipelined_s"] > 0 and row["flex_pipelined_over_ideal"] > 0


@pytest.mark.slow
def test_prefill_benchmark_smoke_run_on_cpu(tmp_path):
    result = run_bench("prefill", tmp_path, *TINY_MODEL, "--lengths", "300", "--configurations", "fa-ssa,xa-ssa",
                       "--modes", "sdpa", "--backend", "flex", "--msr", "0.5", "--repeats", "1")
    models = [row["model"] for row in result["results"]]
    assert models == ["sdpa", "elastic-fa-ssa", "elastic-xa-ssa"]
    fa_ssa = result["results"][1]
    assert fa_ssa["msr"] == pytest.approx(0.5) and 0 < fa_ssa["esr_mean"] < 1 and fa_ssa["seconds"] > 0
    assert fa_ssa["speedup_vs_sdpa"] == pytest.approx(result["results"][0]["seconds"] / fa_ssa["seconds"])
    assert "| 300 | elastic-xa-ssa |" in (tmp_path / "prefill.md").read_text()


@pytest.mark.slow
def test_decode_benchmark_smoke_run_on_cpu(tmp_path):
    result = run_bench("decode", tmp_path, *TINY_MODEL, "--lengths", "700", "--batch", "1,2", "--msr", "1.0",
                       "--backend", "reference", "--steps", "1", "--tolerance", "1e-4")
    rows = {(row["cache"], row["batch"]): row for row in result["results"]}
    assert sorted(rows) == [(kind, batch) for kind in ("bounded", "bounded_torch", "dense", "full") for batch in (1, 2)]
    # Every head on SSA keeps sink + window = 192 of 701 entries; the batch of 2 repeats the prefilled cache. The
    # dense cache is timed twice per batch size, so at batch 2 it holds two more entries than the full one.
    for batch in (1, 2):
        bounded = rows["bounded", batch]
        assert bounded["bytes_vs_full"] < 0.3
        assert bounded["bytes_vs_dense"] == pytest.approx(bounded["bytes_vs_full"], rel=0.01)
        assert bounded["cache_bytes"] == batch * rows["bounded", 1]["cache_bytes"]
        assert bounded["bytes_vs_bounded_torch"] == 1.0 and bounded["speedup_vs_bounded_torch"] > 0
        assert rows["bounded_torch", batch]["fused_decode_steps"] == 0  # no Triton on a CPU: the torch path
    assert rows["bounded", 1]["max_logit_difference"] < 1e-4


@pytest.mark.slow
def test_decode_benchmark_prefills_the_bounded_cache_in_chunks(tmp_path):
    common = [*TINY_MODEL, "--lengths", "700", "--batch", "1", "--msr", "1.0", "--backend", "reference",
              "--steps", "1", "--caches", "bounded"]
    chunked = run_bench("decode", tmp_path, *common, "--prefill-chunk", "200")["results"][0]
    one_pass = run_bench("decode", tmp_path, *common)["results"][0]
    assert chunked["prefill_chunk"] == 200 and chunked["prefill_s"] > 0 and one_pass["prefill_chunk"] == 0
    # Every head on SSA: both keep exactly the sink and the window, whatever the chunking.
    assert chunked["cache_bytes"] == one_pass["cache_bytes"]
    refused = subprocess.run([sys.executable, "-m", "elastic_attention.cli", "bench", "decode", *TINY_MODEL,
                              "--prefill-chunk", "200", "--out", str(tmp_path / "x.json")],
                             capture_output=True, text=True, env=ENV)
    assert refused.returncode != 0 and "--prefill-chunk needs --caches bounded" in refused.stderr


@pytest.mark.slow
def test_train_step_benchmark_smoke_run_on_cpu(tmp_path):
    result = run_bench("train-step", tmp_path, *TINY_MODEL, "--length", "256", "--answer-tokens", "8",
                       "--gradient-checkpointing", "--backend", "reference", "--steps", "2")
    assert result["world_size"] == 1 and result["gradient_checkpointing"] and result["length"] == 256
    assert result["model"]["layers"] == 2 and result["step_seconds"] > 0
    assert result["tokens_per_second"] == pytest.approx(256 / result["step_seconds"])


@pytest.mark.slow
def test_cpu_prefill_benchmark_smoke_run(tmp_path):
    from elastic_attention.assets import TINY_BACKBONE

    result = run_bench("cpu-prefill", tmp_path, "--model", str(TINY_BACKBONE), "--length", "640", "--sink", "128",
                       "--local", "256", "--repeats", "1", "--threads", "1")
    rows = {row["mode"]: row for row in result["results"]}
    assert list(rows) == ["plain", "full", "sparse", "full_reference"] and all(r["seconds"] > 0 for r in rows.values())
    # Full heads run the plain model's own causal kernel: identical logits. All-SSA is checked against the reference
    # backend, which computes in float32 while the run is bf16 (a bf16 step is 0.0625 at logits of 8-16).
    assert rows["full"]["max_logit_difference"] == 0.0 and rows["sparse"]["max_logit_difference"] <= 4 * 0.0625
    assert result["length"] == 640 and result["command"]


@pytest.mark.slow
def test_cpu_prefill_benchmark_in_float32(tmp_path):
    from elastic_attention.assets import TINY_BACKBONE

    result = run_bench("cpu-prefill", tmp_path, "--model", str(TINY_BACKBONE), "--length", "700", "--sink", "128",
                       "--local", "256", "--repeats", "1", "--threads", "1", "--modes", "plain,full,sparse",
                       "--dtype", "float32")
    rows = {row["mode"]: row for row in result["results"]}
    assert result["dtype"] == "float32" and list(rows) == ["plain", "full", "sparse"]
    # In float32 the cpu path's all-SSA logits match the reference backend's to float32 rounding.
    assert rows["full"]["max_logit_difference"] <= 1e-4 and rows["sparse"]["max_logit_difference"] <= 1e-3
