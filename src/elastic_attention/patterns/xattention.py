"""XAttention block selection for prefill (Xu et al. 2025), in pure torch.

For one unpadded sequence, each query head scores every (query block, key block) pair with
strided antidiagonal sums, then keeps, per query block, the fewest key blocks whose score mass
reaches a threshold. The sink block (key block 0) and the diagonal block are always kept.

Rule, for block size ``B``, stride ``s`` (``s`` divides ``B``) and ``L`` tokens:

* ``q`` and ``k`` are zero-padded to a multiple of ``s``. The antidiagonal score of tile
  ``(j, m)`` is ``sum_i q[j*s + s-1-i] . k[m*s + i]``, scaled by ``scale / s``.
* Tiles with ``m > j`` are masked; each strided query row ``j`` is softmaxed over ``m`` in float32.
* Block score ``A[qb, kb]`` sums the probabilities of the tiles whose rows lie in query block
  ``qb`` and whose columns lie in key block ``kb``.
* Per row ``qb``: keep key blocks ``0`` and ``qb``, then add the other causal blocks by descending
  score (ties: lower ``kb`` first) while the kept mass is below ``threshold * row_total``.

Nothing of size ``L x L`` is built: the ``(L/s) x (L/s)`` strided scores are computed a few query
blocks at a time, for all heads at once. Half-precision states on a GPU are multiplied in their own dtype with
float32 accumulation and float32 results (``torch.bmm(..., out_dtype=torch.float32)``; where torch lacks it, TF32
products of float32 copies, exact for bfloat16 and float16 values): the products are float32's either way, at
tensor-core speed. Float32 states keep float32 products.
"""

from __future__ import annotations

import functools
import math
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from elastic_attention.errors import ConfigError, InputError

__all__ = ["antidiagonal_block_scores", "select_blocks_by_mass", "xattention_block_mask"]

# Upper bound on the strided scores held at once (per chunk, all heads), in float32 elements.
_MAX_CHUNK_FLOATS = 1 << 26


def antidiagonal_block_scores(
    query: torch.Tensor,
    key: torch.Tensor,
    *,
    block_size: int,
    stride: int,
    scale: float | None = None,
) -> torch.Tensor:
    """Estimates block-level attention mass from strided antidiagonal sums.

    Args:
        query: Query states of one sequence, shape ``[Hq, L, D]``, any floating dtype
            (computed in float32).
        key: Key states of the same sequence, shape ``[Hkv, L, D]``, same dtype family and
            device; ``Hq`` must be a multiple of ``Hkv``. Query head ``h`` reads key head
            ``h // (Hq // Hkv)``.
        block_size: Block side in tokens; block ``b`` covers tokens
            ``[b * block_size, min((b + 1) * block_size, L))``.
        stride: Antidiagonal stride in tokens; must divide ``block_size``.
        scale: Attention scale (multiplies ``q . k``); defaults to ``1 / sqrt(D)``.

    Returns:
        Block scores ``A``, shape ``[Hq, Qb, Kb]`` with ``Qb = Kb = ceil(L / block_size)``,
        float32, on the input device. Row ``qb`` sums to the number of strided query rows in
        query block ``qb``; entries with ``kb > qb`` are zero.

    Raises:
        InputError: If ``query`` or ``key`` is not a 3-D floating tensor, their lengths,
            head dims or devices differ, ``Hq`` is not a multiple of ``Hkv``, or ``L == 0``.
        ConfigError: If ``block_size`` or ``stride`` is not a positive integer, ``stride``
            does not divide ``block_size``, or ``scale`` is not a positive finite number.
    """
    _check_qk(query, key)
    _check_blocking(block_size, stride)
    scale = _resolve_scale(scale, query.shape[-1])
    return _antidiagonal_block_scores(query, key, block_size, stride, scale, None)


def select_blocks_by_mass(scores: torch.Tensor, threshold: float) -> torch.Tensor:
    """Keeps, per query block, the highest-scoring key blocks until a mass threshold is met.

    Per row ``qb``, key blocks ``0`` (sink) and ``qb`` (diagonal) are always kept and count
    toward the kept mass; the other causal blocks are added by descending score (ties: lower
    ``kb`` first), each one only while ``kept < threshold * row_total``.

    Sums run in float64 (float32 on MPS), and ``row_total`` is accumulated in the same order as
    the kept mass (sink, diagonal, then candidates by descending score), so with
    ``threshold == 1.0`` the kept mass reaches the total exactly after the last positive block
    and zero-score blocks are never added. A positive block too small to change the float64 sum
    (below about ``1e-16 * row_total``) is not added.

    Args:
        scores: Block scores, shape ``[H, Qb, Kb]`` with ``Qb == Kb``, floating, non-negative
            on and below the diagonal; entries above the diagonal are ignored.
        threshold: Fraction of each row's mass to keep, in ``(0, 1]``.

    Returns:
        Keep mask, shape ``[H, Qb, Kb]``, bool, on the input device; never true above the
        diagonal, always true at ``kb == 0`` and ``kb == qb``.

    Raises:
        InputError: If ``scores`` is not a 3-D floating tensor with ``Qb == Kb``.
        ConfigError: If ``threshold`` is not a number in ``(0, 1]``.
    """
    if not isinstance(scores, torch.Tensor) or scores.dim() != 3 or not scores.is_floating_point():
        raise InputError(f"`scores` must be a 3-D floating tensor [H, Qb, Kb], got {_describe(scores)}")
    if scores.shape[1] != scores.shape[2]:
        raise InputError(f"`scores` must be square in its last two dims (Qb == Kb), got shape {tuple(scores.shape)}")
    _check_threshold(threshold)

    num_blocks = scores.shape[-1]
    device = scores.device
    acc_dtype = torch.float32 if device.type == "mps" else torch.float64
    s = scores.to(acc_dtype)
    qb = torch.arange(num_blocks, device=device).view(-1, 1)
    kb = torch.arange(num_blocks, device=device).view(1, -1)
    forced = (kb == 0) | (kb == qb)
    candidate = (kb < qb) & (kb != 0)

    diagonal = torch.diagonal(s, dim1=-2, dim2=-1)
    forced_mass = s[..., 0] + torch.where(qb.view(-1) > 0, diagonal, torch.zeros_like(diagonal))

    # Non-candidates sort last (key +inf) and contribute zero mass.
    order = torch.sort(torch.where(candidate, -s, math.inf), dim=-1, stable=True).indices
    sorted_mass = torch.where(candidate, s, 0.0).gather(-1, order)
    running = torch.cumsum(torch.cat([forced_mass.unsqueeze(-1), sorted_mass], dim=-1), dim=-1)
    kept_before, row_total = running[..., :-1], running[..., -1:]
    # cumprod: once one block is refused, every later one is too ("stop as soon as").
    add = (kept_before < threshold * row_total).cumprod(dim=-1).bool() & candidate.expand_as(s).gather(-1, order)

    keep = torch.zeros(s.shape, dtype=torch.bool, device=device).scatter(-1, order, add)
    return keep | forced


def xattention_block_mask(
    query: torch.Tensor,
    key: torch.Tensor,
    *,
    block_size: int,
    stride: int,
    threshold: float,
    scale: float | None = None,
) -> torch.Tensor:
    """Selects, per query head and query block, the key blocks XAttention keeps.

    ``select_blocks_by_mass(antidiagonal_block_scores(...), threshold)``; see both.

    Args:
        query: Query states of one sequence, shape ``[Hq, L, D]``, floating.
        key: Key states, shape ``[Hkv, L, D]``, ``Hq`` a multiple of ``Hkv``.
        block_size: Block side in tokens.
        stride: Antidiagonal stride in tokens; must divide ``block_size``.
        threshold: Fraction of each row's estimated mass to keep, in ``(0, 1]``.
        scale: Attention scale; defaults to ``1 / sqrt(D)``.

    Returns:
        Keep mask, shape ``[Hq, Qb, Kb]`` with ``Qb = Kb = ceil(L / block_size)``, bool,
        causal, sink and diagonal always kept.

    Raises:
        InputError: If ``query`` or ``key`` is malformed (see ``antidiagonal_block_scores``).
        ConfigError: If ``block_size``, ``stride``, ``scale`` or ``threshold`` is invalid.
    """
    _check_threshold(threshold)
    scores = antidiagonal_block_scores(query, key, block_size=block_size, stride=stride, scale=scale)
    return select_blocks_by_mass(scores, threshold)


def _antidiagonal_block_scores(
    query: torch.Tensor,
    key: torch.Tensor,
    block_size: int,
    stride: int,
    scale: float,
    query_blocks_per_chunk: int | None,
) -> torch.Tensor:
    """Unvalidated core of ``antidiagonal_block_scores``; ``None`` picks the chunk size."""
    num_q_heads, length, head_dim = query.shape
    num_kv_heads = key.shape[0]
    group = num_q_heads // num_kv_heads
    tiles_per_block = block_size // stride
    num_rows = -(-length // stride)
    num_blocks = -(-length // block_size)
    padded_length = num_rows * stride
    if query_blocks_per_chunk is None:
        query_blocks_per_chunk = _default_query_blocks_per_chunk(num_q_heads, num_rows, tiles_per_block)

    product_dtype = query.dtype if _half_on_gpu(query, key) else torch.float32
    key_strided = F.pad(key.to(product_dtype), (0, 0, 0, padded_length - length))
    key_strided = key_strided.reshape(num_kv_heads, num_rows, stride * head_dim)
    out = torch.zeros(num_q_heads, num_blocks, num_blocks, dtype=torch.float32, device=query.device)
    for qb0 in range(0, num_blocks, query_blocks_per_chunk):
        qb1 = min(qb0 + query_blocks_per_chunk, num_blocks)
        r0, r1 = qb0 * tiles_per_block, min(qb1 * tiles_per_block, num_rows)
        q_chunk = query[:, r0 * stride : min(r1 * stride, length)].to(product_dtype)
        q_chunk = F.pad(q_chunk, (0, 0, 0, (r1 - r0) * stride - q_chunk.shape[1]))
        # Reverse the rows inside each stride group: tile sums become antidiagonal sums.
        q_strided = q_chunk.view(num_q_heads, r1 - r0, stride, head_dim).flip(2)
        q_strided = q_strided.reshape(num_kv_heads, group * (r1 - r0), stride * head_dim)
        # Causality: rows below r1 only see the first r1 strided keys.
        logits = _float32_products(q_strided, key_strided[:, :r1].transpose(1, 2))
        logits = logits.view(num_q_heads, r1 - r0, r1)
        logits.mul_(scale / stride)
        rows = torch.arange(r0, r1, device=query.device).view(-1, 1)
        cols = torch.arange(r1, device=query.device).view(1, -1)
        logits.masked_fill_(cols > rows, -math.inf)
        probs = torch.softmax(logits, dim=-1)
        del logits
        probs = F.pad(probs, (0, qb1 * tiles_per_block - r1, 0, (qb1 - qb0) * tiles_per_block - (r1 - r0)))
        probs = probs.view(num_q_heads, qb1 - qb0, tiles_per_block, qb1, tiles_per_block)
        out[:, qb0:qb1, :qb1] = probs.sum(dim=(2, 4))
    return out


def _half_on_gpu(query: torch.Tensor, key: torch.Tensor) -> bool:
    return query.is_cuda and query.dtype in (torch.bfloat16, torch.float16) and key.dtype == query.dtype


def _float32_products(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.bmm(a, b)`` as float32 with float32 accumulation: half-precision inputs (on a GPU) multiplied in their
    dtype into float32 results, or as TF32 products of float32 copies where torch cannot; float32 inputs in float32."""
    if a.dtype == torch.float32:
        return torch.bmm(a, b)
    if _has_half_products_into_float32(a.device, a.dtype):
        return torch.bmm(a, b, out_dtype=torch.float32)
    with _tf32_products():
        return torch.bmm(a.float(), b.float())


@functools.lru_cache(maxsize=None)
def _has_half_products_into_float32(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether this torch has ``torch.bmm(..., out_dtype=torch.float32)`` for ``dtype`` inputs on ``device``."""
    probe = torch.ones(1, 1, 1, dtype=dtype, device=device)
    try:
        return torch.bmm(probe, probe, out_dtype=torch.float32).dtype == torch.float32
    except (TypeError, RuntimeError, NotImplementedError):
        return False


@contextmanager
def _tf32_products():
    """CUDA float32 matrix products in TF32 (for inputs that TF32 represents without rounding: bf16, fp16 values)."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def _default_query_blocks_per_chunk(num_q_heads: int, num_rows: int, tiles_per_block: int) -> int:
    """Query blocks per chunk so a chunk's strided scores stay under ``_MAX_CHUNK_FLOATS``."""
    return max(1, _MAX_CHUNK_FLOATS // (num_q_heads * num_rows * tiles_per_block))


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    return type(value).__name__


def _check_qk(query: torch.Tensor, key: torch.Tensor) -> None:
    for name, t in (("query", query), ("key", key)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3 or not t.is_floating_point():
            raise InputError(f"`{name}` must be a 3-D floating tensor [heads, L, D], got {_describe(t)}")
    (num_q_heads, q_len, q_dim), (num_kv_heads, k_len, k_dim) = query.shape, key.shape
    if q_len != k_len:
        raise InputError(f"`query` length ({q_len}) must equal `key` length ({k_len})")
    if q_len == 0:
        raise InputError("`query` and `key` have length 0; need at least one token")
    if q_dim != k_dim or q_dim == 0:
        raise InputError(f"`query` head dim ({q_dim}) and `key` head dim ({k_dim}) must be equal and > 0")
    if num_kv_heads == 0 or num_q_heads % num_kv_heads != 0:
        raise InputError(
            f"`query` heads ({num_q_heads}) must be a positive multiple of `key` heads ({num_kv_heads})"
        )
    if query.device != key.device:
        raise InputError(f"`query` is on {query.device} but `key` is on {key.device}")


def _check_blocking(block_size: int, stride: int) -> None:
    for name, value in (("block_size", block_size), ("stride", stride)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"`{name}` must be a positive integer, got {value!r}")
    if block_size % stride != 0:
        raise ConfigError(f"`stride` ({stride}) must divide `block_size` ({block_size})")


def _check_threshold(threshold: float) -> None:
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 < threshold <= 1.0:
        raise ConfigError(f"`threshold` must be a number in (0, 1], got {threshold!r}")


def _resolve_scale(scale: float | None, head_dim: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (math.isfinite(scale) and scale > 0):
        raise ConfigError(f"`scale` must be a positive finite number, got {scale!r}")
    return float(scale)
