"""The GPU benchmark scripts run end to end at CPU-sized shapes (their numbers come from the device machine)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_layer_benchmark_smoke_run_on_cpu(tmp_path):
    out = tmp_path / "layer.json"
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_layer.py"), "--device", "cpu", "--lengths", "300",
         "--msr", "0.5", "--heads", "4", "--kv-heads", "2", "--head-dim", "32", "--block-size", "64", "--sink", "64",
         "--local", "128", "--repeats", "1", "--tolerance", "1e-4", "--out", str(out)],
        check=True, capture_output=True,
    )
    result = json.loads(out.read_text())
    row = result["rows"][0]
    assert result["device"] == "cpu" and result["command"]
    assert row["flex_max_error"] < 1e-4 and 0 < row["attended_block_fraction"] <= 1
    assert row["ideal_s"] == pytest.approx(row["dense_sdpa_s"] * row["attended_block_fraction"])
