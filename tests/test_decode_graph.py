"""The graphed decode step's plumbing on the CPU without Triton's interpreter: capacity, the installed forward, and the
refusals (the static path itself: `interpreted_fused_decode.py`; replayed graphs: `test_gpu_decode_graph.py`)."""

import inspect
import math

import pytest
import torch
from conftest import tiny_model

from elastic_attention import ElasticCache, ElasticConfig, attach, detach
from elastic_attention.errors import ConfigError, InputError
from elastic_attention.cache.stores import decode_capacity
from elastic_attention.integration.decode_graph import (
    CompilePolicy,
    GraphedForward,
    compile_after_steps,
)
from elastic_attention.integration.runtime import STATIC_STEP_KWARG

CONFIG = ElasticConfig(block_size=8, sink_tokens=8, local_tokens=16, xa_stride=4)


@pytest.mark.parametrize("longest, max_length, expected", [
    (30, None, 512), (255, None, 512), (256, None, 512), (100_000, None, 103_168), (131_072, None, 135_168),
    (30, 40, 40), (39, 40, 40),
])
def test_static_capacity_leaves_room_for_a_1_32_share_or_256_tokens(longest, max_length, expected):
    capacity = decode_capacity(longest, max_length)
    assert capacity == expected
    if max_length is None:
        assert capacity % 256 == 0 and capacity - longest >= max(256, longest / 32)


def test_attach_installs_the_graphed_forward_with_the_models_signature_and_detach_restores_it():
    model = tiny_model("llama")
    signature = inspect.signature(model.forward)
    attach(model, CONFIG)
    assert isinstance(model.forward, GraphedForward)
    assert inspect.signature(model.forward) == signature  # generate reads it
    detach(model)
    assert "forward" not in model.__dict__ and inspect.signature(model.forward) == signature


def test_detach_keeps_a_forward_that_was_an_instance_attribute():
    model = tiny_model("llama")
    own = model.forward
    model.forward = own  # as accelerate's hooks do
    attach(model, CONFIG)
    detach(model)
    assert model.__dict__["forward"] is own


def test_decode_steps_run_eagerly_where_fused_kernels_cannot_run():
    """On a CPU without Triton's interpreter the cache cannot be static; generate decodes as before."""
    model = tiny_model("llama")
    attach(model, CONFIG, backend="reference")
    ids = torch.randint(3, 90, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        result = model.generate(input_ids=ids, max_new_tokens=5, do_sample=False, pad_token_id=0,
                                return_dict_in_generate=True)
    cache = result.past_key_values
    assert isinstance(cache, ElasticCache) and not cache.can_be_static and cache.static_capacity is None
    with pytest.raises(InputError, match="cannot be"):
        cache.begin_static(64)


def test_a_static_step_needs_a_static_cache():
    model = tiny_model("llama")
    attach(model, CONFIG, backend="reference")
    ids = torch.randint(3, 90, (1, 20), generator=torch.Generator().manual_seed(0))
    cache = ElasticCache(model)
    with torch.no_grad():
        model(input_ids=ids, cache=cache)
        with pytest.raises(InputError, match="static mode"):
            model(input_ids=ids[:, :1], cache=cache, **{STATIC_STEP_KWARG: True})


@pytest.mark.parametrize("family, kv_bias", [("llama", False), ("qwen2", True), ("qwen3", False)])
def test_projection_groups_are_qkv_and_gate_up_and_the_rest_alone(family, kv_bias):
    from elastic_attention.integration.decode_projections import projection_groups
    from elastic_attention.integration.families import decoder_layers, family_of

    model = tiny_model(family, layers=2)
    layers = decoder_layers(model.model, family_of(model)[1])
    names = {id(module): name for name, module in model.model.layers[0].named_modules()}
    groups = projection_groups(layers)
    assert [[names.get(id(linear)) for linear in group.linears] for group in groups[:4]] == [
        ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"], ["mlp.gate_proj", "mlp.up_proj"],
        ["self_attn.o_proj"], ["mlp.down_proj"]]
    assert len(groups) == 8 and (groups[0].linears[1].bias is not None) == kv_bias


def test_grouped_projections_fall_back_to_torch_where_the_kernel_cannot_run_and_restore_the_forwards():
    """On the CPU without Triton's interpreter every projection runs torch.nn.functional.linear: same logits; the
    attach option reaches the graphed forward."""
    from elastic_attention.integration.decode_projections import grouped_projections

    model = tiny_model("llama", layers=2)
    attach(model, CONFIG, grouped_projections=True)
    assert model.forward.group_projections and model.forward.compile_policy.setting == "auto"
    ids = torch.randint(3, 90, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        with grouped_projections(list(model.model.layers)):
            assert "forward" in model.model.layers[0].self_attn.q_proj.__dict__
            actual = model(input_ids=ids).logits
    assert torch.equal(actual, expected)
    assert all("forward" not in module.__dict__ for module in model.modules() if isinstance(module, torch.nn.Linear))


def test_an_mlp_with_grouped_projections_traces_as_one_graph_and_its_forward_never_asks_for_the_kernel(monkeypatch):
    """Where the kernel runs, a projection's forward looks nothing up that Dynamo might not trace (the kernel's
    availability is decided when the groups are made: torch 2.11's Dynamo broke the graph at
    ``importlib.util.find_spec``, so a compiled layer launched the MLP's silu, mul and residual add as three kernels,
    decode_graph_profile_1.5b_real_16k_b8_h100_2026-12-06_0455.log). A Qwen2 decoder layer's MLP, with its gate and up
    projections grouped at batch 8 (the kernel stood in for by torch), traces as one graph with no break, and gives
    the plain MLP's output."""
    from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP

    from elastic_attention.integration import decode_projections
    from elastic_attention.kernels.grouped_gemv import grouped_linear_reference

    layer = torch.nn.Module()
    layer.mlp = Qwen2MLP(tiny_model("qwen2").config).eval()
    launches = []

    def stand_in(x, weights, biases):
        launches.append(len(weights))
        return grouped_linear_reference(x, weights, biases)

    def never(device, dtype):
        raise AssertionError("a projection's forward asked for the kernel's availability")

    monkeypatch.setattr(decode_projections, "grouped_linear_op", stand_in)
    monkeypatch.setattr(decode_projections, "grouped_gemv_available", lambda device, dtype: True)
    x = torch.randn(decode_projections.GROUPED_ROWS, 1, layer.mlp.hidden_size,
                    generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = layer.mlp(x)
        with decode_projections.grouped_projections([layer]):
            monkeypatch.setattr(decode_projections, "grouped_gemv_available", never)
            actual = layer.mlp(x.clone())
            assert launches == [2]  # gate and up together; down alone, by torch
            torch._dynamo.reset()
            explanation = torch._dynamo.explain(layer.mlp)(x)
    assert explanation.graph_count == 1 and explanation.graph_break_count == 0
    assert float((actual - expected).abs().max()) < 1e-6


def test_auto_compile_waits_per_batch_size_until_the_uncompiled_steps_cost_a_compile():
    """The rule, step by step: each batch size compiles once its own uncompiled steps reach the threshold (compile
    seconds over seconds saved a step); True and False never change."""
    policy = CompilePolicy("auto", after_steps=3)
    seen = []
    for batch in (1, 1, 8, 1, 1, 8, 8, 8):
        seen.append(policy.compile(batch))
        policy.count(batch, compiled=seen[-1])
    assert seen == [False, False, False, False, True, False, False, True]
    assert policy.uncompiled_steps == {1: 3, 8: 3}
    assert CompilePolicy(True, 3).compile(1) and not CompilePolicy(False, 0).compile(1)
    assert compile_after_steps(28) == math.ceil(6.2 / (28 * 0.568e-3 / 28))  # measured on an H200: 10,916 steps
    for wrong in ("yes", 1, None):
        with pytest.raises(ConfigError, match="compile_decode must be True, False or 'auto'"):
            CompilePolicy(wrong, 3)
    model = tiny_model("llama")
    with pytest.raises(ConfigError, match="compile_decode must be True, False or 'auto', got 'always'"):
        attach(model, CONFIG, compile_decode="always")
    assert not any(name.endswith("elastic_router.router_mlp.0.weight") for name, _ in model.named_parameters())


def test_set_compile_decode_changes_the_setting_of_an_attached_model_only():
    from elastic_attention import NotAttachedError, set_compile_decode

    model = tiny_model("llama")
    with pytest.raises(NotAttachedError):
        set_compile_decode(model, True)
    attach(model, CONFIG)
    set_compile_decode(model, True)
    assert model.forward.compile_policy.compile(1)
    with pytest.raises(ConfigError, match="got 'sometimes'"):
        set_compile_decode(model, "sometimes")
    assert model.forward.compile_policy.setting is True


def test_compile_prefill_compiles_the_layers_of_no_grad_eval_calls_only(monkeypatch):
    """A spy in place of `compiled`: entered for a no-grad eval-mode forward with ``compile_prefill``, never with
    gradients on, in train mode or without the option."""
    from contextlib import contextmanager

    from elastic_attention.integration import decode_graph

    entered = []

    @contextmanager
    def spy(modules):
        entered.append(len(modules))
        yield

    monkeypatch.setattr(decode_graph, "compiled", spy)
    ids = torch.randint(3, 90, (2, 20))
    for compile_prefill in (True, False):
        model = tiny_model("llama")
        attach(model, CONFIG, backend="reference", compile_prefill=compile_prefill)
        with torch.no_grad():
            model(input_ids=ids)
        model(input_ids=ids)  # gradients on
        model.train()
        with torch.no_grad():
            model(input_ids=ids)
    assert entered == [2]  # once: the first call of the model that compiles, over its two decoder layers


@pytest.mark.slow
def test_compiled_prefill_gives_the_uncompiled_logits_and_routing_at_any_length():
    """Three prompt lengths (the first compiles, the second compiles for dynamic lengths, the third reuses it)."""
    from conftest import per_sample_routers

    from elastic_attention import routing_report

    runs = {}
    for compile_prefill in (False, True):
        model = tiny_model("llama")
        attach(model, CONFIG, backend="reference", compile_prefill=compile_prefill)
        per_sample_routers(model)
        runs[compile_prefill] = []
        for length in (40, 57, 73):
            ids = torch.randint(3, 90, (2, length), generator=torch.Generator().manual_seed(length))
            with torch.no_grad():
                logits = model(input_ids=ids).logits
            runs[compile_prefill].append((logits, routing_report(model).decisions))
    for (plain, plain_routing), (compiled, compiled_routing) in zip(runs[False], runs[True]):
        assert float((plain - compiled).abs().max()) < 1e-4 and torch.equal(plain_routing, compiled_routing)
