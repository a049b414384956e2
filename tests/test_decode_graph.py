"""The graphed decode step's plumbing on the CPU without Triton's interpreter: capacity, the installed forward, and the
refusals (the static path itself: `interpreted_fused_decode.py`; replayed graphs: `test_gpu_decode_graph.py`)."""

import inspect

import pytest
import torch
from conftest import tiny_model

from elastic_attention import ElasticCache, ElasticConfig, attach, detach
from elastic_attention.errors import InputError
from elastic_attention.integration.decode_graph import GraphedForward, static_capacity
from elastic_attention.integration.runtime import STATIC_STEP_KWARG

CONFIG = ElasticConfig(block_size=8, sink_tokens=8, local_tokens=16, xa_stride=4)


@pytest.mark.parametrize("longest, max_length, expected", [
    (30, None, 512), (255, None, 512), (256, None, 512), (100_000, None, 103_168), (131_072, None, 135_168),
    (30, 40, 40), (39, 40, 40),
])
def test_static_capacity_leaves_room_for_a_1_32_share_or_256_tokens(longest, max_length, expected):
    capacity = static_capacity(longest, max_length)
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
