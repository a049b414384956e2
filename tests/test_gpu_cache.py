"""The bounded KV cache's decode path on a GPU against a float64 CPU run of the same model (device: pytest -m gpu)."""

import pytest
import torch
from conftest import fused_decode_case, left_padded_batch, streaming_suffix_case, teacher_forced_decode, tiny_model

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
    ids, mask, continuation = left_padded_batch(0, 40, 7, steps, device)
    return teacher_forced_decode(model, ids, mask, continuation, past)[0].double().cpu()


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
    """`decode_step` in bf16 over segments of odd lengths against float64."""
    actual, expected = fused_decode_case("cuda", torch.bfloat16, group, head_dim, [0, 37, 104, 105, 2175, 70001])
    assert float((actual - expected).abs().max()) < 2e-2


@pytest.mark.parametrize("count, length", [(777, 777), (1000, 5003), (129, 70001)])
def test_causal_suffix_attention_on_the_gpu_matches_float64(count, length):
    """The fused chunk path for full-store heads in bf16 (flash on the GPU) against the float64 token rule."""
    from elastic_attention.cache.token_attention import causal_suffix_attention, token_attention

    torch.manual_seed(count)
    query = torch.randn(3, 4, count, 128, dtype=torch.float64)
    key, value = torch.randn(2, 3, length, 128, dtype=torch.float64)
    expected = token_attention(query, key, value, torch.arange(length - count, length), torch.arange(length),
                               torch.zeros(3, dtype=torch.bool), sink_tokens=128, local_tokens=2048, scale=128**-0.5)
    actual = causal_suffix_attention(*(t.to("cuda", torch.bfloat16) for t in (query, key, value)), 128**-0.5)
    assert float((actual.double().cpu() - expected).abs().max()) < 2e-2


@pytest.mark.parametrize("count, local", [(3001, 2048), (77, 1000)])
def test_streaming_suffix_attention_on_the_gpu_matches_float64(count, local):
    from elastic_attention.cache.token_attention import streaming_suffix_attention

    torch.manual_seed(count)
    inputs, expected = streaming_suffix_case(count, sink=128, local=local, head_dim=128, scale=128**-0.5, gap=515)
    actual = streaming_suffix_attention(*(t.to("cuda", torch.bfloat16) for t in inputs), local_tokens=local,
                                        scale=128**-0.5)
    assert float((actual.double().cpu() - expected).abs().max()) < 2e-2


def prefill_synchronizations(layers: int) -> dict[str, int]:
    """(file:line) -> host-device synchronizations that elastic attention's cache and integration code made in one
    prefill of a left-padded batch of 2 into a bounded cache (`torch.cuda.set_sync_debug_mode`)."""
    import collections
    import warnings

    model = tiny_model("qwen2", layers=layers).to("cuda")
    attach(model, CONFIG, backend="reference")
    ids, mask, _ = left_padded_batch(0, 40, 7, 1, "cuda")
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    counts = collections.Counter()
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=ElasticCache(model))
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=ElasticCache(model))
                torch.ones(1, device="cuda").item()  # the control: one synchronization made here
            finally:
                torch.cuda.set_sync_debug_mode("default")
    for warning in caught:
        where = warning.filename.replace("\\", "/")
        if "synchroniz" not in str(warning.message):
            continue
        if where.endswith("test_gpu_cache.py"):
            counts["control"] += 1
        elif "elastic_attention/cache/" in where or "elastic_attention/integration/" in where:
            counts[f"{where.split('elastic_attention/')[-1]}:{warning.lineno}"] += 1
    return dict(counts)


def test_a_prefill_into_the_bounded_cache_never_waits_for_the_gpu_per_layer():
    """Oracle: the count itself. The cache copies each layer's routing to the host without waiting and builds its
    stores after the layer's attention is launched, so the cache makes no synchronizing call and the integration's
    calls do not grow with the number of layers (a wait per layer leaves the GPU idle while the host launches)."""
    two, six = prefill_synchronizations(2), prefill_synchronizations(6)
    assert two.pop("control", 0) == 1 and six.pop("control", 0) == 1, "the count did not see the control's .item()"
    assert not [where for where in six if where.startswith("cache/")], six
    assert sum(six.values()) == sum(two.values()), (two, six)
