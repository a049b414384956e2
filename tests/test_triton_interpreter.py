"""The Triton kernels on the CPU, through Triton's interpreter: the fused decode step and the bounded cache's use of
it (GPU runs: `tests/test_gpu_cache.py`), and the XA estimate (GPU runs: `tests/test_gpu_backends.py`). Skipped where Triton is not installed. The interpreter is slow, so
of `test_bounded_cache.py` only the tests whose decode steps exercise the fused path run here: generation against
the full cache, the ring's wrap, per-sample memory, repetition of the batch and misuse."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parent.parent


def assert_passes_interpreted(*pytest_arguments: str) -> None:
    """pytest in a fresh process with ``TRITON_INTERPRET=1`` (it must be set before Triton compiles anything): every
    selected test passes, none skipped."""
    environment = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_arguments],
                            cwd=ROOT, env=environment, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout.splitlines()[-1]


@pytest.mark.slow
def test_fused_decode_under_the_triton_interpreter():
    assert_passes_interpreted("tests/interpreted_fused_decode.py", "tests/test_bounded_cache.py",
                              "-k", "fused or llama-12 or ring_wraps or memory or repeating or misuse")


@pytest.mark.slow
def test_xa_estimate_under_the_triton_interpreter():
    assert_passes_interpreted("tests/interpreted_xattention.py")
