"""The bounded KV cache's decode path on a GPU against a float64 CPU run of the same model (device: pytest -m gpu)."""

import pytest
import torch
from conftest import streaming_suffix_case, tiny_model

from elastic_attention import ElasticCache, ElasticConfig, attach, force_routing

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CONFIG = ElasticConfig(block_size=8, sink_tokens=8, local_tokens=16, xa_stride=4)
#: Layer 0: KV head 0 on full attention, head 1 on SSA; layer 1: both on SSA.
ROUTING = torch.tensor([[True, False], [False, False]])


def teacher_forced_logits(device, dtype, cache, steps=24, fused_decode=True):
    """Next-token logits [steps + 1, batch, vocab] (float64) of a left-padded batch of 2 fed fixed tokens."""
    model = tiny_model("qwen3").to(device=device, dtype=dtype)
    attach(model, CONFIG, backend="reference", cache=cache)
    force_routing(model, ROUTING)
    past = ElasticCache(model, fused_decode=fused_decode) if cache == "bounded" else None
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 90, (2, 40), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, :7] = 0
    continuation = torch.randint(3, 90, (2, steps), generator=generator)
    ids, mask, continuation = ids.to(device), mask.to(device), continuation.to(device)
    logits = []
    with torch.no_grad():
        output = model(input_ids=ids, attention_mask=mask, past_key_values=past, use_cache=True)
        past = output.past_key_values
        logits.append(output.logits[:, -1])
        for step in range(steps):
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            output = model(input_ids=continuation[:, step : step + 1], attention_mask=mask, past_key_values=past,
                           use_cache=True)
            logits.append(output.logits[:, -1])
    return torch.stack(logits).double().cpu()


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
def test_bounded_decode_on_the_gpu_matches_float64(dtype, tolerance):
    """Both decode paths of the bounded cache (fused Triton, per-sequence torch) and the full cache; 80 steps, so the
    full stores outgrow their first capacity (storage moves under the fused path's address table)."""
    expected = teacher_forced_logits("cpu", torch.float64, "full", steps=80)
    scale = float(expected.abs().max())
    for cache, fused in (("bounded", True), ("bounded", False), ("full", True)):
        actual = teacher_forced_logits("cuda", dtype, cache, steps=80, fused_decode=fused)
        assert float((actual - expected).abs().max()) <= tolerance * scale, (cache, fused)


@pytest.mark.parametrize("group, head_dim", [(4, 128), (1, 64), (3, 96)])
def test_fused_decode_kernels_match_float64(group, head_dim):
    """`write_step_entries` + `decode_attention` over segments of odd lengths (full stores and rings, filled or not,
    at and past the wrap point) against float64 attention over each segment's visible positions."""
    from elastic_attention.backends.triton_decode import DecodeSegments, decode_attention, write_step_entries

    torch.manual_seed(group * head_dim)
    sink, local, num_kv = 5, 100, 3
    ring_size = sink + local
    lengths = [0, 37, 104, 105, 2175, 70001]  # entries before the step; the step adds one
    is_full = lambda n, h: (n + h) % 2 == 0  # noqa: E731
    columns, kept, history = [[], [], [], []], [], {}
    for n, length in enumerate(lengths):
        for h in range(num_kv):
            past = torch.randn(2, length, head_dim, dtype=torch.float64)  # keys, values by position
            history[n, h] = past
            full = is_full(n, h)
            store = torch.randn(2, length + 17 if full else ring_size, head_dim, dtype=torch.float64)
            positions = torch.full((ring_size,), -1, dtype=torch.long)
            survivors = torch.arange(length) if full else torch.cat(
                [torch.arange(min(sink, length)), torch.arange(min(length, max(sink, length - local)), length)])
            slots = survivors if full else torch.where(survivors < sink, survivors, sink + (survivors - sink) % local)
            store[:, slots] = past[:, survivors]
            positions[slots[:ring_size]] = survivors[:ring_size]
            store, positions = store.to("cuda", torch.bfloat16), positions.cuda()
            kept += [store, positions]
            columns[0].append(store[0].data_ptr())
            columns[1].append(store[1].data_ptr())
            columns[2].append(0 if full else positions.data_ptr())
            columns[3].append(length)
    segments = DecodeSegments.from_columns(*columns, num_kv_heads=num_kv, device=torch.device("cuda"))
    assert segments.aligned
    new_entries = torch.randn(2, len(lengths), num_kv, 1, head_dim, dtype=torch.float64)
    query = torch.randn(len(lengths), num_kv * group, 1, head_dim, dtype=torch.float64)
    write_step_entries(*new_entries.to("cuda", torch.bfloat16), segments, sink_tokens=sink, local_tokens=local)
    actual = decode_attention(query.to("cuda", torch.bfloat16), segments, 0.1, ring_size=ring_size,
                              max_entries=max(lengths) + 1)
    assert segments.lengths.tolist() == [length + 1 for length in lengths for _ in range(num_kv)]
    expected = torch.empty_like(query)
    for (n, h), past in history.items():
        length = lengths[n]
        entries = torch.cat([past, new_entries[:, n, h]], dim=1)  # positions 0 .. length
        visible = torch.arange(length + 1)
        if not is_full(n, h):
            visible = visible[(visible < sink) | (visible > length - local)]
            ring_positions = kept[2 * (n * num_kv + h) + 1].cpu()
            assert sorted(ring_positions[ring_positions >= 0].tolist()) == visible.tolist()
        keys, values = entries[:, visible].to(torch.bfloat16).double()
        rows = query[n, h * group : (h + 1) * group, 0].to(torch.bfloat16).double()
        expected[n, h * group : (h + 1) * group, 0] = torch.softmax(rows @ keys.T * 0.1, -1) @ values
    assert float((actual.double().cpu() - expected).abs().max()) < 2e-2


@pytest.mark.parametrize("count, length", [(777, 777), (1000, 5003), (129, 70001)])
def test_causal_suffix_attention_on_the_gpu_matches_float64(count, length):
    """The fused chunk path for full-store heads in bf16 (flash on the GPU) against the float64 token rule."""
    from elastic_attention.backends.tokens import causal_suffix_attention, token_attention

    torch.manual_seed(count)
    query = torch.randn(3, 4, count, 128, dtype=torch.float64)
    key, value = torch.randn(2, 3, length, 128, dtype=torch.float64)
    expected = token_attention(query, key, value, torch.arange(length - count, length), torch.arange(length),
                               torch.zeros(3, dtype=torch.bool), sink_tokens=128, local_tokens=2048, scale=128**-0.5)
    actual = causal_suffix_attention(*(t.to("cuda", torch.bfloat16) for t in (query, key, value)), 128**-0.5)
    assert float((actual.double().cpu() - expected).abs().max()) < 2e-2


@pytest.mark.parametrize("count, local", [(3001, 2048), (77, 1000)])
def test_streaming_suffix_attention_on_the_gpu_matches_float64(count, local):
    from elastic_attention.backends.tokens import streaming_suffix_attention

    torch.manual_seed(count)
    inputs, expected = streaming_suffix_case(count, sink=128, local=local, head_dim=128, scale=128**-0.5, gap=515)
    actual = streaming_suffix_attention(*(t.to("cuda", torch.bfloat16) for t in inputs), local_tokens=local,
                                        scale=128**-0.5)
    assert float((actual.double().cpu() - expected).abs().max()) < 2e-2
