"""The retrieval signal and the `SignalSetRouter`: the signal against a per-query float64 rule, the thresholds against
a per-prompt rule, the layers before the decision layer, the adapter, the cache and the report."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

import elastic_attention as ea
from elastic_attention.errors import ConfigError
from elastic_attention.integration.attach import force_head_set
from elastic_attention.patterns import SequenceLayout
from elastic_attention.router.retrieval_signal import retrieval_signal
from elastic_attention.router.signal_router import SignalSetRouter

BLOCK, SINK, LOCAL = 4, 4, 8


def _slow_signal(query, key, start, length, queries, statistic="mean"):
    """[Hkv] float64: one sequence's signal written query by query and key by key from its definition."""
    heads, kv_heads = query.shape[0], key.shape[0]
    group = heads // kv_heads
    masses = [[] for _ in range(kv_heads)]
    first = max(0, length - queries)
    for head in range(heads):
        for position in range(first, length):
            q = query[head, start + position].double()
            logits = torch.stack([q @ key[head // group, start + j].double() * 0.25 for j in range(position + 1)])
            weights = torch.softmax(logits, dim=0)
            hidden = sum(float(weights[j]) for j in range(position + 1)
                         if j // BLOCK >= SINK // BLOCK and j // BLOCK <= position // BLOCK - LOCAL // BLOCK)
            masses[head // group].append(hidden)
    reduce = (lambda values: sum(values) / len(values)) if statistic == "mean" else max
    return torch.tensor([reduce(values) for values in masses], dtype=torch.float64)


@pytest.mark.parametrize("queries,statistic", [(1, "mean"), (5, "mean"), (64, "mean"), (5, "max"), (64, "max")])
def test_the_signal_follows_the_per_query_rule_on_packed_sequences(queries, statistic):
    generator = torch.Generator().manual_seed(queries)
    lengths = [37, 3, 23]  # one sequence shorter than the window (signal 0), odd lengths, packed in one row
    total = sum(lengths)
    query = torch.randn(1, 6, total, 8, generator=generator)
    key = torch.randn(1, 2, total, 8, generator=generator)
    positions = torch.cat([torch.arange(length) for length in lengths])[None]
    layout = SequenceLayout.from_position_ids(positions)
    signal = retrieval_signal(query, key, layout, 0.25, queries=queries, block_size=BLOCK, sink_tokens=SINK,
                              local_tokens=LOCAL, statistic=statistic)
    assert signal.shape == (3, 2) and signal.dtype == torch.float32
    start = 0
    for n, length in enumerate(lengths):
        expected = _slow_signal(query[0], key[0], start, length, queries, statistic)
        torch.testing.assert_close(signal[n].double(), expected, rtol=1e-5, atol=1e-6)
        start += length
    assert torch.equal(signal[1], torch.zeros(2))
    assert bool((signal[0] > 0).all())


def test_the_signal_ends_at_the_prompt_on_a_padded_batch():
    generator = torch.Generator().manual_seed(7)
    query, key = torch.randn(2, 4, 41, 8, generator=generator), torch.randn(2, 2, 41, 8, generator=generator)
    mask = torch.ones(2, 41, dtype=torch.bool)
    mask[1, :12] = False  # left padding
    layout = SequenceLayout.from_padding_mask(mask)
    signal = retrieval_signal(query, key, layout, 0.25, queries=6, block_size=BLOCK, sink_tokens=SINK,
                              local_tokens=LOCAL, prompt_lengths=[35, 29])
    torch.testing.assert_close(signal[0].double(), _slow_signal(query[0], key[0], 0, 35, 6), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(signal[1].double(), _slow_signal(query[1], key[1], 12, 29, 6), rtol=1e-5, atol=1e-6)


#: Three sets of a 3-layer, 2-KV-head model, densest first, alike on layer 0 (before the decision layer 1).
SETS = torch.tensor([[[1, 0], [1, 1], [1, 1]], [[1, 0], [1, 0], [0, 1]], [[1, 0], [0, 0], [0, 0]]], dtype=torch.bool)


def _slow_choice(score: float, thresholds: tuple[float, ...]) -> int:
    for index, threshold in enumerate(thresholds):
        if score >= threshold:
            return index
    return len(thresholds)


def test_the_thresholds_choose_by_the_per_prompt_rule():
    router = SignalSetRouter(num_kv_heads=2, thresholds=(0.4, 0.15), routed_layers=3, decision_position=1)
    router.set_head_sets(SETS)
    signal = torch.tensor([[0.5, 0.0], [0.0, 0.4], [0.399, 0.1], [0.15, 0.15], [0.149, 0.0], [0.0, 0.0]])
    decision = router.decide(signal)
    expected = [_slow_choice(max(row), (0.4, 0.15)) for row in signal.tolist()]
    assert decision.choice.tolist() == expected == [0, 0, 1, 1, 2, 2]
    assert torch.equal(decision.signal, signal.amax(dim=1))
    one_hot = router(signal)
    for position in range(3):
        assert torch.equal(router.decisions(one_hot, position), SETS[expected][:, position].float())
    assert router.prefix_decisions(0).tolist() == [1.0, 0.0]
    with pytest.raises(ValueError, match="decided by the signal"):
        router.prefix_decisions(1)


def test_the_router_refuses_sets_and_thresholds_it_cannot_use():
    with pytest.raises(ValueError, match="strictly decreasing"):
        SignalSetRouter(2, (0.1, 0.4), 3, 1)
    with pytest.raises(ValueError, match="decision_position"):
        SignalSetRouter(2, (0.4,), 3, 3)
    router = SignalSetRouter(2, (0.4, 0.15), 3, 1)
    differing = SETS.clone()
    differing[2, 0] = torch.tensor([0, 0])
    with pytest.raises(ValueError, match="before the decision layer"):
        router.set_head_sets(differing)
    with pytest.raises(ValueError, match="densest to sparsest"):
        router.set_head_sets(SETS.flip(0))


def test_the_config_checks_the_signal_fields():
    base = dict(block_size=8, sink_tokens=8, local_tokens=16, xa_stride=4)
    with pytest.raises(ConfigError, match="set `head_set_choices` too"):
        ea.ElasticConfig(**base, signal_layer=1, signal_thresholds=(0.3,))
    with pytest.raises(ConfigError, match="needs `signal_layer`"):
        ea.ElasticConfig(**base, head_set_choices=2, signal_thresholds=(0.3,))
    with pytest.raises(ConfigError, match="2 numbers"):
        ea.ElasticConfig(**base, head_set_choices=3, signal_layer=1, signal_thresholds=(0.3,))
    with pytest.raises(ConfigError, match="strictly decreasing"):
        ea.ElasticConfig(**base, head_set_choices=3, signal_layer=1, signal_thresholds=(0.3, 0.3))
    with pytest.raises(ConfigError, match="leave `floor_set` unset"):
        ea.ElasticConfig(**base, head_set_choices=3, signal_layer=1, signal_thresholds=(0.3, 0.1), floor_set=1)
    with pytest.raises(ConfigError, match="signal_queries"):
        ea.ElasticConfig(**base, signal_queries=0)
    with pytest.raises(ConfigError, match="'mean' or 'max'"):
        ea.ElasticConfig(**base, signal_statistic="median")
    config = ea.ElasticConfig(**base, head_set_choices=3, signal_layer=1, signal_thresholds=[0.3, 0.1])
    assert config.signal_thresholds == (0.3, 0.1)
    assert ea.ElasticConfig.from_json(config.to_json()) == config
    model = tiny_model("llama", layers=3)
    with pytest.raises(ConfigError, match="not a routed layer"):
        ea.attach(model, ea.ElasticConfig(**base, head_set_choices=3, signal_layer=1, signal_thresholds=(0.3, 0.1),
                                          routed_layers=(0, 2)), backend="reference")


CONFIG = dict(block_size=BLOCK, sink_tokens=SINK, local_tokens=LOCAL, xa_stride=4, head_set_choices=3,
              signal_layer=1, signal_queries=5)


def _layer_signal(model, ids, layer, statistic):
    """[N, Hkv] the signal of ``layer`` measured on the plain (not attached) model, from its own queries and keys."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    seen = {}

    def capture(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        if module.layer_idx == layer:
            seen["query"], seen["key"], seen["scale"] = query, key, scaling
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)

    AttentionInterface.register("capture_signal_test", capture)
    model.set_attn_implementation("capture_signal_test")
    with torch.no_grad():
        model(input_ids=ids)
    model.set_attn_implementation("sdpa")
    layout = SequenceLayout.dense(ids.shape[0], ids.shape[1])
    return retrieval_signal(seen["query"], seen["key"], layout, seen["scale"], queries=5, block_size=BLOCK,
                            sink_tokens=SINK, local_tokens=LOCAL, statistic=statistic)


@pytest.mark.parametrize("statistic", ["mean", "max"])
def test_an_attached_model_routes_each_prompt_by_its_signal(tmp_path, statistic):
    ids = torch.randint(3, 90, (9, 45), generator=torch.Generator().manual_seed(3))
    plain = tiny_model("llama", layers=3)
    # layer 0 runs full attention in every set
    expected_signal = _layer_signal(plain, ids, layer=1, statistic=statistic).amax(dim=1)
    sets = SETS.clone()
    sets[:, 0] = True
    ordered = expected_signal.sort().values
    thresholds = (float(ordered[6]), float(ordered[3]))  # three prompts a set
    model = tiny_model("llama", layers=3)
    ea.attach(model, ea.ElasticConfig(**CONFIG, signal_thresholds=thresholds, signal_statistic=statistic),
              backend="reference")
    (router,) = ea.routers_of(model).values()
    assert isinstance(router, SignalSetRouter) and list(ea.routers_of(model)) == [1]
    router.set_head_sets(sets)
    with torch.no_grad():
        model(input_ids=ids)
    report = ea.routing_report(model)
    decision = report.head_sets.decision
    torch.testing.assert_close(decision.signal, expected_signal, rtol=1e-4, atol=1e-5)
    expected = [_slow_choice(value, thresholds) for value in decision.signal.tolist()]
    assert decision.choice.tolist() == expected and sorted(expected) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    for row, choice in enumerate(expected):
        assert torch.equal(report.decisions[row], sets[choice])
    msrs = 1.0 - sets.float().mean(dim=(1, 2))
    torch.testing.assert_close(report.msr, msrs[expected])
    assert "retrieval signal" in str(report) and "safety floor" in str(report)

    ea.save_router(model, tmp_path / "adapter")
    again = ea.load_router(tiny_model("llama", layers=3), tmp_path / "adapter", backend="reference")
    with torch.no_grad():
        again(input_ids=ids)
    assert ea.routing_report(again).head_sets.decision.choice.tolist() == expected
    ea.force_routing(again, "full")  # forced routing needs no signal
    with torch.no_grad():
        again(input_ids=ids)
    assert float(ea.routing_report(again).msr.max()) == 0.0
    with pytest.raises(ConfigError, match="SignalSetRouter has no weights"):
        force_head_set(again, 0)


def test_generate_keeps_the_chosen_set_through_the_bounded_cache():
    ids = torch.randint(3, 90, (2, 45), generator=torch.Generator().manual_seed(4))
    sets = SETS.clone()
    model = tiny_model("llama", layers=3)
    ea.attach(model, ea.ElasticConfig(**CONFIG, signal_thresholds=(0.99, 0.0)), backend="reference",
              cuda_graphs=False)
    (router,) = ea.routers_of(model).values()
    router.set_head_sets(sets)  # every prompt: set 1 (signal in [0, 0.99))
    reference = tiny_model("llama", layers=3)
    ea.attach(reference, ea.ElasticConfig(block_size=BLOCK, sink_tokens=SINK, local_tokens=LOCAL, xa_stride=4),
              backend="reference", cache="full")
    ea.force_routing(reference, sets[1])
    with torch.no_grad():
        tokens = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
        expected = reference.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert ea.routing_report(model).head_sets.decision.choice.tolist() == [1, 1]
    assert torch.equal(tokens, expected)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_signal_routes_as_on_the_cpu_reference():
    """Oracle: the CPU reference backend in float32; on the GPU (flex, bfloat16) the same prompts get the same sets,
    their signals within bfloat16's rounding, and the generated tokens decode through the bounded cache."""
    ids = torch.randint(3, 90, (6, 701), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    for row, length in enumerate([701, 650, 420, 380, 250, 210]):  # left-padded: longer prompts hide more
        mask[row, : 701 - length] = 0
    config = ea.ElasticConfig(block_size=64, sink_tokens=64, local_tokens=128, head_set_choices=3,
                              signal_layer=1, signal_queries=8, signal_thresholds=(0.6, 0.3))
    signals = {}
    for device, dtype, backend in (("cpu", torch.float32, "reference"), ("cuda", torch.bfloat16, "flex")):
        model = tiny_model("llama", layers=3, head_dim=32).to(device, dtype)
        ea.attach(model, config, backend=backend)
        (router,) = ea.routers_of(model).values()
        router.set_head_sets(SETS)
        with torch.no_grad():
            model.generate(ids.to(device), attention_mask=mask.to(device), max_new_tokens=4, do_sample=False,
                           pad_token_id=0)
        decision = ea.routing_report(model).head_sets.decision
        signals[device] = (decision.signal.float().cpu(), decision.choice.cpu())
    torch.testing.assert_close(signals["cuda"][0], signals["cpu"][0], atol=0.02, rtol=0.05)
    near = ((signals["cpu"][0][:, None] - torch.tensor([0.6, 0.3])).abs() < 0.02).any(dim=1)
    assert torch.equal(signals["cuda"][1][~near], signals["cpu"][1][~near])
    assert len(set(signals["cpu"][1].tolist())) == 3


def test_the_signal_floor_keeps_the_asked_share_of_needy_rows():
    """Oracle: every candidate threshold scanned, the largest that keeps enough needy rows at or above it."""
    from elastic_attention.router.floor import signal_floor_threshold

    generator = torch.Generator().manual_seed(9)
    signal = torch.rand(41, generator=generator)
    needs = torch.rand(41, generator=generator) < 0.4
    for recall in (0.5, 0.9, 0.95, 1.0):
        got = signal_floor_threshold(signal, needs, recall)
        enough = [float(value) for value in signal
                  if int((signal[needs] >= value).sum()) >= recall * int(needs.sum()) - 1e-9]
        assert got == max(enough)
    assert signal_floor_threshold(signal, torch.zeros(41, dtype=torch.bool), 0.9) == 0.0
    with pytest.raises(ValueError, match="recall"):
        signal_floor_threshold(signal, needs, 0.0)
    with pytest.raises(ValueError, match="must match"):
        signal_floor_threshold(signal, needs[:5], 0.9)
