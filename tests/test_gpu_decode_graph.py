"""Decode steps replayed from a captured CUDA graph against eager steps and a float64 CPU run (device: pytest -m
gpu)."""

import pytest
import torch
from conftest import per_sample_routers, tiny_model

from elastic_attention import ElasticCache, ElasticConfig, attach, force_routing

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CONFIG = ElasticConfig(block_size=8, sink_tokens=8, local_tokens=16, xa_stride=4)
#: Layer 0: KV head 0 on full attention, head 1 on SSA; layer 1: both on SSA.
ROUTING = torch.tensor([[True, False], [False, False]])


def teacher_forced(device, dtype, graphs, steps=200, routing=None, cache_kind="bounded"):
    """(next-token logits [steps + 1, 2, vocab] float64 on the CPU, the cache) of a left-padded batch of 2 (prompts of
    40 and 33 tokens) fed fixed tokens; per-sample routers unless ``routing`` forces one."""
    model = tiny_model("llama").to(device=device, dtype=dtype)
    attach(model, CONFIG, backend="reference", cache=cache_kind, cuda_graphs=graphs)
    if routing is None:
        per_sample_routers(model)
    else:
        force_routing(model, routing)
    cache = ElasticCache(model) if cache_kind == "bounded" else None
    generator = torch.Generator().manual_seed(4)
    ids = torch.randint(3, 90, (2, 40), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, :7] = 0
    continuation = torch.randint(3, 90, (2, steps), generator=generator)
    ids, mask, continuation = ids.to(device), mask.to(device), continuation.to(device)
    logits = []
    with torch.no_grad():
        output = model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
        cache = output.past_key_values
        logits.append(output.logits[:, -1])
        for step in range(steps):
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            output = model(input_ids=continuation[:, step : step + 1], attention_mask=mask, past_key_values=cache,
                           use_cache=True)
            logits.append(output.logits[:, -1])
    return torch.stack(logits).double().cpu(), cache


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("recapture", [False, True])
def test_replayed_steps_equal_eager_steps(dtype, tolerance, recapture, monkeypatch):
    """200 steps past the rings' wrap, per-sample routing, mixed prompt lengths; with ``recapture`` the capacity
    leaves room for 50 tokens, so the cache leaves static mode and captures again four times."""
    if recapture:
        from elastic_attention.integration import decode_graph

        monkeypatch.setattr(decode_graph, "static_capacity", lambda longest, max_length: longest + 50)
    replayed, cache = teacher_forced("cuda", dtype, graphs=True)
    eager, eager_cache = teacher_forced("cuda", dtype, graphs=False)
    assert cache.decode_graph is not None and cache.decode_graph.graph is not None  # replayed, not eager
    assert cache.fused_decode_steps == eager_cache.fused_decode_steps == 200
    assert eager_cache.static_capacity is None
    scale = float(eager.abs().max())
    assert float((replayed - eager).abs().max()) <= tolerance * scale


def test_replayed_steps_match_float64():
    expected, _ = teacher_forced("cpu", torch.float64, graphs=False, routing=ROUTING, cache_kind="full")
    actual, cache = teacher_forced("cuda", torch.bfloat16, graphs=True, routing=ROUTING)
    assert cache.static_steps > 0
    assert float((actual - expected).abs().max()) <= 2e-2 * float(expected.abs().max())


def test_generate_with_graphs_equals_generate_without():
    """float32: greedy, greedy with an EOS that stops one sample early while the other continues, seeded sampling."""
    generator = torch.Generator().manual_seed(5)
    ids = torch.randint(3, 90, (2, 40), generator=generator).cuda()
    mask = torch.ones_like(ids)
    mask[1, :9] = 0
    prompt, new_tokens = ids.shape[1], 120
    results = {}
    for graphs in (True, False):
        model = tiny_model("llama").cuda()
        attach(model, CONFIG, backend="reference", cuda_graphs=graphs)
        per_sample_routers(model)
        with torch.no_grad():
            greedy = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                                    pad_token_id=0, return_dict_in_generate=True)
            first, second = greedy.sequences[:, prompt:].tolist()
            stop = next(k for k in range(10, new_tokens) if first[k] not in first[:k] + second)
            stopped = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                                     pad_token_id=0, eos_token_id=first[stop])
            torch.manual_seed(3)
            sampled = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=True,
                                     top_k=0, pad_token_id=0, return_dict_in_generate=True)
        for result in (greedy, sampled):
            assert (result.past_key_values.decode_graph is not None) == graphs
        results[graphs] = greedy.sequences, stopped, sampled.sequences
    for with_graphs, without in zip(results[True], results[False]):
        assert torch.equal(with_graphs, without)
    greedy, stopped = results[True][:2]
    assert (stopped[0, prompt + stop + 1 :] == 0).all() and torch.equal(stopped[1], greedy[1])
