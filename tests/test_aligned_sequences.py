"""Aligning sequences to the start of their own batch row, and the fa4 backend's refusal where it cannot run."""

import pytest
import torch

from elastic_attention import BackendUnavailableError
from elastic_attention.backends import get_backend
from elastic_attention.backends.sequences import AlignedSequences
from elastic_attention.patterns import SequenceLayout


def test_gather_then_scatter_restores_every_sequence_and_zeroes_padding():
    mask = torch.zeros(2, 19, dtype=torch.bool)
    mask[0, 5:] = True
    mask[1, :11] = True
    layout = SequenceLayout.from_padding_mask(mask)
    query = torch.randn(2, 4, 19, 8)
    key, value = torch.randn(2, 2, 2, 19, 8)
    aligned = AlignedSequences.gather(query, key, value, layout, block_size=8)
    assert aligned.copied and aligned.key.shape == (2, 2, 16, 8) and aligned.query.shape == (2, 4, 16, 8)
    assert torch.equal(aligned.key[0, :, :14], key[0, :, 5:]) and not aligned.key[0, :, 14:].any()
    assert torch.equal(aligned.value[1, :, :11], value[1, :, :11])
    restored = aligned.scatter(aligned.query, query)
    expected = query * mask[:, None, :, None]
    assert torch.equal(restored, expected)


def test_an_unpadded_prefill_is_not_copied_and_right_padding_rows_come_back_zero():
    mask = torch.ones(2, 13, dtype=torch.bool)
    mask[1, 9:] = False
    query = torch.randn(2, 2, 13, 4)
    key = torch.randn(2, 1, 13, 4)
    aligned = AlignedSequences.gather(query, key, key, SequenceLayout.from_padding_mask(mask), block_size=8)
    assert not aligned.copied and aligned.query.data_ptr() == query.data_ptr()
    restored = aligned.scatter(query.clone(), query)
    assert torch.equal(restored[0], query[0]) and torch.equal(restored[1, :, :9], query[1, :, :9])
    assert not restored[1, :, 9:].any()


def test_packed_and_decode_layouts_are_copied():
    layout = SequenceLayout.from_position_ids(torch.tensor([list(range(5)) + list(range(7))]))
    query = torch.randn(1, 2, 12, 4)
    aligned = AlignedSequences.gather(query, query[:, :1], query[:, :1], layout, block_size=4)
    assert aligned.copied and aligned.lengths == [5, 7] and aligned.query_offsets == [0, 0]
    decode = SequenceLayout.dense(2, 10, query_len=1)
    key = torch.randn(2, 1, 10, 4)
    aligned = AlignedSequences.gather(torch.randn(2, 2, 1, 4), key, key, decode, block_size=4)
    assert aligned.copied and aligned.query_offsets == [9, 9] and aligned.query_counts == [1, 1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_fa4_by_name_says_why_it_cannot_run():
    with pytest.raises(BackendUnavailableError, match="fa4.*CUDA GPU"):
        get_backend("fa4")


def test_fa4_says_which_calls_it_hands_to_its_fallback():
    from elastic_attention import ElasticConfig
    from elastic_attention.backends.fa4 import FA4Backend
    from elastic_attention.patterns import build_block_tables

    def reason(query, layout, block_size=64):
        config = ElasticConfig(block_size=block_size, sink_tokens=block_size, local_tokens=block_size)
        tables = build_block_tables(layout, torch.tensor([[0, 1]]), config, 4)
        return FA4Backend.unhandled_reason(query, query[:, :2], query[:, :2], layout, tables)

    prefill = SequenceLayout.dense(1, 70)
    half = torch.randn(1, 4, 70, 8, dtype=torch.bfloat16)
    assert reason(half, prefill) is None
    assert "cached past" in reason(half[:, :, -1:], SequenceLayout.dense(1, 70, query_len=1))
    assert "gradients" in reason(half.clone().requires_grad_(), prefill)
    assert "float32" in reason(half.float(), prefill)
    assert "block size 32" in reason(half, prefill, block_size=32)
