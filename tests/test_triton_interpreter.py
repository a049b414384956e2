"""The fused decode step's Triton kernels and the bounded cache's use of them, on the CPU, through Triton's
interpreter (GPU runs: `tests/test_gpu_cache.py`). Skipped where Triton is not installed. The interpreter is slow, so
of `test_bounded_cache.py` only the tests whose decode steps exercise the fused path run here: generation against
the full cache, the ring's wrap, per-sample memory, repetition of the batch and misuse; `interpreted_fused_decode.py`
runs whole (the kernels, static mode and graphed steps run eagerly, the static-cache baseline of `bench
decode-graphs`, decoder layers compiled around the untraced attention). Two processes share the work, one core each."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parent.parent


#: Tests of `test_bounded_cache.py` whose decode steps exercise the fused path (every test of
#: `interpreted_fused_decode.py` matches too).
SELECTED = ("fused or llama-12 or ring_wraps or memory or repeating or misuse or static or graph or forwards or "
            "baseline or compiled")
#: The three longest tests (about 100 s together on a 2-core machine), run in a second process at the same time.
LONGEST = "generate or fused_path or compiled"


@pytest.mark.slow
def test_fused_decode_under_the_triton_interpreter():
    environment = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}  # one core per process
    pytest_command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    runs = [
        pytest_command + ["tests/interpreted_fused_decode.py", "-k", LONGEST],
        pytest_command + ["tests/interpreted_fused_decode.py", "tests/test_bounded_cache.py", "-k",
                          f"({SELECTED}) and not ({LONGEST})"],
    ]
    processes = [subprocess.Popen(command, cwd=ROOT, env=environment, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for command in runs]
    try:
        for process in processes:
            stdout, stderr = process.communicate(timeout=600)
            assert process.returncode == 0, stdout[-4000:] + stderr[-2000:]
            assert " passed" in stdout and "skipped" not in stdout.splitlines()[-1]
    finally:
        for process in processes:
            process.kill()  # nothing happens to a process that has ended
