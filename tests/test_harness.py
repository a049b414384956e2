"""lm-evaluation-harness end to end, offline, on the shipped tiny backbone: the registered `elastic-attention`
model type through lm-eval's Python API and through `elastic-attention lm-eval`, on the shipped suite task."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

lm_eval = pytest.importorskip("lm_eval", reason="the lm-eval extra is not installed")

import elastic_attention as ea  # noqa: E402
from elastic_attention.assets import LM_EVAL_TASKS, TINY_BACKBONE  # noqa: E402
from elastic_attention.evaluation.pipeline import load_backbone  # noqa: E402

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    model, _ = load_backbone(TINY_BACKBONE, "cpu")
    ea.attach(model, ea.ElasticConfig(block_size=32, sink_tokens=32, local_tokens=256, xa_stride=8))
    return ea.save_router(model, tmp_path_factory.mktemp("router"))


def test_lm_eval_runs_the_suite_task_through_elastic_attention(router, monkeypatch):
    import elastic_attention.harness  # noqa: F401  (registers the model type)
    from lm_eval.api.registry import get_model
    from lm_eval.tasks import TaskManager

    for name, value in OFFLINE.items():
        monkeypatch.setenv(name, value)
    model = get_model("elastic-attention").create_from_arg_string(
        f"pretrained={TINY_BACKBONE},router={router},device=cpu", {"batch_size": 4})
    results = lm_eval.simple_evaluate(model=model, tasks=["elastic_suite_tiny"], limit=8,
                                      task_manager=TaskManager(include_path=str(LM_EVAL_TASKS)))
    cell = results["results"]["elastic_suite_tiny"]
    assert cell["sample_len"] == 8 and 0.0 <= cell["exact_match,strip"] <= 1.0
    assert sum(len(entry["msr"]) for entry in model.routing_log) == 8  # every prompt's routing was recorded
    assert all(0.0 <= msr <= 1.0 for entry in model.routing_log for msr in entry["msr"])


@pytest.mark.slow  # 10 s on a 2-core Xeon: lm-eval's whole command line in a subprocess
def test_lm_eval_command_line(router, tmp_path):
    environment = {**os.environ, **OFFLINE}
    command = [sys.executable, "-m", "elastic_attention.cli", "lm-eval", "--model", "elastic-attention",
               "--model_args", f"pretrained={TINY_BACKBONE},router={router}", "--device", "cpu", "--tasks",
               "elastic_suite_tiny", "--include_path", str(LM_EVAL_TASKS), "--limit", "2", "--batch_size", "2"]
    result = subprocess.run(command, capture_output=True, text=True, env=environment, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "elastic_suite_tiny" in result.stdout and "exact_match" in result.stdout
