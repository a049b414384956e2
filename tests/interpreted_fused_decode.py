"""The fused decode step on the CPU through Triton's interpreter; run by `test_triton_interpreter.py` in a process
with ``TRITON_INTERPRET=1`` (the variable must be set before Triton compiles anything), together with
`test_bounded_cache.py`, whose decode steps then take the fused path."""

import os

import pytest
import torch
from conftest import (
    caches_taking_turns,
    fused_decode_case,
    generate_with_and_without_graphs,
    left_padded_batch,
    per_sample_routers,
    teacher_forced_decode,
    tiny_model,
)

from elastic_attention import ElasticCache, ElasticConfig, attach
from elastic_attention.errors import InputError
from elastic_attention.cache import triton_decode
from elastic_attention.integration import runtime_of

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")


@pytest.mark.parametrize("group, head_dim, processors, merge_splits",
                         [(4, 32, 4, 128), (1, 16, 4, 128), (3, 24, 4, 128), (4, 32, 50, 128), (2, 40, 50, 4)])
def test_fused_decode_kernels_match_float64(group, head_dim, processors, merge_splits, monkeypatch):
    """With 50 "processors" the longer segments split their keys (8 splits of 384, against 1 with 4), then merged;
    the last case merges 4 splits at a time (two rounds), and its head_dim of 40 takes two merge programs per query
    head (chunks of 32, the second cut at 40)."""
    monkeypatch.setattr(triton_decode, "_processors", lambda device: processors)
    monkeypatch.setattr(triton_decode, "MERGE_SPLITS", merge_splits)
    actual, expected = fused_decode_case("cpu", torch.float32, group, head_dim, [0, 37, 104, 105, 2175, 3001])
    assert float((actual - expected).abs().max()) < 1e-4


def test_splits_past_every_entry_change_nothing(monkeypatch):
    """Key splits sized for a bound 4x the longest segment (a captured step's capacity): most programs start past
    their segment's entries and return at once, the merge reads only the splits that hold entries."""
    monkeypatch.setattr(triton_decode, "_processors", lambda device: 50)
    actual, expected = fused_decode_case("cpu", torch.float32, 2, 16, [0, 37, 105, 383, 384, 1500], max_entries=6004)
    assert float((actual - expected).abs().max()) < 1e-4


def test_decode_steps_take_the_fused_path_and_equal_the_per_sequence_path():
    """A left-padded batch with per-sample routing, 70 steps (the full stores grow, the table is rebuilt)."""
    config = ElasticConfig(block_size=8, sink_tokens=8, local_tokens=16, xa_stride=4)
    ids, prompt_mask, continuation = _batch(steps=70)  # a prompt on which the two samples route differently
    runs = {}
    for fused in (True, False):
        model = tiny_model("llama")
        attach(model, config, backend="reference")
        per_sample_routers(model)
        cache = ElasticCache(model, fused_decode=fused, cuda_graphs=False)  # the eager fused path
        mask = prompt_mask
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


# -- static mode and the graphed forward (on the CPU a graphed step runs its static path eagerly) ------------------

STATIC_CONFIG = ElasticConfig(block_size=8, sink_tokens=8, local_tokens=16, xa_stride=4)


def _batch(seed=4, prompt=30, steps=60):
    return left_padded_batch(seed, prompt, 5, steps)  # mixed prompt lengths: the second sample is left-padded


def _teacher_forced(graphs: bool, ids, mask, continuation, max_length=None, compile_decode=False):
    """(next-token logits [steps + 1, 2, vocab] of fixed tokens fed one step at a time, the cache, the model)."""
    model = tiny_model("llama")
    attach(model, STATIC_CONFIG, backend="reference", compile_decode=compile_decode)
    per_sample_routers(model)
    cache = ElasticCache(model, cuda_graphs=graphs, max_length=max_length)
    logits, cache = teacher_forced_decode(model, ids, mask, continuation, cache)
    return logits, cache, model


def _slot_rule(length: int, sink: int, local: int) -> dict[int, int]:
    """Slow rule: slot -> the position a ring holds there after ``length`` tokens (the last to land in it)."""
    held = {}
    for position in range(length):
        held[position if position < sink else sink + (position - sink) % local] = position
    return held


def test_static_steps_equal_eager_steps_and_keep_the_slot_rule(monkeypatch):
    """40 steps past a 30-token prompt (the rings wrap) of a left-padded batch with per-sample routing; static mode
    is left and entered again every 7 tokens (a tiny capacity), so the address table is rebuilt several times."""
    from elastic_attention.integration import decode_graph

    monkeypatch.setattr(decode_graph, "decode_capacity", lambda longest, max_length: longest + 7)
    ids, mask, continuation = _batch(steps=40)
    static, static_cache, _ = _teacher_forced(True, ids, mask, continuation)
    eager, eager_cache, _ = _teacher_forced(False, ids, mask, continuation)
    assert float((static - eager).abs().max()) < 1e-5
    assert static_cache.static_capacity is not None and 0 < static_cache.static_steps < 7
    assert static_cache.fused_decode_steps == eager_cache.fused_decode_steps == continuation.shape[1]
    device_lengths = [lengths.clone() for lengths in static_cache.device_lengths()]
    static_cache.end_static()
    sink, local = STATIC_CONFIG.sink_tokens, STATIC_CONFIG.local_tokens
    for layer, other in zip(static_cache.layers, eager_cache.layers):
        host = [store.length for store in layer.sequences for _ in range(2)]
        assert device_lengths[layer.layer_index].tolist() == host == [70, 70, 65, 65]
        for store, reference in zip(layer.sequences, other.sequences):
            assert store.length == reference.length
            count = store.full_count
            assert torch.equal(store.full_keys[:, :count], reference.full_keys[:, :count])
            if store.ring_heads.numel():
                for slot, position in _slot_rule(store.length, sink, local).items():
                    assert int(store.ring_positions[slot]) == position
                    assert torch.equal(store.ring_keys[:, slot], reference.ring_keys[:, slot])


def test_auto_compile_sets_the_static_step_up_again_once_its_steps_would_have_paid(monkeypatch):
    """``compile_decode="auto"`` with a threshold of 25 steps: the static step is set up again after the 25th step of
    the batch of 2 (on a CPU nothing compiles: the switch alone), and the logits stay those of eager steps."""
    from elastic_attention.integration import decode_graph

    monkeypatch.setattr(decode_graph, "compile_after_steps", lambda num_layers: 25)
    ids, mask, continuation = _batch(steps=40)
    static, static_cache, model = _teacher_forced(True, ids, mask, continuation, compile_decode="auto")
    eager, _, _ = _teacher_forced(False, ids, mask, continuation)
    assert float((static - eager).abs().max()) < 1e-5
    assert model.forward.compile_policy.uncompiled_steps == {2: 25}
    assert static_cache.decode_graph.compile_layers and static_cache.static_steps == 15


def test_generate_with_graphs_equals_generate_without():
    """Greedy, greedy with an EOS that stops one sample early while the other continues, and seeded sampling."""
    ids, mask, _ = _batch(seed=5)
    results, caches, stop = generate_with_and_without_graphs(STATIC_CONFIG, ids, mask, new_tokens=24, first_stop=3)
    greedy_cache, sampled_cache = caches[True]  # the later calls (same prompts and routing) took the first's step
    assert greedy_cache.static_capacity is None and sampled_cache.static_steps > 0
    assert all(cache.static_steps == 0 for cache in caches[False])
    for with_graphs, without in zip(results[True], results[False]):
        assert torch.equal(with_graphs, without)
    greedy, stopped, _ = results[True]
    assert (stopped[0, ids.shape[1] + stop + 1 :] == 0).all() and torch.equal(stopped[1], greedy[1])


def test_later_caches_replay_a_kept_step_over_their_own_tables():
    caches_taking_turns(STATIC_CONFIG, "cpu", tolerance=1e-5)


def test_static_capacity_is_bounded_by_max_length():
    """A full store never wraps: the step past max_length raises, whether the steps are static or not."""
    ids, mask, continuation = _batch(steps=6)
    for graphs in (True, False):
        with pytest.raises(InputError, match="max_length 34"):
            _teacher_forced(graphs, ids, mask, continuation, max_length=34)


def test_other_forwards_end_static_mode():
    """A chunk after static steps, and a reorder, leave static mode with every length counted."""
    ids, mask, continuation = _batch(steps=12)
    runs = {}
    for graphs in (True, False):
        _, cache, model = _teacher_forced(graphs, ids, mask, continuation[:, :8])
        assert (cache.static_capacity is not None) == graphs
        mask_now = torch.cat([mask, torch.ones(2, 8 + 4, dtype=mask.dtype)], dim=1)
        with torch.no_grad():
            chunk = model(input_ids=continuation[:, 8:12], attention_mask=mask_now, cache=cache).logits
        assert cache.static_capacity is None and cache.get_seq_length() == ids.shape[1] + 12
        cache.reorder_cache(torch.tensor([1, 0]))
        runs[graphs] = chunk
    assert float((runs[True] - runs[False]).abs().max()) < 1e-5


def test_graphed_steps_need_no_gradients_and_plain_outputs():
    """With gradients on, or hidden states asked for, a decode step runs the model's own forward (static mode ends)."""
    ids, mask, continuation = _batch(steps=3)
    _, cache, model = _teacher_forced(True, ids, mask, continuation[:, :2])
    assert cache.static_capacity is not None
    mask = torch.cat([mask, torch.ones(2, 3, dtype=mask.dtype)], dim=1)
    output = model(input_ids=continuation[:, 2:3], attention_mask=mask, cache=cache, output_hidden_states=True)
    assert cache.static_capacity is None and output.hidden_states is not None


def test_static_storage_is_the_capacity_and_no_more():
    """Static mode preallocates full stores for the capacity (the longest sequence plus max(256, 1/32), a multiple of
    256) and rings at their sink + local slots; nothing else grows."""
    from elastic_attention.cache.stores import decode_capacity

    ids, mask, continuation = _batch(prompt=600, steps=2)
    _, cache, _ = _teacher_forced(True, ids, mask, continuation)
    capacity = decode_capacity(601, None)
    assert cache.static_capacity == capacity == 1024
    for layer in cache.layers:
        for store in layer.sequences:
            assert store.full_keys.shape[1] in (0, capacity)
            assert store.ring_keys.shape[1] == (STATIC_CONFIG.sink_tokens + STATIC_CONFIG.local_tokens
                                                if store.ring_heads.numel() else 0)


def test_the_static_cache_baseline_attends_as_the_dense_model():
    """`bench decode-graphs`' dense baseline (transformers' StaticCache, the split-K kernel over its filled entries)
    gives the plain model's logits over 10 steps."""
    from elastic_attention.bench.decode_graphs import STATIC_ATTENTION, STATIC_ATTENTION_NAME, Stepper, static_copy

    model = tiny_model("llama")
    model.set_attn_implementation("sdpa")
    ids = torch.randint(3, 90, (2, 37), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        output = model(input_ids=ids, use_cache=True)
        token = output.logits[:, -1:].argmax(-1)
        static = static_copy(model, output.past_key_values, 37, 37 + 20)
        dense = Stepper(model, output.past_key_values, token, 37)
        expected = [dense() for _ in range(10)]
        STATIC_ATTENTION.prepare(static, 37, None)
        model.set_attn_implementation(STATIC_ATTENTION_NAME)
        baseline = Stepper(model, static, token, 37)
        actual = [baseline() for _ in range(10)]
    assert max(float((a - e).abs().max()) for a, e in zip(actual, expected)) < 1e-5
    assert all(lengths.tolist() == [47] * 4 for lengths in STATIC_ATTENTION.device_lengths())


def test_the_static_cache_baseline_skips_each_sequences_left_padding():
    """`bench request`'s captured dense decode over a left-padded batch (pads of 0 and 13; positions counted from each
    sequence's first token; end of sequence suppressed): every step's logits equal those of the sequence decoded
    alone and unpadded by the plain model (oracle: transformers' SDPA over its dynamic cache), 12 greedy steps."""
    from elastic_attention.bench.decode_graphs import STATIC_ATTENTION, STATIC_ATTENTION_NAME, Stepper, static_copy

    model = tiny_model("llama")
    model.set_attn_implementation("sdpa")
    ids, mask, _ = left_padded_batch(seed=4, prompt=41, padding=13, steps=0)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    suppressed = [5]
    with torch.no_grad():
        expected = []
        for row, pad in enumerate((0, 13)):
            output = model(input_ids=ids[row : row + 1, pad:], use_cache=True)
            alone = Stepper(model, output.past_key_values, output.logits[:, -1:].argmax(-1), 41 - pad,
                            suppressed_tokens=suppressed)
            expected.append(torch.cat([alone() for _ in range(12)]))
        output = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
        static = static_copy(model, output.past_key_values, 41, 41 + 20)
        STATIC_ATTENTION.prepare(static, 41, None, pads=[0, 13])
        model.set_attn_implementation(STATIC_ATTENTION_NAME)
        batched = Stepper(model, static, output.logits[:, -1:].argmax(-1), 41, positions=positions[:, -1:] + 1,
                          suppressed_tokens=suppressed)
        actual = torch.stack([batched()[:, -1] for _ in range(12)], dim=1)  # [2, steps, vocab]
    kept = torch.ones(actual.shape[-1], dtype=torch.bool)
    kept[suppressed] = False  # -inf in both
    for row in range(2):
        assert float((actual[row, :, kept] - expected[row][:, -1, kept]).abs().max()) < 1e-5
    assert all(lengths.tolist() == [53, 53, 40, 40] for lengths in STATIC_ATTENTION.device_lengths())
    with pytest.raises(InputError, match="pads must give 0 <= pad < 41"):
        STATIC_ATTENTION.prepare(static, 41, None, pads=[0, 41])


def _compiled_static_steps(layers: int, compile_layers: bool, reset: bool = False, group_projections: bool = False,
                           batch: int = 2):
    """(logits [steps, batch, vocab] of 4 static steps of a ``layers``-layer tiny llama, its decoder layers run by
    ``decode_graph.decode_layers`` as a captured step runs them (compiled, projections grouped, as asked), and the
    graphs Dynamo compiled for it; ``reset`` first forgets every compiled graph)."""
    from torch._dynamo.utils import counters

    from elastic_attention.integration import decode_graph
    from elastic_attention.integration.families import decoder_layers, family_of

    if reset:
        torch._dynamo.reset()
    counters.clear()
    ids, mask, continuation = _batch(steps=4)
    ids, mask, continuation = ids[:batch], mask[:batch], continuation[:batch]
    model = tiny_model("llama", layers=layers)
    attach(model, STATIC_CONFIG, backend="reference")
    per_sample_routers(model)
    cache = ElasticCache(model, cuda_graphs=True)
    logits = []
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, cache=cache)
        with decode_graph.decode_layers(decoder_layers(model.model, family_of(model)[1]), compile_layers,
                                        group_projections):
            for step in range(continuation.shape[1]):
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                logits.append(model(input_ids=continuation[:, step : step + 1], attention_mask=mask,
                                    cache=cache).logits[:, -1])
    assert cache.static_steps == continuation.shape[1]
    return torch.stack(logits), counters["stats"]["unique_graphs"]


def test_compiled_layers_equal_uncompiled_ones_and_compile_once_for_every_layer():
    """Static steps with every decoder layer compiled (the cache update, attention and key hook left untraced) give
    the uncompiled logits; after a 2-layer model compiled, a 4-layer one compiles no new graph (its third and fourth
    layers reuse the graphs of the second, whose layer index became a graph input)."""
    _, graphs_of_two = _compiled_static_steps(2, compile_layers=True, reset=True)
    compiled_steps, new_graphs = _compiled_static_steps(4, compile_layers=True)
    plain, _ = _compiled_static_steps(4, compile_layers=False)
    assert float((compiled_steps - plain).abs().max()) < 1e-5
    assert graphs_of_two > 0 and new_graphs == 0


def test_grouped_projections_give_the_plain_logits(monkeypatch):
    """Static steps with the decoder layer's projections grouped (q/k/v and gate/up one launch each, o and down
    alone), of one sequence eager and compiled and of two eager, give the logits of the plain projections; eager,
    every group launched once per step (counted); with `GROUPED_ROWS` 1, none at batch 2 (more rows are cuBLAS's),
    with 2, the groups of several projections (q/k/v, gate/up) but not o and down alone (cuBLAS's split reductions
    are faster there)."""
    from elastic_attention.integration import decode_projections

    launches = []
    kernel = decode_projections.grouped_linear_op

    def counted(x, weights, biases):
        launches.append(len(weights))
        return kernel(x, weights, biases)

    monkeypatch.setattr(decode_projections, "grouped_linear_op", counted)
    plain, _ = _compiled_static_steps(1, compile_layers=False, batch=1)
    grouped, _ = _compiled_static_steps(1, compile_layers=False, group_projections=True, batch=1)
    assert float((grouped - plain).abs().max()) < 1e-5
    assert launches == [3, 1, 2, 1] * 4
    torch._dynamo.reset()
    compiled_grouped, _ = _compiled_static_steps(1, compile_layers=True, group_projections=True, batch=1)
    assert float((compiled_grouped - plain).abs().max()) < 1e-5
    launches.clear()
    monkeypatch.setattr(decode_projections, "GROUPED_ROWS", 1)
    _compiled_static_steps(1, compile_layers=False, group_projections=True, batch=2)
    assert launches == []
    monkeypatch.setattr(decode_projections, "GROUPED_ROWS", 2)
    plain_pair, _ = _compiled_static_steps(1, compile_layers=False, batch=2)
    grouped_pair, _ = _compiled_static_steps(1, compile_layers=False, group_projections=True, batch=2)
    assert float((grouped_pair - plain_pair).abs().max()) < 1e-5
    assert launches == [3, 2] * 4


@pytest.mark.parametrize("inputs, cols, rows, bias, block_rows, block_cols", [
    (1, 40, [24, 8, 8], True, 4, 2048), (1, 100, [17], False, 4, 32), (1, 64, [33, 5], True, 8, 16),
    (1, 17, [3, 3, 70], False, 32, 16), (2, 40, [24, 8, 8], True, 16, 2048), (3, 100, [17], False, 16, 32),
    (8, 64, [33, 5], True, 32, 16), (16, 17, [3, 3, 70], False, 16, 16), (5, 300, [20, 4], True, 16, 64)])
def test_grouped_linear_kernel_matches_float64(inputs, cols, rows, bias, block_rows, block_cols):
    """One to three weights over 1 to 16 rows of input (one row: the CUDA-core kernel; more: the tensor-core one),
    sizes off every block (and a column block wider than the input)."""
    from elastic_attention.kernels.grouped_gemv import GemvOptions, grouped_linear

    generator = torch.Generator().manual_seed(cols + inputs)
    x = torch.randn(inputs, 1, cols, generator=generator)
    weights = [torch.randn(n, cols, generator=generator) for n in rows]
    biases = [torch.randn(n, generator=generator) for n in rows] if bias else None
    outputs = grouped_linear(x, weights, biases, GemvOptions(block_rows, block_cols, num_warps=1, num_stages=1))
    for index, (output, weight) in enumerate(zip(outputs, weights)):
        expected = x.double() @ weight.double().T + (biases[index].double() if bias else 0)
        assert output.shape == (inputs, 1, weight.shape[0])
        assert float((output.double() - expected).abs().max()) < 1e-4
    default = grouped_linear(x, weights, biases)  # DEFAULT_OPTIONS or FEW_ROWS_OPTIONS
    assert all(float((a - b).abs().max()) < 1e-4 for a, b in zip(default, outputs))


def test_grouped_linear_refuses_what_it_does_not_compute():
    from elastic_attention.kernels.grouped_gemv import GemvOptions, grouped_linear

    x, weight = torch.randn(1, 8), torch.randn(4, 8)
    cases = [((torch.randn(17, 8), [weight]), "1 to 16 rows of input"), ((x, [weight] * 4), "1 to 3 weights"),
             ((torch.randn(2, 8), [weight], None, GemvOptions(block_rows=4)), "block_rows and block_cols of at least"),
             ((x, [torch.randn(4, 9)]), "must be contiguous [N, 8]"), ((x, [weight.T.contiguous().T]), "contiguous"),
             ((x, [weight.double()]), "torch.float64"), ((x, [weight], [torch.randn(5)]), "biases must be")]
    for arguments, message in cases:
        with pytest.raises(InputError, match=message.replace("[", r"\[")):
            grouped_linear(*arguments)


def test_grouped_projections_of_a_model_with_biases(monkeypatch):
    """Qwen2's q, k and v have biases: one token through the model (one row of input) with its projections grouped
    gives the plain logits, every group launched once per layer."""
    from elastic_attention.integration import decode_projections

    launches = []
    kernel = decode_projections.grouped_linear_op

    def counted(x, weights, biases):
        launches.append((len(weights), len(biases)))
        return kernel(x, weights, biases)

    monkeypatch.setattr(decode_projections, "grouped_linear_op", counted)
    model = tiny_model("qwen2", layers=2)
    ids = torch.tensor([[5]])
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        with decode_projections.grouped_projections(list(model.model.layers)):
            actual = model(input_ids=ids).logits
    assert float((actual - expected).abs().max()) < 1e-5
    assert launches == [(3, 3), (1, 0), (2, 0), (1, 0)] * 2


@pytest.mark.parametrize("graphs", [False, True])
def test_key_splits_cover_the_longest_segment_a_layer_holds(graphs, monkeypatch):
    """A layer whose heads all stream sizes its key splits by the ring (sink + local), not by the sequence or the
    captured step's capacity; a layer with a full head by the sequence (eager) or the capacity (static). The logits
    stay those of the per-sequence path."""
    from elastic_attention import force_routing
    from elastic_attention.cache import layer as cache_layer

    bounds = []
    step = cache_layer.decode_step

    def recording_step(query, keys, values, segments, scale, **options):
        bounds.append(options["max_entries"])
        return step(query, keys, values, segments, scale, **options)

    monkeypatch.setattr(cache_layer, "decode_step", recording_step)
    ids, mask, continuation = _batch(prompt=60, steps=4)
    logits, caches = {}, {}
    for fused in (True, False):
        model = tiny_model("llama")
        attach(model, STATIC_CONFIG, backend="reference")
        force_routing(model, torch.tensor([[False, False], [True, False]]))  # layer 0: both heads stream
        cache = ElasticCache(model, fused_decode=fused, cuda_graphs=graphs and fused)
        logits[fused], caches[fused] = teacher_forced_decode(model, ids, mask, continuation, cache)
    capacity = caches[True].static_capacity
    ring_size = STATIC_CONFIG.sink_tokens + STATIC_CONFIG.local_tokens
    longest = [60 + step for step in range(1, 5)]  # the first sample (the second is left-padded), step by step
    if graphs:
        assert bounds == [ring_size, capacity] * 4 and capacity > longest[-1]
    else:
        assert bounds == [bound for length in longest for bound in (ring_size, length)]
    assert float((logits[True] - logits[False]).abs().max()) < 1e-5
