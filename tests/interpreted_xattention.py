"""The Triton XA estimate on the CPU through Triton's interpreter, against the float64 loop oracle; run by
`test_triton_interpreter.py` in a process with ``TRITON_INTERPRET=1`` (GPU runs: `tests/test_gpu_backends.py`)."""

import os

import pytest
import torch
from conftest import oracle_block_scores

from elastic_attention.backends import triton_xattention
from elastic_attention.backends.triton_xattention import (
    EstimateLaunch,
    antidiagonal_block_scores_triton,
    triton_xattention_available,
)
from elastic_attention.errors import InputError
from elastic_attention.patterns.xattention import antidiagonal_block_scores

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")

# (length, query heads, KV heads, head_dim, block_size, stride): odd lengths, GQA 1 / 3 / 2, a tile of several
# blocks and a block of one strided row, row counts below, at and past one tile of 64 strided rows.
CASES = [
    (1, 2, 1, 16, 16, 4),
    (37, 4, 2, 32, 16, 4),
    (130, 3, 1, 48, 32, 8),
    (257, 2, 2, 16, 16, 4),
    (69, 2, 2, 16, 8, 8),
    (300, 4, 1, 16, 64, 4),
]


@pytest.mark.parametrize("length, heads, kv_heads, head_dim, block_size, stride", CASES)
def test_triton_block_scores_match_the_float64_oracle(length, heads, kv_heads, head_dim, block_size, stride):
    generator = torch.Generator().manual_seed(length)
    query = torch.randn(heads, length, head_dim, generator=generator)
    key = torch.randn(kv_heads, length, head_dim, generator=generator)
    got = antidiagonal_block_scores_triton(query, key, block_size=block_size, stride=stride)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), oracle_block_scores(query, key, block_size, stride), rtol=1e-5, atol=2e-5)


def test_triton_block_scores_read_strided_views_and_an_explicit_scale():
    generator = torch.Generator().manual_seed(5)
    query = torch.randn(150, 4, 32, generator=generator).transpose(0, 1)  # [Hq, L, D] with the head axis innermost
    key = torch.randn(150, 2, 32, generator=generator).transpose(0, 1)
    got = antidiagonal_block_scores_triton(query, key, block_size=32, stride=8, scale=0.3)
    torch.testing.assert_close(got, antidiagonal_block_scores(query, key, block_size=32, stride=8, scale=0.3),
                               rtol=1e-5, atol=2e-5)


def test_unsupported_blockings_are_refused_with_the_alternative():
    assert not triton_xattention_available(torch.device("cpu"), torch.float32, block_size=96, stride=8, head_dim=16)
    assert not triton_xattention_available(torch.device("cpu"), torch.float32, block_size=32, stride=8, head_dim=24)
    assert not triton_xattention_available(torch.device("cpu"), torch.float64, block_size=32, stride=8, head_dim=16)
    query = torch.randn(2, 40, 16)
    with pytest.raises(ValueError, match="antidiagonal_block_scores"):
        antidiagonal_block_scores_triton(query, query, block_size=96, stride=8)
    with pytest.raises(InputError, match="multiple"):
        antidiagonal_block_scores_triton(query, query[:1].expand(3, -1, -1), block_size=32, stride=8)


@pytest.mark.parametrize("launch", [EstimateLaunch(tile_rows=16, max_heads_per_program=1, block_k=16),
                                    EstimateLaunch(tile_rows=32, max_heads_per_program=2, block_k=32)])
def test_launch_settings_and_scratch_chunks_do_not_change_the_scores(launch, monkeypatch):
    generator = torch.Generator().manual_seed(11)
    query = torch.randn(8, 203, 32, generator=generator)
    key = torch.randn(2, 203, 32, generator=generator)
    expected = antidiagonal_block_scores_triton(query, key, block_size=16, stride=4)
    monkeypatch.setattr(triton_xattention, "_MAX_SCRATCH_FLOATS", 1)  # one launch per head group
    got = antidiagonal_block_scores_triton(query, key, block_size=16, stride=4, launch=launch)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
