"""Block tables against brute-force token masks; layouts; attended-pair counts."""

import dataclasses

import pytest
import torch
from conftest import token_mask
from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_attention import ElasticConfig, InputError
from elastic_attention.patterns import (
    BlockTableBuilder,
    FULL,
    SSA,
    XA,
    SequenceLayout,
    attended_pairs,
    block_mask_from_tables,
    build_block_tables,
    causal_pairs,
)
from elastic_attention.patterns.xattention import xattention_block_mask


def expand_to_tokens(tables, layout, sequence, head):
    """Token mask [count, L] of one sequence and head from its block tables (a second, independent expansion)."""
    span = layout.spans()[sequence]
    length, count = span.key_len, span.query_count
    size = tables.block_size
    first_position = length - count
    mask = torch.zeros(count, length, dtype=torch.bool)
    for r in range(int(tables.num_rows[sequence])):
        query_block = int(tables.first_query_block[sequence]) + r
        blocks = tables.kv_block_index[sequence, head, r, : tables.kv_block_count[sequence, head, r]].tolist()
        assert blocks == sorted(blocks)
        for q in range(max(first_position, query_block * size), min(length, (query_block + 1) * size)):
            for kb in blocks:
                for k in range(kb * size, min(length, (kb + 1) * size)):
                    mask[q - first_position, k] = k <= q
    return mask


def config_for(block_size, sink_blocks, local_blocks, **extra):
    extra.setdefault("xa_stride", min(4, block_size))
    return ElasticConfig(
        block_size=block_size, sink_tokens=sink_blocks * block_size, local_tokens=local_blocks * block_size, **extra
    )


@pytest.mark.parametrize("length", [1, 17, 127, 128, 129, 200, 1000])
@pytest.mark.parametrize("sink_blocks, local_blocks", [(0, 1), (1, 1), (1, 2), (2, 3), (4, 4), (0, 50)])
def test_prefill_tables_match_the_brute_force_mask(length, sink_blocks, local_blocks):
    block_size = 32 if length > 300 else 16
    config = config_for(block_size, sink_blocks, local_blocks)
    layout = SequenceLayout.dense(1, length)
    modes = torch.tensor([[FULL, SSA]])
    tables = build_block_tables(layout, modes, config, num_query_heads=4)
    for head, mode in enumerate(["full", "full", "ssa", "ssa"]):
        expected = token_mask(length, block_size, mode, sink_blocks, local_blocks) if length <= 300 else None
        if expected is None:
            continue
        assert torch.equal(expand_to_tokens(tables, layout, 0, head), expected)


def test_long_sequence_ssa_rows_have_the_window_size():
    config = config_for(32, 2, 3)
    layout = SequenceLayout.dense(1, 1000)
    tables = build_block_tables(layout, torch.tensor([[SSA]]), config, num_query_heads=1)
    counts = tables.kv_block_count[0, 0].tolist()
    expected = [len(set(range(2)) & set(range(b + 1)) | set(range(max(0, b - 2), b + 1))) for b in range(32)]
    assert counts == expected


def test_batch_of_different_lengths_with_left_and_right_padding():
    config = config_for(8, 1, 2)
    mask = torch.zeros(3, 40, dtype=torch.bool)
    mask[0, :] = True
    mask[1, 13:] = True  # left padded, 27 tokens
    mask[2, :9] = True  # right padded, 9 tokens
    layout = SequenceLayout.from_padding_mask(mask)
    assert layout.key_start.tolist() == [0, 13, 0] and layout.key_len.tolist() == [40, 27, 9]
    modes = torch.tensor([[SSA, FULL], [FULL, SSA], [SSA, SSA]])
    tables = build_block_tables(layout, modes, config, num_query_heads=2)
    for n, length in enumerate([40, 27, 9]):
        for head in range(2):
            mode = "ssa" if modes[n, head] == SSA else "full"
            assert torch.equal(expand_to_tokens(tables, layout, n, head), token_mask(length, 8, mode, 1, 2))


def test_decode_rows_cover_only_the_new_queries():
    config = config_for(8, 1, 2)
    mask = torch.ones(2, 50, dtype=torch.bool)
    mask[1, :20] = False
    layout = SequenceLayout.from_padding_mask(mask, query_len=3)
    tables = build_block_tables(layout, torch.tensor([[SSA], [SSA]]), config, num_query_heads=1)
    assert tables.first_query_block.tolist() == [47 // 8, 27 // 8]
    for n, length in enumerate([50, 30]):
        expected = token_mask(length, 8, "ssa", 1, 2)[-3:]
        assert torch.equal(expand_to_tokens(tables, layout, n, 0), expected)


def test_single_token_step_is_recognised_from_the_spans():
    """A decode step: one query per sequence, sequence n in row n; a prefill or a packed row is not one."""
    mask = torch.ones(2, 50, dtype=torch.bool)
    mask[1, :20] = False
    step = SequenceLayout.from_padding_mask(mask, query_len=1)
    assert step.is_single_token_step
    assert step.spans() is step.spans()  # computed once per layout
    assert step.spans() == [(0, 0, 50, 0, 1), (1, 20, 30, 0, 1)]
    assert not SequenceLayout.from_padding_mask(mask, query_len=3).is_single_token_step
    assert not SequenceLayout.from_padding_mask(mask).is_single_token_step
    packed = SequenceLayout.from_position_ids(torch.tensor([[0, 1, 2, 0, 1]]))
    assert not packed.is_single_token_step


def test_xa_heads_at_decode_attend_every_key():
    config = config_for(8, 1, 2, configuration="fa-xa")
    layout = SequenceLayout.dense(1, 30, query_len=1)
    tables = build_block_tables(layout, torch.tensor([[XA]]), config, num_query_heads=1)
    assert torch.equal(expand_to_tokens(tables, layout, 0, 0), token_mask(30, 8, "full")[-1:])


def test_xa_prefill_tables_follow_the_selection():
    torch.manual_seed(0)
    config = config_for(16, 1, 1, configuration="fa-xa", xa_stride=4)
    length = 90
    query, key = torch.randn(1, 4, length, 8), torch.randn(1, 2, length, 8)
    layout = SequenceLayout.dense(1, length)
    tables = build_block_tables(layout, torch.tensor([[XA, FULL]]), config, 4, query=query, key=key)
    selection = xattention_block_mask(query[0, :2], key[0, :1], block_size=16, stride=4, threshold=0.9)
    assert torch.equal(block_mask_from_tables(tables, 0, 6)[:2], selection)
    assert torch.equal(expand_to_tokens(tables, layout, 0, 3), token_mask(length, 16, "full"))
    with pytest.raises(InputError, match="XA"):
        build_block_tables(layout, torch.tensor([[XA, FULL]]), config, 4)


def test_packed_layout_from_position_ids():
    position_ids = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 6, 7, 8]])
    layout = SequenceLayout.from_position_ids(position_ids)
    assert layout.row.tolist() == [0, 0, 0, 1]
    assert layout.key_start.tolist() == [0, 3, 5, 0]
    assert layout.key_len.tolist() == [3, 2, 4, 9]


@pytest.mark.parametrize(
    "mask, words",
    [
        (torch.ones(0, 5), "batch is empty"),
        (torch.ones(2, 0), "no tokens"),
        (torch.tensor([[1, 1, 0], [0, 0, 0]]), "rows [1] have no tokens"),
        (torch.tensor([[1, 0, 1]]), "not one contiguous span"),
        (torch.ones(1, 2, 3, 3), "2D padding mask"),
    ],
)
def test_bad_masks_are_refused(mask, words):
    with pytest.raises(InputError) as error:
        SequenceLayout.from_padding_mask(mask)
    assert words in str(error.value)


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 90), min_size=1, max_size=3),
    block_size=st.sampled_from([4, 8, 16]),
    sink_blocks=st.integers(0, 3),
    local_blocks=st.integers(1, 4),
    query_len=st.integers(1, 90),
    data=st.data(),
)
def test_random_batches_match_the_brute_force_mask_and_pair_count(lengths, block_size, sink_blocks, local_blocks, query_len, data):
    width = max(lengths)
    mask = torch.zeros(len(lengths), width, dtype=torch.bool)
    for row, length in enumerate(lengths):
        mask[row, width - length :] = True
    query_len = min(query_len, min(lengths))
    layout = SequenceLayout.from_padding_mask(mask, query_len=query_len)
    modes = torch.tensor(data.draw(st.lists(st.lists(st.sampled_from([FULL, SSA]), min_size=2, max_size=2),
                                            min_size=len(lengths), max_size=len(lengths))))
    config = config_for(block_size, sink_blocks, local_blocks)
    tables = build_block_tables(layout, modes, config, num_query_heads=2)
    pairs = attended_pairs(tables, layout)
    totals = causal_pairs(layout)
    for n, length in enumerate(lengths):
        assert int(totals[n]) == int(torch.ones(length, length).tril()[-query_len:].sum())
        for head in range(2):
            mode = "ssa" if modes[n, head] == SSA else "full"
            brute = token_mask(length, block_size, mode, sink_blocks, local_blocks)[-query_len:]
            assert torch.equal(expand_to_tokens(tables, layout, n, head), brute)
            assert int(pairs[n, head]) == int(brute.sum())
            # SSA is inside causal, sinks are always visible, the window is exact.
            if mode == "ssa":
                assert torch.equal(brute & ~torch.ones(length, length, dtype=torch.bool).tril()[-query_len:],
                                   torch.zeros_like(brute))


@pytest.mark.parametrize("query_len", [None, 1])
def test_builder_reuses_patterns_across_layers_and_counts_pairs_like_the_tables(query_len):
    torch.manual_seed(3)
    config = ElasticConfig(configuration="fa-xa", block_size=8, sink_tokens=8, local_tokens=16, xa_stride=4)
    mask = torch.ones(2, 53, dtype=torch.bool)
    mask[1, :20] = False
    layout = SequenceLayout.from_padding_mask(mask, query_len)
    builder = BlockTableBuilder(layout, config, "cpu")
    width = query_len or 53
    query, key = torch.randn(2, 4, width, 16), torch.randn(2, 2, 53, 16)
    for modes in ([[0, 1], [1, 1]], [[2, 1], [0, 2]], [[1, 0], [0, 0]]):
        modes = torch.tensor(modes)
        tables, pairs = builder.build(modes, 4, query=query, key=key)
        alone = build_block_tables(layout, modes, config, 4, query=query, key=key)
        assert torch.equal(tables.kv_block_count, alone.kv_block_count)
        assert torch.equal(tables.kv_block_index, alone.kv_block_index)
        assert torch.equal(pairs, attended_pairs(tables, layout))
        if not bool((modes == XA).any()):  # a builder of a configuration without XA skips the device check
            without_xa = BlockTableBuilder(layout, dataclasses.replace(config, configuration="fa-ssa"), "cpu")
            promised, promised_pairs = without_xa.build(modes, 4, query=query, key=key)
            assert torch.equal(promised.kv_block_index, tables.kv_block_index) and torch.equal(promised_pairs, pairs)


def test_xa_heads_need_a_configuration_with_xa():
    layout = SequenceLayout.from_padding_mask(torch.ones(1, 40, dtype=torch.bool))
    config = ElasticConfig(block_size=8, sink_tokens=8, local_tokens=16, xa_stride=4)  # fa-ssa
    query, key = torch.randn(1, 2, 40, 16), torch.randn(1, 2, 40, 16)
    with pytest.raises(InputError, match="has no XA"):
        build_block_tables(layout, torch.tensor([[XA, FULL]]), config, 2, query=query, key=key)
