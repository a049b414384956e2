"""Tests of XAttention block selection against slow, loop-based oracles of the same rule."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_attention.errors import ConfigError, InputError
from elastic_attention.patterns.xattention import (
    _MAX_CHUNK_FLOATS,
    _antidiagonal_block_scores,
    _default_query_blocks_per_chunk,
    _float32_products,
    antidiagonal_block_scores,
    select_blocks_by_mass,
    xattention_block_mask,
)

THRESHOLDS = (0.1, 0.5, 0.9, 0.95, 1.0)


# ----------------------------------------------------------------------------------------------
# Oracles
# ----------------------------------------------------------------------------------------------


def oracle_block_scores(query, key, block_size, stride, scale=None):
    """Float64, one tile at a time: antidiagonal sums, causal softmax per strided row, block sums."""
    num_q_heads, length, head_dim = query.shape
    group = num_q_heads // key.shape[0]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    num_rows = -(-length // stride)
    num_blocks = -(-length // block_size)
    out = torch.zeros(num_q_heads, num_blocks, num_blocks, dtype=torch.float64)
    for h in range(num_q_heads):
        # Token-level dot products; indices past L are the zero padding.
        dots = (query[h].double() @ key[h // group].double().T).tolist()

        def dot(a, b):
            return dots[a][b] if a < length and b < length else 0.0

        for j in range(num_rows):
            logits = []
            for m in range(j + 1):
                tile = 0.0
                for i in range(stride):
                    tile += dot(j * stride + stride - 1 - i, m * stride + i)
                logits.append(tile * scale / stride)
            peak = max(logits)
            weights = [math.exp(x - peak) for x in logits]
            norm = sum(weights)
            for m, w in enumerate(weights):
                out[h, (j * stride) // block_size, (m * stride) // block_size] += w / norm
    return out


def oracle_select(scores, threshold):
    """Per-row greedy: sink and diagonal first, then candidates by (-score, kb) while kept < tau * total."""
    num_heads, num_blocks, _ = scores.shape
    values = scores.double().tolist()
    keep = torch.zeros(scores.shape, dtype=torch.bool)
    for h in range(num_heads):
        for qb in range(num_blocks):
            row = values[h][qb]
            total = sum(row[: qb + 1])
            keep[h, qb, 0] = keep[h, qb, qb] = True
            kept = row[0] + (row[qb] if qb > 0 else 0.0)
            for kb in sorted(range(1, qb), key=lambda kb: (-row[kb], kb)):
                if kept >= threshold * total:
                    break
                keep[h, qb, kb] = True
                kept += row[kb]
    return keep


def random_qk(num_q_heads, num_kv_heads, length, head_dim, seed, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(num_q_heads, length, head_dim, generator=gen).to(dtype)
    key = torch.randn(num_kv_heads, length, head_dim, generator=gen).to(dtype)
    return query, key


# ----------------------------------------------------------------------------------------------
# antidiagonal_block_scores
# ----------------------------------------------------------------------------------------------

BLOCKINGS = [(b, s) for b in (16, 32, 64) for s in (4, 8, 16)]
HEAD_LAYOUTS = [(2, 2), (4, 2), (4, 1)]  # (Hq, Hkv): GQA ratios 1, 2, 4
SCORE_CASES = [
    (length, block_size, stride, (8, 32)[n % 2], HEAD_LAYOUTS[n % 3])
    for n, (length, (block_size, stride)) in enumerate(
        itertools.product((1, 5, 16, 17, 33, 64, 100, 129, 250), BLOCKINGS)
    )
]


@pytest.mark.parametrize(("length", "block_size", "stride", "head_dim", "heads"), SCORE_CASES)
def test_block_scores_match_oracle(length, block_size, stride, head_dim, heads):
    query, key = random_qk(*heads, length, head_dim, seed=length * 1000 + block_size + stride)
    got = antidiagonal_block_scores(query, key, block_size=block_size, stride=stride)
    want = oracle_block_scores(query, key, block_size, stride)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want.float(), rtol=1e-5, atol=1e-5)


def test_block_scores_explicit_scale_matches_oracle():
    query, key = random_qk(4, 2, 77, 16, seed=3)
    got = antidiagonal_block_scores(query, key, block_size=32, stride=8, scale=0.7)
    torch.testing.assert_close(got, oracle_block_scores(query, key, 32, 8, scale=0.7).float(), rtol=1e-5, atol=1e-5)


def test_block_scores_upcast_half_inputs():
    query, key = random_qk(4, 2, 100, 32, seed=4, dtype=torch.bfloat16)
    got = antidiagonal_block_scores(query, key, block_size=32, stride=8)
    want = antidiagonal_block_scores(query.float(), key.float(), block_size=32, stride=8)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("length", [1, 63, 250])
def test_block_scores_do_not_depend_on_chunk_size(length):
    query, key = random_qk(8, 2, length, 16, seed=length)
    reference = _antidiagonal_block_scores(query, key, 16, 4, 0.25, 1_000_000)
    for per_chunk in (1, 2, 3, None):
        got = _antidiagonal_block_scores(query, key, 16, 4, 0.25, per_chunk)
        torch.testing.assert_close(got, reference, rtol=1e-6, atol=1e-6)


def test_default_chunk_bounds_strided_scores_at_128k_tokens():
    num_heads, stride, tiles_per_block = 32, 8, 16
    num_rows = 128 * 1024 // stride
    per_chunk = _default_query_blocks_per_chunk(num_heads, num_rows, tiles_per_block)
    assert per_chunk >= 1
    assert num_heads * per_chunk * tiles_per_block * num_rows <= _MAX_CHUNK_FLOATS
    assert _default_query_blocks_per_chunk(10_000, 10_000_000, 64) == 1


# ----------------------------------------------------------------------------------------------
# select_blocks_by_mass
# ----------------------------------------------------------------------------------------------


def estimated_scores(seed):
    query, key = random_qk(4, 2, 250, 16, seed=seed)
    return antidiagonal_block_scores(query, key, block_size=16, stride=4)


def uniform_scores(seed):
    return torch.rand(3, 20, 20, generator=torch.Generator().manual_seed(seed))


def tied_scores(seed):
    # Quarter steps: many ties, zeros, and sums that are exact in binary floating point.
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 4, (3, 20, 20), generator=gen).float() / 4


@pytest.mark.parametrize("make_scores", [estimated_scores, uniform_scores, tied_scores])
@pytest.mark.parametrize("threshold", THRESHOLDS)
@pytest.mark.parametrize("seed", [0, 1])
def test_select_matches_oracle(make_scores, threshold, seed):
    scores = make_scores(seed)
    assert torch.equal(select_blocks_by_mass(scores, threshold), oracle_select(scores, threshold))


def test_select_stops_at_first_refused_block():
    # Negative scores make the running mass non-monotone: a later block must not be re-admitted.
    scores = torch.randn(3, 20, 20, generator=torch.Generator().manual_seed(5))
    for threshold in THRESHOLDS:
        assert torch.equal(select_blocks_by_mass(scores, threshold), oracle_select(scores, threshold))


def test_select_breaks_ties_toward_lower_block():
    scores = torch.zeros(1, 5, 5)
    scores[0, 4] = torch.tensor([1.0, 2.0, 2.0, 2.0, 1.0])  # total 8; sink + diagonal = 2
    keep = select_blocks_by_mass(scores, 0.5)  # needs 4: adds kb 1, then stops
    assert keep[0, 4].tolist() == [True, True, False, False, True]


def test_select_threshold_one_keeps_every_positive_causal_block():
    scores = uniform_scores(7) + 0.01
    scores[:, :, 5] = 0.0  # zero-mass column: never needed
    keep = select_blocks_by_mass(scores, 1.0)
    causal = torch.ones(20, 20, dtype=torch.bool).tril()
    expected = causal & (scores > 0)
    expected[:, :, 0] = True
    expected |= torch.eye(20, dtype=torch.bool)
    assert torch.equal(keep, expected)


def test_select_ignores_scores_above_diagonal():
    scores = uniform_scores(8)
    noisy = scores + torch.ones(20, 20).triu(1) * 100.0
    for threshold in THRESHOLDS:
        assert torch.equal(select_blocks_by_mass(scores, threshold), select_blocks_by_mass(noisy, threshold))


def check_mask_properties(scores, keep, threshold):
    num_blocks = scores.shape[-1]
    assert keep.dtype == torch.bool and keep.shape == scores.shape
    assert not (keep & torch.ones(num_blocks, num_blocks, dtype=torch.bool).triu(1)).any()
    assert keep[:, :, 0].all()
    assert torch.diagonal(keep, dim1=-2, dim2=-1).all()
    causal = scores.double().tril()
    kept = (causal * keep).sum(-1)
    total = causal.sum(-1)
    assert (kept >= threshold * total * (1 - 1e-6)).all()


@settings(max_examples=30, deadline=None)
@given(
    length=st.integers(1, 300),
    blocking=st.sampled_from(BLOCKINGS),
    heads=st.sampled_from(HEAD_LAYOUTS),
    head_dim=st.sampled_from([8, 32]),
    thresholds=st.tuples(st.sampled_from(THRESHOLDS), st.floats(0.01, 1.0)),
    seed=st.integers(0, 2**16),
)
def test_mask_properties(length, blocking, heads, head_dim, thresholds, seed):
    block_size, stride = blocking
    query, key = random_qk(*heads, length, head_dim, seed=seed)
    scores = antidiagonal_block_scores(query, key, block_size=block_size, stride=stride)
    rows_per_block = torch.tensor(
        [len(range(b * block_size, min((b + 1) * block_size, length), stride)) for b in range(scores.shape[1])],
        dtype=torch.float32,
    )
    torch.testing.assert_close(scores.sum(-1), rows_per_block.expand(heads[0], -1), rtol=1e-5, atol=1e-5)

    low, high = sorted(thresholds)
    keep_low = select_blocks_by_mass(scores, low)
    keep_high = select_blocks_by_mass(scores, high)
    check_mask_properties(scores, keep_low, low)
    check_mask_properties(scores, keep_high, high)
    assert not (keep_low & ~keep_high).any()
    assert torch.equal(
        xattention_block_mask(query, key, block_size=block_size, stride=stride, threshold=high), keep_high
    )


@settings(max_examples=30, deadline=None)
@given(
    scores=st.integers(1, 12).flatmap(
        lambda n: st.lists(st.integers(0, 8), min_size=2 * n * n, max_size=2 * n * n).map(
            lambda v: torch.tensor(v, dtype=torch.float32).view(2, n, n) / 8
        )
    ),
    threshold=st.sampled_from(THRESHOLDS),
)
def test_select_matches_oracle_on_tied_scores(scores, threshold):
    assert torch.equal(select_blocks_by_mass(scores, threshold), oracle_select(scores, threshold))


def test_concentrated_query_selects_far_block():
    length, block_size, stride, head_dim = 256, 32, 8, 16
    gen = torch.Generator().manual_seed(0)
    query = 0.1 * torch.randn(2, length, head_dim, generator=gen)
    key = 0.1 * torch.randn(1, length, head_dim, generator=gen)
    direction = torch.randn(head_dim, generator=gen)
    direction = 3.0 * direction / direction.norm() * math.sqrt(head_dim)
    key[:, 2 * block_size : 3 * block_size] = direction  # key block 2 ...
    query[:, 7 * block_size :] = direction  # ... is what the last query block looks for
    keep = xattention_block_mask(query, key, block_size=block_size, stride=stride, threshold=0.9)
    assert keep[:, 7].tolist() == [[True, False, True, False, False, False, False, True]] * 2


# ----------------------------------------------------------------------------------------------
# Input validation
# ----------------------------------------------------------------------------------------------

Q, K = random_qk(4, 2, 40, 8, seed=0)


@pytest.mark.parametrize(
    ("call", "error", "fragment"),
    [
        (lambda: antidiagonal_block_scores(Q[0], K, block_size=16, stride=4), InputError, "`query`"),
        (lambda: antidiagonal_block_scores(Q, K[None], block_size=16, stride=4), InputError, "`key`"),
        (lambda: antidiagonal_block_scores(Q.long(), K, block_size=16, stride=4), InputError, "floating"),
        (lambda: antidiagonal_block_scores(Q, K[:, :39], block_size=16, stride=4), InputError, "(40)"),
        (lambda: antidiagonal_block_scores(Q[:, :0], K[:, :0], block_size=16, stride=4), InputError, "length 0"),
        (lambda: antidiagonal_block_scores(Q[:3], K, block_size=16, stride=4), InputError, "(3)"),
        (lambda: antidiagonal_block_scores(Q, K[..., :4], block_size=16, stride=4), InputError, "head dim"),
        (
            lambda: antidiagonal_block_scores(Q, K, block_size=128, stride=12),
            ConfigError,
            "`stride` (12) must divide `block_size` (128)",
        ),
        (lambda: antidiagonal_block_scores(Q, K, block_size=0, stride=4), ConfigError, "`block_size`"),
        (lambda: antidiagonal_block_scores(Q, K, block_size=16, stride=4.0), ConfigError, "`stride`"),
        (lambda: antidiagonal_block_scores(Q, K, block_size=16, stride=4, scale=-1.0), ConfigError, "`scale`"),
        (lambda: xattention_block_mask(Q, K, block_size=16, stride=4, threshold=0.0), ConfigError, "`threshold`"),
        (lambda: xattention_block_mask(Q, K, block_size=16, stride=4, threshold=1.5), ConfigError, "1.5"),
        (lambda: select_blocks_by_mass(torch.rand(2, 3, 3), float("nan")), ConfigError, "`threshold`"),
        (lambda: select_blocks_by_mass(torch.rand(3, 3), 0.5), InputError, "`scores`"),
        (lambda: select_blocks_by_mass(torch.rand(2, 3, 4), 0.5), InputError, "(2, 3, 4)"),
        (lambda: select_blocks_by_mass(torch.ones(2, 3, 3, dtype=torch.long), 0.5), InputError, "floating"),
    ],
)
def test_bad_inputs_raise(call, error, fragment):
    with pytest.raises(error) as info:
        call()
    assert fragment in str(info.value)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_products_come_back_as_float32_products_of_the_same_values(dtype):
    """Where torch has no half-precision product into float32 (the CPU), the float32 copies are multiplied."""
    generator = torch.Generator().manual_seed(2)
    a = torch.randn(3, 17, 40, generator=generator).to(dtype)
    b = torch.randn(3, 40, 9, generator=generator).to(dtype)
    got = _float32_products(a, b)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), a.double() @ b.double(), rtol=1e-6, atol=1e-5)
