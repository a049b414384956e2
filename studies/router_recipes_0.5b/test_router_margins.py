"""router_margins.py: the argmax MSR it reads from the routers' margins is the MSR the evaluation measures
on the same rows (pinned heads sparse), and the expected MSR under sampling is the mean of sigmoid(SA - FA)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import router_margins

TINY = Path(__file__).resolve().parents[2] / "src" / "elastic_attention" / "assets" / "backbone_tiny"


@pytest.mark.slow  # a study's script end to end on a model: make test-slow and CI run it
@pytest.mark.parametrize("pinned", [False, True], ids=["routed", "first_head_pinned"])
def test_margins_agree_with_the_evaluations_routing(tmp_path, pinned):
    from elastic_attention import ElasticConfig, attach
    from elastic_attention.adapters import save_router
    from elastic_attention.evaluation.pipeline import load_backbone
    from elastic_attention.evaluation.runner import run_evaluation
    from elastic_attention.integration import routers_of

    model, tokenizer = load_backbone(TINY, device="cpu")
    attach(model, ElasticConfig(configuration="fa-ssa", block_size=32, sink_tokens=32, local_tokens=128,
                                router_standardize=pinned))
    torch.manual_seed(0)
    with torch.no_grad():  # margins of both signs and sizes, so the routing is mixed
        for router in routers_of(model).values():
            for parameter in router.parameters():
                parameter.normal_(0.0, 0.5)
            if pinned:  # the first KV head always sparse, whatever its margin
                router.head_bias[0, 1] = 5.0
                router.pin_sparse(torch.arange(router.num_kv_heads) == 0)
    save_router(model, tmp_path / "router")
    script = router_margins
    out = tmp_path / "margins.json"
    table = script.main(["--model", str(TINY), "--router", str(tmp_path / "router"), "--suite", "synthetic",
                         "--tasks", "needle_single,local_recall", "--length", "700", "--samples", "3",
                         "--device", "cpu", "--out", str(out)])
    written = json.loads(out.read_text())
    assert written["table"] == table and written["router"] == str(tmp_path / "router") and "date" in written
    cells = run_evaluation(model, tokenizer, modes=["elastic"], tasks=["needle_single", "local_recall"],
                           lengths=[700], samples=3, batch_size=1)
    assert [entry["msr"] for entry in table] == pytest.approx([cell.msr for cell in cells])
    assert 0.0 < sum(entry["msr"] for entry in table) < 2.0  # a mixed routing, not a trivial one
    for entry in table:
        assert entry["margin_below_1"] <= entry["margin_below_2"] <= 1.0
        assert 0.0 <= entry["expected_msr_sampled"] <= 1.0
