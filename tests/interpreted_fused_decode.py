"""The fused decode step on the CPU through Triton's interpreter; run by `test_triton_interpreter.py` in a process
with ``TRITON_INTERPRET=1`` (the variable must be set before Triton compiles anything), together with
`test_bounded_cache.py`, whose decode steps then take the fused path."""

import os

import pytest
import torch
from conftest import fused_decode_case, per_sample_routers, tiny_model

from elastic_attention import ElasticCache, ElasticConfig, attach
from elastic_attention.cache import triton_decode
from elastic_attention.integration import runtime_of

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")


@pytest.mark.parametrize("group, head_dim, processors", [(4, 32, 4), (1, 16, 4), (3, 24, 4), (4, 32, 50)])
def test_fused_decode_kernels_match_float64(group, head_dim, processors, monkeypatch):
    """With 50 "processors" the longer segments split their keys (24 splits, merged by the last to arrive)."""
    monkeypatch.setattr(triton_decode, "_processors", lambda device: processors)
    actual, expected = fused_decode_case("cpu", torch.float32, group, head_dim, [0, 37, 104, 105, 2175, 3001])
    assert float((actual - expected).abs().max()) < 1e-4


def test_decode_steps_take_the_fused_path_and_equal_the_per_sequence_path():
    """A left-padded batch with per-sample routing, 70 steps (the full stores grow, the table is rebuilt)."""
    config = ElasticConfig(block_size=8, sink_tokens=8, local_tokens=16, xa_stride=4)
    generator = torch.Generator().manual_seed(4)  # a prompt on which the two samples route differently
    ids = torch.randint(3, 90, (2, 30), generator=generator)
    continuation = torch.randint(3, 90, (2, 70), generator=generator)
    runs = {}
    for fused in (True, False):
        model = tiny_model("llama")
        attach(model, config, backend="reference")
        per_sample_routers(model)
        cache = ElasticCache(model, fused_decode=fused)
        mask = torch.ones_like(ids)
        mask[1, :5] = 0
        logits, tables = [], []
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, past_key_values=cache)
            for step in range(continuation.shape[1]):
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                output = model(input_ids=continuation[:, step : step + 1], attention_mask=mask, past_key_values=cache)
                logits.append(output.logits[:, -1])
                tables.append([layer._segments for layer in cache.layers])
        runs[fused] = torch.stack(logits)
        streaming = [[bool(h) for layer in range(2) for h in runtime_of(model).routing.streaming_heads(layer, n)]
                     for n in range(2)]
        assert streaming[0] != streaming[1] and not all(streaming[0] + streaming[1])  # per-sample, some full heads
        assert cache.fused_decode_steps == (continuation.shape[1] if fused else 0)
        if fused:
            assert all(table is not None for step in tables for table in step)
            # storage moved at least once (a full store grew): some layer's table was rebuilt
            assert any(len({id(step[layer]) for step in tables}) > 1 for layer in range(2))
        else:
            assert all(table is None for step in tables for table in step)
    assert float((runs[True] - runs[False]).abs().max()) < 1e-5
