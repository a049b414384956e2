"""The bounded KV cache (ElasticCache) against the full cache under the same token rule, and the rule itself."""

import gc
import weakref

import pytest
import torch
from conftest import per_sample_routers, streaming_suffix_case, tiny_model

from elastic_attention import ElasticCache, ElasticConfig, InputError, attach, force_routing
from elastic_attention.cache.token_attention import causal_suffix_attention, streaming_suffix_attention, token_attention
from elastic_attention.integration import runtime_of
from elastic_attention.patterns.tokens import token_rule_mask

CONFIG = ElasticConfig(block_size=8, sink_tokens=8, local_tokens=16, xa_stride=4)


def attached(family="llama", cache="bounded", config=CONFIG, layers=2, seed=0, cuda_graphs=True):
    model = tiny_model(family, layers=layers, seed=seed)
    return attach(model, config, backend="reference", cache=cache, cuda_graphs=cuda_graphs)


def prompt(batch=2, width=40, seed=0):
    ids = torch.randint(3, 90, (batch, width), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[1:, :7] = 0
    return ids, mask


def generate(model, ids, mask, tokens=30):
    return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=tokens, do_sample=False,
                          return_dict_in_generate=True, output_scores=True, pad_token_id=0)


def test_token_rule_mask_equals_a_per_element_rule():
    queries = torch.tensor([0, 5, 23, 40])
    keys = torch.tensor([-1, 0, 3, 7, 8, 20, 23, 24, 39, 40, 41])
    streaming = torch.tensor([False, True])
    mask = token_rule_mask(queries, keys, streaming, sink_tokens=4, local_tokens=16)
    for h, stream in enumerate(streaming.tolist()):
        for i, q in enumerate(queries.tolist()):
            for j, k in enumerate(keys.tolist()):
                visible = 0 <= k <= q and (not stream or k < 4 or k > q - 16)
                assert bool(mask[h, i, j]) == visible, (h, q, k)


@pytest.mark.parametrize("softcap, sinks, queries", [(None, False, 5), (1.5, False, 5), (1.5, True, 1),
                                                     (None, True, 5)])
def test_token_attention_matches_float64_softmax_in_any_slot_order(softcap, sinks, queries):
    torch.manual_seed(0)
    query = torch.randn(3, 2, queries, 16, dtype=torch.float64) * 3
    key, value = torch.randn(2, 3, 29, 16, dtype=torch.float64)
    positions = torch.randperm(29)
    positions[3] = -1
    query_positions = torch.arange(29 - queries, 29)
    streaming = torch.tensor([False, True, True])
    sink_logits = torch.randn(3, 2, dtype=torch.float64) + 2.0 if sinks else None
    actual = token_attention(query, key, value, query_positions, positions, streaming, sink_tokens=4,
                             local_tokens=8, scale=0.25, softcap=softcap, sinks=sink_logits)
    for h in range(3):
        for i, q in enumerate(query_positions.tolist()):
            keep = [j for j, k in enumerate(positions.tolist())
                    if 0 <= k <= q and (not streaming[h] or k < 4 or k > q - 8)]
            scores = query[h, :, i] @ key[h, keep].T * 0.25
            if softcap is not None:
                scores = softcap * torch.tanh(scores / softcap)
            weights = scores.exp()
            denominator = weights.sum(-1, keepdim=True)
            if sinks:
                denominator = denominator + sink_logits[h].exp()[:, None]
            torch.testing.assert_close(actual[h, :, i], (weights / denominator) @ value[h, keep])


@pytest.mark.parametrize("family, width", [("llama", 40), ("qwen3", 40), ("llama", 12)])
def test_generation_with_the_bounded_cache_equals_the_full_cache(family, width):
    """Width 12 starts decoding before the rings (sink 8 + local 16) are full, and wraps them later."""
    ids, mask = prompt(width=width)
    results = {}
    for kind in ("bounded", "full"):
        model = attached(family, kind)
        per_sample_routers(model)
        results[kind] = generate(model, ids, mask)
        runtime, cache = runtime_of(model), results[kind].past_key_values
        decisions = torch.stack([runtime.decisions[layer] for layer in runtime.routed_layers])
        assert (decisions[:, 0] != decisions[:, 1]).any(), "the two samples should route differently"
        if kind == "bounded":
            assert isinstance(cache, ElasticCache) and runtime.cache is None
            stores = cache.layers[0].sequences
            streaming = runtime.decisions[0] <= 0.5
            for n, store in enumerate(stores):
                assert store.ring_heads.tolist() == streaming[n].nonzero().flatten().tolist()
    assert torch.equal(results["bounded"].sequences, results["full"].sequences)
    torch.testing.assert_close(torch.stack(results["bounded"].scores), torch.stack(results["full"].scores),
                               atol=1e-5, rtol=1e-5)


def test_ring_wraps_and_keeps_exactly_the_sink_and_the_window():
    model = attached()
    force_routing(model, "sparse")
    ids, mask = prompt(batch=1, width=21)
    cache = generate(model, ids, mask, tokens=40).past_key_values
    cache.end_static()  # graphed steps (under Triton's interpreter) count lengths on the device until it ends
    for layer in cache.layers:
        (store,) = layer.sequences
        assert store.length == 21 + 39 and store.full_keys.shape[0] == 0
        positions = store.ring_positions.tolist()
        assert sorted(positions) == list(range(8)) + list(range(store.length - 16, store.length))
        for slot, position in enumerate(positions):
            assert slot == (position if position < 8 else 8 + (position - 8) % 16)
    ring_bytes = 2 * 2 * (8 + 16) * 16 * 4 + (8 + 16) * 8
    assert cache.nbytes() == 2 * ring_bytes
    assert cache.get_seq_length() == 60


def test_memory_is_released_per_sample():
    ids, mask = prompt(width=600)
    model = attached(cuda_graphs=False)  # eager steps grow storage with the sequence; static mode preallocates
    force_routing(model, torch.tensor([[True, False], [False, False]]))
    cache = generate(model, ids, mask, tokens=2).past_key_values
    layer0, layer1 = cache.layers
    for store in layer0.sequences:
        assert store.full_keys.shape[0] == 1 and store.ring_keys.shape[:2] == (1, 24)
        assert 601 <= store.full_keys.shape[1] <= 601 + 601 // 32 + 1
    for store in layer1.sequences:
        assert store.full_keys.shape[0] == 0 and store.ring_keys.shape[:2] == (2, 24)
    # One head in four keeps everything: the cache is about a quarter of the model's own (2 layers, k and v,
    # 2 samples, 2 KV heads, 601 entries of 16 float32).
    full_cache_bytes = 2 * 2 * 2 * 2 * 601 * 16 * 4
    assert cache.nbytes() < 0.33 * full_cache_bytes


def test_a_finished_generations_cache_is_freed_without_the_cycle_collector():
    """A dropped cache must go by reference counting alone: GPU memory does not trigger Python's cycle collector,
    and a cache kept alive by a cycle held every generate call's keys and values until it ran."""
    ids, mask = prompt(width=60)
    model = attached()
    gc.disable()
    try:
        output = generate(model, ids, mask, tokens=3)
        cache, layer = weakref.ref(output.past_key_values), weakref.ref(output.past_key_values.layers[0])
        del output
        assert cache() is None and layer() is None
    finally:
        gc.enable()


@pytest.mark.parametrize("routing", ["sparse", "mixed", "full"])
def test_the_bounded_cache_never_holds_more_than_the_full_cache(routing):
    """Short prompts under a window longer than the sequence: rings grow with the sequence (slot p holds position
    p until the ring is full) instead of holding sink + local slots from the start. Keys and values never exceed the
    model's own cache by more than the 1/32 kept for coming decode steps (plus one entry); each ring slot also keeps
    its position (8 bytes)."""
    wide = ElasticConfig(block_size=8, sink_tokens=128, local_tokens=2048, xa_stride=4)
    ids, mask = prompt(batch=2, width=50)
    forced = {"sparse": "sparse", "full": "full", "mixed": torch.tensor([[True, False], [False, True]])}[routing]
    bounded = attached(config=wide, cuda_graphs=False)  # eager steps (static mode preallocates a capacity)
    force_routing(bounded, forced)
    output = generate(bounded, ids, mask, tokens=20)
    full = attached(config=wide, cache="full")
    force_routing(full, forced)
    reference = generate(full, ids, mask, tokens=20)
    assert torch.equal(output.sequences, reference.sequences)
    cache = output.past_key_values
    stored_entries = sum(store.full_keys.shape[0] * store.full_keys.shape[1]
                         + store.ring_keys.shape[0] * store.ring_keys.shape[1]
                         for layer in cache.layers for store in layer.sequences)
    entries = sum(store.length * (store.full_heads.numel() + store.ring_heads.numel())
                  for layer in cache.layers for store in layer.sequences)
    assert entries <= stored_entries <= entries + entries // 32 + 2 * 2 * 2  # + one per (layer, sequence, store)
    keys_and_values = 2 * stored_entries * 16 * 4
    full_cache_bytes = sum(layer.keys.numel() + layer.values.numel() for layer in reference.past_key_values.layers) * 4
    assert keys_and_values <= full_cache_bytes * (1 + 1 / 32) + 2 * 2 * 2 * 2 * 16 * 4
    assert cache.nbytes() < 1.1 * full_cache_bytes


def test_chunked_prefill_routes_on_the_first_chunk_and_equals_the_full_cache():
    ids, mask = prompt(batch=2, width=70, seed=3)
    chunks = [(0, 30), (30, 53), (53, 70)]
    logits, caches = {}, {}
    for kind in ("bounded", "full"):
        model = attached(cache=kind)
        per_sample_routers(model)
        cache = ElasticCache(model) if kind == "bounded" else None
        outputs = []
        for begin, end in chunks:
            output = model(input_ids=ids[:, begin:end], attention_mask=mask[:, :end], past_key_values=cache,
                           use_cache=True)
            cache = output.past_key_values
            outputs.append(output.logits)
        logits[kind], caches[kind] = torch.cat(outputs, dim=1), cache
        runtime = runtime_of(model)
        first = attached(cache=kind)
        per_sample_routers(first)
        first(input_ids=ids[:, :30], attention_mask=mask[:, :30])
        for layer in runtime.routed_layers:
            assert torch.equal(runtime.decisions[layer], runtime_of(first).decisions[layer])
    assert isinstance(caches["bounded"], ElasticCache)
    torch.testing.assert_close(logits["bounded"], logits["full"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("count, length", [(1, 1), (5, 5), (13, 40), (37, 38)])
def test_causal_suffix_attention_matches_the_float64_rule(count, length):
    """Oracle: `token_attention` (masked float64 softmax) with the chunk's positions and no streaming head."""
    torch.manual_seed(count)
    query = torch.randn(3, 2, count, 16, dtype=torch.float64)
    key, value = torch.randn(2, 3, length, 16, dtype=torch.float64)
    expected = token_attention(query, key, value, torch.arange(length - count, length), torch.arange(length),
                               torch.zeros(3, dtype=torch.bool), sink_tokens=4, local_tokens=8, scale=0.3)
    torch.testing.assert_close(causal_suffix_attention(query, key, value, 0.3), expected)


@pytest.mark.parametrize("count, block, sink, local", [(1, None, 4, 8), (29, None, 4, 8), (29, 5, 3, 11),
                                                       (7, 16, 1, 2), (40, 13, 8, 16)])
def test_streaming_suffix_attention_matches_the_float64_rule(count, block, sink, local):
    """Oracle: `token_attention` over sink, window and chunk at their logical positions, every head streaming."""
    torch.manual_seed(count + local)
    inputs, expected = streaming_suffix_case(count, sink, local, head_dim=16, scale=0.25)
    actual = streaming_suffix_attention(*inputs, local_tokens=local, scale=0.25, block=block)
    torch.testing.assert_close(actual, expected)


def test_chunked_prefill_in_steady_state_matches_the_rule_per_chunk_size():
    """A long prompt in chunks of odd sizes (every later chunk after a complete window, so the fused paths run)
    equals the full cache under the same routing; the full cache attends by the general token rule."""
    ids, mask = prompt(batch=1, width=131, seed=5)
    bounds = [0, 41, 44, 90, 131]
    logits = {}
    for kind in ("bounded", "full"):
        model = attached(cache=kind)
        force_routing(model, torch.tensor([[True, False], [False, True]]))
        cache = ElasticCache(model) if kind == "bounded" else None
        outputs = []
        for begin, end in zip(bounds, bounds[1:]):
            output = model(input_ids=ids[:, begin:end], attention_mask=mask[:, :end], past_key_values=cache,
                           use_cache=True)
            cache = output.past_key_values
            outputs.append(output.logits)
        logits[kind] = torch.cat(outputs, dim=1)
    torch.testing.assert_close(logits["bounded"], logits["full"], atol=1e-5, rtol=1e-5)


def test_misuse_is_refused_with_the_reason():
    ids, mask = prompt(batch=1, width=20)
    model, other = attached(), attached(seed=1)
    cache = ElasticCache(model, max_length=24)
    model(input_ids=ids, attention_mask=mask, past_key_values=cache)
    with pytest.raises(InputError, match="max_length 24"):
        longer = torch.ones(1, 5, dtype=torch.long)
        model(input_ids=longer, attention_mask=torch.ones(1, 25, dtype=torch.long), past_key_values=cache)
    with pytest.raises(InputError, match="another model"):
        other(input_ids=ids, attention_mask=mask, past_key_values=ElasticCache(model))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_decode_step_matches_the_float64_rule(dtype):
    torch.manual_seed(1)
    query = torch.randn(3, 4, 1, 32, dtype=torch.float64)
    key, value = torch.randn(2, 3, 41, 32, dtype=torch.float64)
    positions = torch.randperm(41)
    positions[5] = -1
    streaming = torch.tensor([True, False, True])
    rule = dict(sink_tokens=4, local_tokens=8, scale=32**-0.5)
    expected = token_attention(query, key, value, torch.tensor([40]), positions, streaming, **rule)
    actual = token_attention(query.to(dtype), key.to(dtype), value.to(dtype), torch.tensor([40]), positions,
                             streaming, **rule)
    assert actual.dtype == dtype
    torch.testing.assert_close(actual.double(), expected, atol=2e-2, rtol=2e-2)


def test_repeating_the_cache_repeats_each_samples_routing():
    model = attached()
    per_sample_routers(model)
    ids, mask = prompt(width=30)
    runtime = runtime_of(model)

    def prefill():
        output = model(input_ids=ids, attention_mask=mask, use_cache=True)
        return output.past_key_values, output.logits[:, -1:].argmax(-1)

    def decode(cache, token, rows_mask):
        step_mask = torch.cat([rows_mask, torch.ones_like(rows_mask[:, :1])], dim=1)
        return model(input_ids=token, attention_mask=step_mask, past_key_values=cache).logits[:, -1]

    with torch.no_grad():
        cache, token = prefill()
        expected = decode(cache, token, mask)
        cache, token = prefill()
        routed = {layer: z.clone() for layer, z in runtime.decisions.items()}
        cache.batch_repeat_interleave(2)
        for layer, z in runtime.decisions.items():
            assert torch.equal(z, routed[layer].repeat_interleave(2, dim=0))
        repeated = decode(cache, token.repeat_interleave(2, dim=0), mask.repeat_interleave(2, dim=0))
    torch.testing.assert_close(repeated, expected.repeat_interleave(2, dim=0), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("sequences, kv_heads", [(1, 2), (3, 5), (4, 1)])
def test_head_split_lists_each_sequences_full_and_streaming_heads_in_order(sequences, kv_heads):
    """Oracle: a per-head loop over the routing; also after the batch is reordered, and with no routing given."""
    model = attached()
    cache = ElasticCache(model)
    streaming = torch.rand(sequences, kv_heads, generator=torch.Generator().manual_seed(kv_heads)) < 0.5
    cache.route_layer(0, streaming)

    def expected(row):
        return ([h for h in range(kv_heads) if not row[h]], [h for h in range(kv_heads) if row[h]])

    for n in range(sequences):
        full, ring = cache.head_split(0, n, kv_heads, torch.device("cpu"))
        assert (full.tolist(), ring.tolist()) == expected(streaming[n].tolist())
    order = torch.arange(sequences).flip(0)
    cache._select(order)
    for n in range(sequences):
        full, ring = cache.head_split(0, n, kv_heads, torch.device("cpu"))
        assert (full.tolist(), ring.tolist()) == expected(streaming[order[n]].tolist())
    full, ring = cache.head_split(1, 0, kv_heads, torch.device("cpu"))
    assert (full.tolist(), ring.tolist()) == (list(range(kv_heads)), [])


@pytest.mark.parametrize(("first", "count"), [(0, 1), (0, 5), (0, 37), (3, 2), (5, 19), (11, 1), (30, 1), (2, 61)])
@pytest.mark.parametrize("with_heads", [False, True])
def test_a_ring_keeps_what_writing_each_position_in_turn_keeps(first, count, with_heads):
    """Oracle: each position p written in order into slot p (p < sink) or sink + (p - sink) % local, later ones
    overwriting earlier ones. `write_ring` writes only the sink's and the last local positions, and with ``heads``
    (a prefill's every KV head) picks the entries before the heads."""
    from elastic_attention.cache.stores import SequenceStore, StreamingWindow, write_ring

    sink, local, head_dim, num_kv = 4, 7, 3, 5
    window = StreamingWindow(sink, local)
    generator = torch.Generator().manual_seed(first * 100 + count)
    heads = torch.tensor([4, 1, 2])
    every_head = torch.randn(num_kv, count, head_dim, generator=generator)
    every_value = torch.randn(num_kv, count, head_dim, generator=generator)
    earlier = torch.randn(len(heads), min(first, sink + local), head_dim, generator=generator)

    def store_after_first():  # a ring that already holds positions 0 .. first - 1 (its last local in the window)
        held = [p for p in range(first) if p < sink or p >= first - local]
        slots = [p if p < sink else sink + (p - sink) % local for p in held]
        size = min(first, sink + local)
        positions = torch.full((size,), -1, dtype=torch.long)
        positions[slots] = torch.tensor(held, dtype=torch.long)
        return SequenceStore(torch.tensor([0]), torch.zeros(1, 0, head_dim), torch.zeros(1, 0, head_dim), heads,
                             earlier.clone(), -earlier.clone(), positions, length=first)

    expected = store_after_first()  # grown to the ring's size at once: slots never written stay at position -1
    grow = sink + local - expected.ring_keys.shape[1]
    expected.ring_keys = torch.cat([expected.ring_keys, torch.zeros(len(heads), grow, head_dim)], dim=1)
    expected.ring_values = torch.cat([expected.ring_values, torch.zeros(len(heads), grow, head_dim)], dim=1)
    expected.ring_positions = torch.cat([expected.ring_positions, torch.full((grow,), -1)])
    for offset in range(count):
        position = first + offset
        slot = position if position < sink else sink + (position - sink) % local
        expected.ring_keys[:, slot] = every_head[heads, offset]
        expected.ring_values[:, slot] = every_value[heads, offset]
        expected.ring_positions[slot] = position

    store = store_after_first()
    if with_heads:
        write_ring(store, every_head, every_value, first, window, heads=heads)
    else:
        write_ring(store, every_head[heads], every_value[heads], first, window)
    size = store.ring_keys.shape[1]
    assert torch.equal(store.ring_positions, expected.ring_positions[:size])
    assert torch.equal(store.ring_keys, expected.ring_keys[:, :size])
    assert torch.equal(store.ring_values, expected.ring_values[:, :size])
    assert (expected.ring_positions[size:] == -1).all()  # no slot written beyond the storage


def test_a_prefill_stores_full_heads_with_static_modes_room_only_where_static_steps_follow(monkeypatch):
    """Where decode steps will be captured, a prefill's full stores get static mode's capacity at once, and entering
    static mode copies none of them; elsewhere a prefill stores just the prompt."""
    from elastic_attention.cache import bounded
    from elastic_attention.cache.stores import decode_capacity

    ids, mask = prompt(width=600)
    for graphs in (True, False):
        model = attached(cuda_graphs=graphs)
        force_routing(model, torch.tensor([[True, False], [False, False]]))
        monkeypatch.setattr(bounded.ElasticCache, "_static_capable", lambda self, device, dtype: True)
        cache = ElasticCache(model)
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, past_key_values=cache)
        monkeypatch.undo()
        stores = [store for layer in cache.layers for store in layer.sequences if store.full_heads.numel()]
        assert stores and all(store.full_count == store.length for store in stores)
        expected = [decode_capacity(600, None) if graphs else store.length for store in stores]  # 600 and 593
        assert [store.full_keys.shape[1] for store in stores] == expected
        for store in stores:  # the prompt's entries are where they were written: position order from 0
            assert store.full_keys[:, store.full_count:].abs().sum() == 0


def test_the_address_tables_head_lists_are_each_stores_own_heads():
    """Oracle: each store's full and streaming heads as the prefill put them on the device (`head_split`); the host
    lists come from the routing's host copy, with per-sample routing in a batch of four."""
    model = attached(layers=3, seed=0)
    per_sample_routers(model)
    ids = torch.randint(3, 90, (4, 50), generator=torch.Generator().manual_seed(0))
    cache = ElasticCache(model)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=torch.ones_like(ids), past_key_values=cache)
    seen = set()
    for layer in cache.layers:
        lists = layer._head_lists()
        assert lists == [(store.full_heads.tolist(), store.ring_heads.tolist()) for store in layer.sequences]
        seen.update((tuple(full), tuple(ring)) for full, ring in lists)
    assert seen == {((0, 1), ()), ((0,), (1,)), ((1,), (0,)), ((), (0, 1))}  # every split of two heads
