"""The fused decode step's Triton kernels and the bounded cache's use of them, on the CPU, through Triton's
interpreter (GPU runs: `tests/test_gpu_cache.py`). Skipped where Triton is not installed. The interpreter is slow, so
of `test_bounded_cache.py` only the tests whose decode steps exercise the fused path run here: generation against
the full cache, the ring's wrap, per-sample memory, repetition of the batch and misuse; `interpreted_fused_decode.py`
runs whole (the kernels, static mode and graphed steps run eagerly, the static-cache baseline of `bench
decode-graphs`, decoder layers compiled around the untraced attention)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_fused_decode_under_the_triton_interpreter():
    environment = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/interpreted_fused_decode.py",
         "tests/test_bounded_cache.py", "-k", "fused or llama-12 or ring_wraps or memory or repeating or misuse or "
         "static or graph or forwards or baseline or compiled"],
        cwd=ROOT, env=environment, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout.splitlines()[-1]
