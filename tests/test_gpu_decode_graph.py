"""Decode steps replayed from a captured CUDA graph against eager steps and a float64 CPU run (device: pytest -m
gpu)."""

import pytest
import torch
from conftest import (
    caches_taking_turns,
    generate_with_and_without_graphs,
    left_padded_batch,
    per_sample_routers,
    teacher_forced_decode,
    tiny_model,
)

from elastic_attention import ElasticCache, ElasticConfig, attach, force_routing

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CONFIG = ElasticConfig(block_size=8, sink_tokens=8, local_tokens=16, xa_stride=4)
#: Layer 0: KV head 0 on full attention, head 1 on SSA; layer 1: both on SSA.
ROUTING = torch.tensor([[True, False], [False, False]])


def teacher_forced(device, dtype, graphs, steps=200, routing=None, cache_kind="bounded", compile_decode=False,
                   layers=2, batch=2, grouped_projections=False, family="llama"):
    """(next-token logits [steps + 1, batch, vocab] float64 on the CPU, the cache) of a left-padded batch of 2
    (prompts of 40 and 33 tokens; ``batch`` 1 keeps the first) fed fixed tokens; per-sample routers unless
    ``routing`` forces one."""
    model = tiny_model(family, layers=layers).to(device=device, dtype=dtype)
    attach(model, CONFIG, backend="reference", cache=cache_kind, cuda_graphs=graphs, compile_decode=compile_decode,
           grouped_projections=grouped_projections)
    if routing is None:
        per_sample_routers(model)
    else:
        force_routing(model, routing)
    cache = ElasticCache(model) if cache_kind == "bounded" else None
    ids, mask, continuation = (part[:batch] for part in left_padded_batch(4, 40, 7, steps, device))
    logits, cache = teacher_forced_decode(model, ids, mask, continuation, cache)
    return logits.double().cpu(), cache


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("recapture", [False, True])
def test_replayed_steps_equal_eager_steps(dtype, tolerance, recapture, monkeypatch):
    """200 steps past the rings' wrap, per-sample routing, mixed prompt lengths; with ``recapture`` the capacity
    leaves room for 50 tokens, so the cache leaves static mode and captures again four times."""
    if recapture:
        from elastic_attention.integration import decode_graph

        monkeypatch.setattr(decode_graph, "decode_capacity", lambda longest, max_length: longest + 50)
    replayed, cache = teacher_forced("cuda", dtype, graphs=True)
    eager, eager_cache = teacher_forced("cuda", dtype, graphs=False)
    assert cache.decode_graph is not None and cache.decode_graph.graph is not None  # replayed, not eager
    assert cache.fused_decode_steps == eager_cache.fused_decode_steps == 200
    assert eager_cache.static_capacity is None
    scale = float(eager.abs().max())
    assert float((replayed - eager).abs().max()) <= tolerance * scale


def test_replayed_compiled_steps_equal_eager_steps():
    """``compile_decode=True``: the captured step runs every decoder layer (3: the third reuses the graphs compiled
    for the second) through torch.compile."""
    replayed, cache = teacher_forced("cuda", torch.float32, graphs=True, compile_decode=True, layers=3)
    eager, _ = teacher_forced("cuda", torch.float32, graphs=False, layers=3)
    assert cache.decode_graph is not None and cache.decode_graph.graph is not None
    assert float((replayed - eager).abs().max()) <= 1e-4 * float(eager.abs().max())


def test_auto_compile_captures_again_compiled_once_its_steps_would_have_paid(monkeypatch):
    """``compile_decode="auto"`` with a threshold of 60 steps: 60 steps replay an uncompiled graph, then the step is
    captured again with its layers compiled (3 layers); the logits equal eager steps' throughout."""
    from elastic_attention.integration import decode_graph

    monkeypatch.setattr(decode_graph, "compile_after_steps", lambda num_layers: 60)
    replayed, cache = teacher_forced("cuda", torch.float32, graphs=True, compile_decode="auto", layers=3)
    eager, _ = teacher_forced("cuda", torch.float32, graphs=False, layers=3)
    assert cache.decode_graph.compile_layers and cache.decode_graph.graph is not None
    assert cache.static_steps == 140
    assert float((replayed - eager).abs().max()) <= 1e-4 * float(eager.abs().max())


def test_replayed_steps_match_float64():
    expected, _ = teacher_forced("cpu", torch.float64, graphs=False, routing=ROUTING, cache_kind="full")
    actual, cache = teacher_forced("cuda", torch.bfloat16, graphs=True, routing=ROUTING)
    assert cache.static_steps > 0
    assert float((actual - expected).abs().max()) <= 2e-2 * float(expected.abs().max())


def test_later_caches_replay_a_kept_step_over_their_own_tables():
    """Captured steps served to caches in turn, over their own storage (`conftest.caches_taking_turns`)."""
    caches_taking_turns(CONFIG, "cuda", tolerance=1e-4)


def test_generate_with_graphs_equals_generate_without():
    """float32: greedy, greedy with an EOS that stops one sample early while the other continues, seeded sampling."""
    generator = torch.Generator().manual_seed(5)
    ids = torch.randint(3, 90, (2, 40), generator=generator).cuda()
    mask = torch.ones_like(ids)
    mask[1, :9] = 0
    results, caches, stop = generate_with_and_without_graphs(CONFIG, ids, mask, new_tokens=120, first_stop=10)
    greedy_cache, sampled_cache = caches[True]  # the later calls (same prompts and routing) replay the first's step
    assert greedy_cache.decode_graph is None and sampled_cache.decode_graph is not None
    assert all(cache.decode_graph is None for cache in caches[False])
    for with_graphs, without in zip(results[True], results[False]):
        assert torch.equal(with_graphs, without)
    greedy, stopped, _ = results[True]
    assert (stopped[0, ids.shape[1] + stop + 1 :] == 0).all() and torch.equal(stopped[1], greedy[1])


@pytest.mark.parametrize("family", ["llama", "qwen2"])  # qwen2: q, k and v with biases
@pytest.mark.parametrize("compile_decode", [False, True])
@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
def test_replayed_steps_of_one_sequence_with_grouped_projections_equal_eager_steps(family, compile_decode, dtype,
                                                                                   tolerance):
    """Batch 1, 200 steps: the captured step's projections run as grouped Triton launches (q/k/v, gate/up), the
    eager steps' through cuBLAS."""
    replayed, cache = teacher_forced("cuda", dtype, graphs=True, batch=1, compile_decode=compile_decode,
                                     family=family, grouped_projections=True)
    eager, _ = teacher_forced("cuda", dtype, graphs=False, batch=1, family=family)
    cublas, _ = teacher_forced("cuda", dtype, graphs=True, batch=1, compile_decode=compile_decode, family=family)
    assert cache.decode_graph is not None and cache.decode_graph.graph is not None
    scale = float(eager.abs().max())
    assert float((replayed - eager).abs().max()) <= tolerance * scale
    assert float((cublas - eager).abs().max()) <= tolerance * scale


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("elastic", [False, True])
def test_request_benchs_own_loop_generates_the_tokens_of_generate(batch, elastic):
    """`bench request`'s own decode loop on a left-padded batch, float32: dense (``static_cache_graph``: one captured
    CUDA graph a step, decoder layers compiled, batch 1 with grouped projections, the split-K kernel over each
    sequence's unpadded entries) against transformers' `generate` with SDPA over its dynamic cache; elastic
    (per-sample routers, the bounded cache's captured steps) against `generate` on the same attached model. 40
    greedy tokens, equal, on two prompt sets of one shape: the second call replays the first's captured step (dense:
    kept in ``kept_steps``; elastic: kept by the attached model)."""
    from elastic_attention.bench.request import own_loop_generate
    from elastic_attention.bench.timing import timed_generate

    model = tiny_model("llama").to("cuda")
    model.set_attn_implementation("sdpa")
    if elastic:
        attach(model, CONFIG, backend="reference", compile_decode=True)
        per_sample_routers(model)
    kept_steps = {}
    for seed in (4, 5):
        ids, mask, _ = (part[:batch] for part in left_padded_batch(seed, 40, 7, 0, "cuda"))
        expected = timed_generate(model, ids, mask, 40, 0)
        actual = own_loop_generate(model, ids, mask, 40, 0, elastic=elastic, kept_steps=kept_steps)
        assert torch.equal(actual["tokens"], expected["tokens"]) and actual["tokens"].shape == (batch, 40)
        assert actual["ttft_s"] > 0 and actual["decode_tokens_per_s"] > 0
        if not elastic:
            assert model.config._attn_implementation == "sdpa"  # the static-cache attention put back
    assert len(kept_steps) == (0 if elastic else 1)
