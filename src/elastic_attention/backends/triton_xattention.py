"""The XA estimate (strided antidiagonal block scores) in one pass of Triton launches, with no (L/s) x (L/s) buffer.

Same rule and result as `patterns.xattention.antidiagonal_block_scores`, the pure-torch oracle: strided query row
``j`` scores strided key row ``m <= j`` with ``sum_i q[j*s + s-1-i] . k[m*s + i]`` (zero past the end), times
``scale / s``; each row is softmaxed over its causal rows; block score ``A[h, qb, kb]`` sums the probabilities whose
rows lie in query block ``qb`` and columns in key block ``kb``. The torch path materialises each chunk of strided
scores in float32 several times over (product, mask, softmax, block sums); here the scores stay on chip and are
computed once: a program of 64 strided rows keeps the rows' running maximum and sum of exponentials (the online
softmax) and, per tile of key rows, each row's sums over every key block (relative to the running maximum of that
moment) and that maximum, in a scratch buffer of ``[rows, key blocks]``; once the rows are complete, it rescales the
partial sums by their final statistics and adds them up per query block. The scratch holds ``block_size / stride``
times fewer numbers than the strided scores; a launch takes as many heads as keep it under `_MAX_SCRATCH_FLOATS`.

The strided rows are read in place from ``query`` and ``key`` (the antidiagonal order is pointer arithmetic), and
half-precision products are exact with float32 accumulation; float32 states take IEEE float32 products.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from elastic_attention.patterns.xattention import resolve_score_arguments

try:
    import triton
    import triton.language as tl
except ImportError:  # the XA estimate stays on its torch path
    triton = None

#: Strided query rows and key rows per tile (a tile covers whole blocks: block_size / stride must divide it).
_TILE_ROWS = 64
#: Upper bound on one launch's scratch (partial block sums and per-tile maxima), in float32 numbers.
_MAX_SCRATCH_FLOATS = 1 << 26


def triton_xattention_available(device: torch.device, dtype: torch.dtype, *, block_size: int, stride: int,
                                head_dim: int) -> bool:
    """True when `antidiagonal_block_scores_triton` can score states of ``dtype`` on ``device`` with this blocking:
    a CUDA device with Triton (bf16, fp16, float32), or the CPU under Triton's interpreter (``TRITON_INTERPRET=1``,
    float32, for tests); ``block_size / stride`` a power of two up to 64 and ``head_dim`` a multiple of 16."""
    if triton is None or block_size % stride:
        return False
    tiles_per_block = block_size // stride
    if tiles_per_block & (tiles_per_block - 1) or tiles_per_block > _TILE_ROWS or head_dim % 16:
        return False
    if device.type == "cuda":
        return dtype in (torch.bfloat16, torch.float16, torch.float32)
    return device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1" and dtype == torch.float32


def antidiagonal_block_scores_triton(
    query: torch.Tensor,
    key: torch.Tensor,
    *,
    block_size: int,
    stride: int,
    scale: float | None = None,
    launch: EstimateLaunch | None = None,
) -> torch.Tensor:
    """`patterns.xattention.antidiagonal_block_scores` on the GPU, the scores computed once.

    Args:
        query: [Hq, L, D] query states of one sequence (the last axis contiguous).
        key: [Hkv, L, D] key states; query head ``h`` reads key head ``h // (Hq // Hkv)``.
        block_size, stride, scale: as in `antidiagonal_block_scores`.
        launch: tile and launch settings (`EstimateLaunch`; the defaults are the fastest measured on an H200).

    Returns:
        [Hq, Qb, Kb] float32 block scores, ``Qb = Kb = ceil(L / block_size)``; zero above the diagonal.

    Raises:
        InputError, ConfigError: as `antidiagonal_block_scores`.
        ValueError: the device, dtype or blocking is one `triton_xattention_available` rejects.
    """
    scale = resolve_score_arguments(query, key, block_size, stride, scale)
    num_q_heads, length, head_dim = query.shape
    if not triton_xattention_available(query.device, query.dtype, block_size=block_size, stride=stride,
                                       head_dim=head_dim):
        raise ValueError(
            f"the Triton XA estimate cannot run on {query.device} for {query.dtype}, block {block_size}, stride "
            f"{stride}, head_dim {head_dim}; use patterns.xattention.antidiagonal_block_scores"
        )
    launch = launch or EstimateLaunch()
    query, key = _last_axis_contiguous(query), _last_axis_contiguous(key)
    group = num_q_heads // key.shape[0]
    heads_per_program = math.gcd(group, launch.max_heads_per_program)  # they share one key head
    tile = launch.tile_rows
    tiles_per_block = block_size // stride
    num_rows = -(-length // stride)
    num_blocks = -(-length // block_size)
    num_tiles = -(-num_rows // tile)
    key_blocks_padded = num_tiles * (tile // tiles_per_block)
    per_head = num_tiles * tile * (key_blocks_padded + num_tiles)
    heads_per_launch = max(1, min(num_q_heads, _MAX_SCRATCH_FLOATS // per_head))
    heads_per_launch = max(heads_per_program, heads_per_launch // heads_per_program * heads_per_program)
    partial_sums = torch.empty(heads_per_launch, num_tiles * tile, key_blocks_padded, device=query.device,
                               dtype=torch.float32)
    tile_maxima = torch.empty(heads_per_launch, num_tiles * tile, num_tiles, device=query.device, dtype=torch.float32)
    scores = torch.zeros(num_q_heads, num_blocks, num_blocks, device=query.device, dtype=torch.float32)
    for first_head in range(0, num_q_heads, heads_per_launch):
        heads = min(heads_per_launch, num_q_heads - first_head)
        _block_scores_kernel[(num_tiles, heads // heads_per_program)](
            query, key, query.stride(0), query.stride(1), key.stride(0), key.stride(1), first_head, length,
            num_rows, group, scale / stride * math.log2(math.e), partial_sums, tile_maxima, key_blocks_padded,
            num_tiles, scores, num_blocks, STRIDE=stride, HEAD_DIM=head_dim,
            BLOCK_K=math.gcd(head_dim, launch.block_k), TILE=tile, HEADS=heads_per_program,
            TILES_PER_BLOCK=tiles_per_block, PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
            num_warps=launch.num_warps, num_stages=launch.num_stages,
        )
    return scores


@dataclass(frozen=True)
class EstimateLaunch:
    """Tile and launch settings of `antidiagonal_block_scores_triton` (they change its speed, never its result).

    Attributes:
        tile_rows: strided query rows (and key rows) per tile; a power of two that ``block_size / stride`` divides.
        max_heads_per_program: query heads of one key head a program scores together (their rows share each key
            load); the largest common divisor with the GQA group is taken.
        block_k: dimensions of the strided rows per matrix product (a divisor of head_dim is taken).
        num_warps, num_stages: Triton's.
    """

    tile_rows: int = 64
    max_heads_per_program: int = 4
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 3


def _last_axis_contiguous(states: torch.Tensor) -> torch.Tensor:
    return states if states.stride(-1) == 1 else states.contiguous()


if triton is not None:

    @triton.jit
    def _tile_scores(query_rows, key, query_row_stride, key_row_stride, length, rows, columns, scale_log2,
                     STRIDE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
        """Scores [R, C] of strided query rows ``rows`` [R] (each read from its head's ``query_rows`` pointer)
        against strided key rows ``columns`` [C] of ``key``, in log2 units, -inf above the diagonal."""
        dims = tl.arange(0, BLOCK_K)
        accumulator = tl.zeros([rows.shape[0], columns.shape[0]], tl.float32)
        for offset in range(0, STRIDE * HEAD_DIM, BLOCK_K):
            step = offset // HEAD_DIM  # token i of the stride group: the query reads s-1-i, the key i
            dim0 = offset % HEAD_DIM
            query_tokens = rows.to(tl.int64) * STRIDE + (STRIDE - 1 - step)
            key_tokens = columns.to(tl.int64) * STRIDE + step
            q = tl.load(query_rows[:, None] + query_tokens[:, None] * query_row_stride + dim0 + dims[None, :],
                        mask=(query_tokens < length)[:, None], other=0.0)
            k = tl.load(key + key_tokens[:, None] * key_row_stride + dim0 + dims[None, :],
                        mask=(key_tokens < length)[:, None], other=0.0)
            accumulator += tl.dot(q, tl.trans(k), input_precision=PRECISION)
        return tl.where(columns[None, :] > rows[:, None], float("-inf"), accumulator * scale_log2)

    @triton.jit
    def _block_scores_kernel(query, key, query_head_stride, query_row_stride, key_head_stride, key_row_stride,
                             first_head, length, num_rows, group, scale_log2, partial_sums, tile_maxima,
                             key_blocks_padded, num_tiles, scores_out, num_blocks, STRIDE: tl.constexpr,
                             HEAD_DIM: tl.constexpr, BLOCK_K: tl.constexpr, TILE: tl.constexpr, HEADS: tl.constexpr,
                             TILES_PER_BLOCK: tl.constexpr, PRECISION: tl.constexpr):
        BLOCKS: tl.constexpr = TILE // TILES_PER_BLOCK  # query (and key) blocks per tile
        # The longest rows first: tile t reads t + 1 key tiles, and the short ones fill the GPU's tail.
        tile = tl.num_programs(0) - 1 - tl.program_id(0)
        slot = tl.program_id(1)
        # A program's rows: HEADS query heads (of one key head) x TILE strided rows, flattened head-major.
        flat = tl.arange(0, HEADS * TILE)
        rows = tile * TILE + flat % TILE
        launch_heads = slot * HEADS + flat // TILE
        heads = first_head + launch_heads
        query_rows = query + heads.to(tl.int64) * query_head_stride
        key = key + ((first_head + slot * HEADS) // group).to(tl.int64) * key_head_stride
        block_columns = tl.arange(0, BLOCKS)
        scratch_rows = launch_heads.to(tl.int64) * num_tiles * TILE + rows
        partial_rows = partial_sums + scratch_rows[:, None] * key_blocks_padded
        maxima_rows = tile_maxima + scratch_rows * num_tiles
        running_max = tl.full([HEADS * TILE], float("-inf"), tl.float32)
        running_sum = tl.zeros([HEADS * TILE], tl.float32)
        for key_tile in range(0, tile + 1):
            scores = _tile_scores(query_rows, key, query_row_stride, key_row_stride, length, rows,
                                  key_tile * TILE + tl.arange(0, TILE), scale_log2, STRIDE, HEAD_DIM, BLOCK_K,
                                  PRECISION)
            new_max = tl.maximum(running_max, tl.max(scores, 1))  # key row 0 is causal for every row: finite
            weights = tl.exp2(scores - new_max[:, None])
            running_sum = running_sum * tl.exp2(running_max - new_max) + tl.sum(weights, 1)
            running_max = new_max
            per_key_block = tl.sum(tl.reshape(weights, (HEADS * TILE, BLOCKS, TILES_PER_BLOCK)), 2)
            tl.store(partial_rows + key_tile * BLOCKS + block_columns[None, :], per_key_block)
            tl.store(maxima_rows + key_tile, new_max)
        tl.debug_barrier()  # the sums written above are read back below by other threads of this program
        row_weight = tl.where(rows < num_rows, 1.0 / running_sum, 0.0)
        query_blocks = tile * BLOCKS + block_columns
        out_heads = scores_out + (first_head + slot * HEADS + tl.arange(0, HEADS)).to(tl.int64) * num_blocks * num_blocks
        out_rows = out_heads[:, None] + query_blocks[None, :].to(tl.int64) * num_blocks  # [HEADS, BLOCKS]
        for key_tile in range(0, tile + 1):
            partial = tl.load(partial_rows + key_tile * BLOCKS + block_columns[None, :])
            rescale = tl.exp2(tl.load(maxima_rows + key_tile) - running_max) * row_weight
            weighted = tl.reshape(partial * rescale[:, None], (HEADS, BLOCKS, TILES_PER_BLOCK, BLOCKS))
            sums = tl.sum(weighted, 2)  # [HEADS, query blocks, key blocks]
            key_blocks = key_tile * BLOCKS + block_columns
            in_range = (query_blocks < num_blocks)[None, :, None] & (key_blocks < num_blocks)[None, None, :]
            tl.store(out_rows[:, :, None] + key_blocks[None, None, :], sums, mask=in_range)
