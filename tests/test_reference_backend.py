"""The reference backend against float64 masked-softmax attention with brute-force masks."""

import pytest
import torch
from conftest import masked_attention_float64, token_mask

from elastic_attention import ElasticConfig
from elastic_attention.backends import ReferenceBackend, get_backend
from elastic_attention.errors import BackendUnavailableError
from elastic_attention.patterns import (
    FULL,
    MODE_CODES,
    SSA,
    XA,
    SequenceLayout,
    block_mask_from_tables,
    build_block_tables,
)


def tolerance(dtype):
    return {torch.float32: dict(atol=2e-5, rtol=1e-4), torch.float64: dict(atol=1e-10, rtol=1e-10)}[dtype]


@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("length", [1, 37, 130])
def test_hybrid_prefill_matches_float64(group, head_dim, length):
    torch.manual_seed(length + head_dim + group)
    kv_heads = 2
    heads = kv_heads * group
    config = ElasticConfig(block_size=16, sink_tokens=16, local_tokens=32)
    query = torch.randn(1, heads, length, head_dim)
    key, value = torch.randn(2, 1, kv_heads, length, head_dim)
    modes = torch.tensor([[SSA, FULL]])
    layout = SequenceLayout.dense(1, length)
    tables = build_block_tables(layout, modes, config, heads)
    scale = head_dim**-0.5
    output = ReferenceBackend().attend(query, key, value, layout, tables, scale)
    masks = torch.stack(
        [token_mask(length, 16, "ssa" if modes[0, h // group] == SSA else "full", 1, 2) for h in range(heads)]
    )
    expected = masked_attention_float64(query[0], key[0], value[0], masks, scale)
    torch.testing.assert_close(output[0].double(), expected, **tolerance(torch.float32))


@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("length", [37, 130])
def test_soft_capped_and_sink_prefill_matches_float64(group, length):
    torch.manual_seed(length + group)
    kv_heads, heads, head_dim = 2, 2 * group, 32
    config = ElasticConfig(block_size=16, sink_tokens=16, local_tokens=32)
    query = torch.randn(1, heads, length, head_dim) * 3  # scores well past the cap
    key, value = torch.randn(2, 1, kv_heads, length, head_dim)
    modes = torch.tensor([[SSA, FULL]])
    layout = SequenceLayout.dense(1, length)
    tables = build_block_tables(layout, modes, config, heads)
    scale = head_dim**-0.5
    output = ReferenceBackend().attend(query, key, value, layout, tables, scale, softcap=2.5)
    masks = torch.stack(
        [token_mask(length, 16, "ssa" if modes[0, h // group] == SSA else "full", 1, 2) for h in range(heads)]
    )
    expected = masked_attention_float64(query[0], key[0], value[0], masks, scale, softcap=2.5)
    torch.testing.assert_close(output[0].double(), expected, **tolerance(torch.float32))
    uncapped = masked_attention_float64(query[0], key[0], value[0], masks, scale)
    assert (expected - uncapped).abs().max() > 0.05

    sinks = torch.randn(heads) + 2.0
    output = ReferenceBackend().attend(query, key, value, layout, tables, scale, sinks=sinks)
    weights = (query[0].double() @ key[0].double().repeat_interleave(group, 0).transpose(1, 2) * scale)
    weights = weights.masked_fill(~masks, float("-inf")).exp()
    weights = weights / (weights.sum(-1, keepdim=True) + sinks.double().exp()[:, None, None])
    expected = weights @ value[0].double().repeat_interleave(group, 0)
    torch.testing.assert_close(output[0].double(), expected, **tolerance(torch.float32))


@pytest.mark.parametrize("configuration", ["fa-ssa", "fa-xa"])
@pytest.mark.parametrize("length", [37, 130])
def test_a_model_window_composes_with_every_pattern_at_token_level(configuration, length):
    torch.manual_seed(length)
    window, group = 21, 2
    config = ElasticConfig(configuration=configuration, block_size=16, sink_tokens=16, local_tokens=32, xa_stride=4,
                           xa_threshold=0.5)
    query = torch.randn(1, 4, length, 32)
    key, value = torch.randn(2, 1, 2, length, 32)
    sparse = MODE_CODES[config.sparse_mode]
    modes = torch.tensor([[sparse, FULL]])
    layout = SequenceLayout.dense(1, length)
    tables = build_block_tables(layout, modes, config, 4, query=query, key=key, scale=32**-0.5, window_tokens=window)
    output = ReferenceBackend().attend(query, key, value, layout, tables, 32**-0.5)
    positions = torch.arange(length)
    in_window = positions[None, :] > positions[:, None] - window
    causal = positions[None, :] <= positions[:, None]
    if configuration == "fa-ssa":
        rules = [token_mask(length, 16, "ssa", 1, 2)] * group + [token_mask(length, 16, "full")] * group
    else:  # XA selects blocks per query head: the oracle takes them from tables built without the window
        selected = block_mask_from_tables(build_block_tables(layout, modes, config, 4, query=query, key=key,
                                                             scale=32**-0.5), 0, (length - 1) // 16 + 1)
        rules = [selected[h][positions // 16][:, positions // 16] & causal for h in range(group)]
        rules += [token_mask(length, 16, "full")] * group
    masks = torch.stack([rule & in_window for rule in rules])
    expected = masked_attention_float64(query[0], key[0], value[0], masks, 32**-0.5)
    torch.testing.assert_close(output[0].double(), expected, **tolerance(torch.float32))
    # the tables leave out the key blocks wholly outside the window: every attended block reaches into it
    rows = torch.arange(tables.kv_block_count.shape[2])
    attended = torch.arange(tables.kv_block_index.shape[-1]) < tables.kv_block_count[0][..., None]
    reach = rows[None, :, None] * 16 - (tables.kv_block_index[0].long() * 16 + 15)
    assert bool((reach[attended] < window).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_padded_batch_and_decode_match_float64(dtype):
    torch.manual_seed(1)
    config = ElasticConfig(block_size=8, sink_tokens=8, local_tokens=16, xa_stride=4)
    width, heads, kv_heads, dim = 45, 4, 1, 32
    mask = torch.zeros(3, width, dtype=torch.bool)
    mask[0] = True
    mask[1, width - 20 :] = True  # left padding
    mask[2, :33] = True  # right padding
    query = torch.randn(3, heads, width, dim, dtype=dtype)
    key, value = torch.randn(2, 3, kv_heads, width, dim, dtype=dtype)
    modes = torch.tensor([[SSA], [FULL], [SSA]])
    for query_len in (width, 1, 5):
        # Prefill sees all three rows; decode steps (new queries at the end) only the unpadded and left-padded rows.
        layout = SequenceLayout.from_padding_mask(mask if query_len == width else mask[:2], query_len=query_len)
        rows = layout.batch_size
        tables = build_block_tables(layout, modes[:rows], config, heads)
        output = ReferenceBackend().attend(
            query[:rows, :, width - query_len :], key[:rows], value[:rows], layout, tables, 0.2
        )
        for n, (row, start, length, first_row, count) in enumerate(layout.spans()):
            mode = "ssa" if modes[n, 0] == SSA else "full"
            token = token_mask(length, 8, mode, 1, 2)[length - count :].expand(heads, -1, -1)
            expected = masked_attention_float64(
                query[row, :, width - query_len :][:, first_row : first_row + count],
                key[row, :, start : start + length],
                value[row, :, start : start + length],
                token,
                0.2,
            )
            torch.testing.assert_close(output[row, :, first_row : first_row + count].double(), expected,
                                       **tolerance(dtype))
            padding = torch.ones(output.shape[2], dtype=torch.bool)
            padding[first_row : first_row + count] = False
            assert torch.all(output[row][:, padding] == 0)


def test_xa_heads_match_float64_with_their_selection():
    torch.manual_seed(2)
    config = ElasticConfig(configuration="fa-xa", block_size=16, sink_tokens=16, local_tokens=16, xa_stride=4)
    length, heads, dim = 100, 4, 32
    query = torch.randn(1, heads, length, dim)
    key, value = torch.randn(2, 1, 2, length, dim)
    layout = SequenceLayout.dense(1, length)
    tables = build_block_tables(layout, torch.tensor([[XA, FULL]]), config, heads, query=query, key=key)
    blocks = block_mask_from_tables(tables, 0, 7)
    positions = torch.arange(length)
    token = blocks[:, positions // 16][:, :, positions // 16] & (positions[None, :] <= positions[:, None])
    output = ReferenceBackend().attend(query, key, value, layout, tables, dim**-0.5)
    expected = masked_attention_float64(query[0], key[0], value[0], token, dim**-0.5)
    torch.testing.assert_close(output[0].double(), expected, **tolerance(torch.float32))


def test_backend_resolution():
    assert get_backend("auto").name in (("fa4", "flex") if torch.cuda.is_available() else ("cpu",))
    assert get_backend("reference").name == "reference" and get_backend("cpu").name == "cpu"
    assert get_backend("flex").name == "flex"
    with pytest.raises(BackendUnavailableError, match="unknown attention backend 'cuda9'"):
        get_backend("cuda9")
