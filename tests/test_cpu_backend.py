"""The CPU backend (SDPA over the attended blocks only) against the reference, on random inputs of odd sizes:
padded, packed and chunked layouts, GQA 1 and 4, head_dim 64 and 128, every configuration (XA heads included)."""

from __future__ import annotations

import pytest
import torch

from elastic_attention import ElasticConfig
from elastic_attention.backends import ReferenceBackend, get_backend
from elastic_attention.backends.cpu_blocks import CPUBlockBackend
from elastic_attention.patterns import MODE_CODES, SequenceLayout, build_block_tables


def random_states(batch, kv_heads, group, width, head_dim, seed, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, kv_heads * group, width, head_dim, generator=generator)
    key = torch.randn(batch, kv_heads, width, head_dim, generator=generator)
    value = torch.randn(batch, kv_heads, width, head_dim, generator=generator)
    return query.to(dtype), key.to(dtype), value.to(dtype)


def compare(query, key, value, layout, modes, config, tolerance=1e-5, window_tokens=None):
    scale = query.shape[-1] ** -0.5
    tables = build_block_tables(layout, modes, config, query.shape[1], query=query, key=key, scale=scale,
                                window_tokens=window_tokens)
    expected = ReferenceBackend().attend(query, key, value, layout, tables, scale)
    actual = CPUBlockBackend().attend(query, key, value, layout, tables, scale)
    torch.testing.assert_close(actual.float(), expected.float(), atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("configuration", ["fa-ssa", "fa-xa"])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("window", [19, 300])
def test_a_model_window_on_a_left_padded_batch(configuration, group, window):
    """Window 19 cuts inside blocks; 300 exceeds the prompts (causal attention is then the fast path again)."""
    config = ElasticConfig(configuration=configuration, block_size=16, sink_tokens=16, local_tokens=32, xa_stride=4,
                           xa_threshold=0.8)
    mask = torch.ones(2, 101, dtype=torch.bool)
    mask[0, :30] = False
    query, key, value = random_states(2, 2, group, 101, 64, seed=group + window)
    retrieval, sparse = MODE_CODES[config.retrieval_mode], MODE_CODES[config.sparse_mode]
    modes = torch.tensor([[retrieval, sparse], [sparse, retrieval]])
    compare(query, key, value, SequenceLayout.from_padding_mask(mask), modes, config, window_tokens=window)


def test_auto_picks_it_on_a_cpu():
    if torch.cuda.is_available():
        pytest.skip("auto prefers the GPU backends")
    assert get_backend("auto").name == "cpu" and get_backend("cpu").name == "cpu"


@pytest.mark.parametrize("configuration", ["fa-ssa", "fa-xa", "xa-ssa"])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_left_padded_batch_with_per_sample_routing(configuration, group, head_dim):
    config = ElasticConfig(configuration=configuration, block_size=16, sink_tokens=16, local_tokens=48, xa_stride=4)
    widths = (150, 301)
    mask = torch.zeros(2, max(widths), dtype=torch.bool)
    mask[0, max(widths) - widths[0] :] = True
    mask[1, :] = True
    layout = SequenceLayout.from_padding_mask(mask)
    query, key, value = random_states(2, 2, group, max(widths), head_dim, seed=group + head_dim)
    retrieval, sparse = MODE_CODES[config.retrieval_mode], MODE_CODES[config.sparse_mode]
    modes = torch.tensor([[retrieval, sparse], [sparse, retrieval]])
    compare(query, key, value, layout, modes, config)


@pytest.mark.parametrize("width", [1, 17, 127, 128, 129, 1000])
def test_odd_lengths_unpadded_and_right_padded(width):
    config = ElasticConfig(block_size=32, sink_tokens=32, local_tokens=64, xa_stride=8)
    query, key, value = random_states(1, 4, 2, width, 64, seed=width)
    compare(query, key, value, SequenceLayout.dense(1, width), torch.tensor([[0, 1, 1, 0]]), config)
    query, key, value = random_states(3, 2, 4, width + 5, 64, seed=width + 1)
    mask = torch.ones(3, width + 5, dtype=torch.bool)
    mask[1, width // 2 + 1 :] = False
    mask[2, 3:] = False
    modes = torch.tensor([[0, 1], [1, 1], [1, 0]])
    compare(query, key, value, SequenceLayout.from_padding_mask(mask), modes, config)


def test_packed_sequences_chunks_and_decode_steps():
    config = ElasticConfig(block_size=32, sink_tokens=32, local_tokens=64, xa_stride=8)
    positions = torch.tensor([list(range(70)) + list(range(301))])
    query, key, value = random_states(1, 2, 4, 371, 128, seed=3)
    modes = torch.tensor([[0, 1], [1, 0]])
    compare(query, key, value, SequenceLayout.from_position_ids(positions), modes, config)
    # A chunk of 64 new queries after a past of 200 (block aligned), and one decode step after 333 keys.
    chunk = SequenceLayout.dense(1, 264, 64)
    query, key, value = random_states(1, 2, 4, 264, 64, seed=5)
    compare(query[:, :, -64:], key, value, chunk, modes[:1], config)
    mask = torch.ones(2, 333, dtype=torch.bool)
    mask[1, :100] = False
    query, key, value = random_states(2, 2, 4, 333, 64, seed=4)
    compare(query[:, :, -1:], key, value, SequenceLayout.from_padding_mask(mask, query_len=1), modes, config)


def test_bfloat16_states_within_half_precision_tolerance():
    config = ElasticConfig(block_size=64, sink_tokens=64, local_tokens=128)
    query, key, value = random_states(1, 2, 7, 777, 64, seed=9, dtype=torch.bfloat16)
    compare(query, key, value, SequenceLayout.dense(1, 777), torch.tensor([[0, 1]]), config, tolerance=2e-2)
