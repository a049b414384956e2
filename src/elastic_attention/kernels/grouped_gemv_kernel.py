"""The Triton kernels of `kernels.grouped_gemv` (imported only when they launch, so that importing elastic_attention
never imports Triton)."""

import triton
import triton.language as tl


@triton.jit
def _member(weight0, bias0, out0, rows0, weight1, bias1, out1, rows1, weight2, bias2, out2, rows2,
            BLOCK_N: tl.constexpr):
    """(weight, bias, out, rows, block) of this program: the first ceil(rows0 / BLOCK_N) programs serve weight0, the
    next ones weight1, the rest weight2; block is the program's index among those of its weight."""
    program = tl.program_id(0)
    blocks0 = tl.cdiv(rows0, BLOCK_N)
    blocks01 = blocks0 + tl.cdiv(rows1, BLOCK_N)
    second, third = program >= blocks0, program >= blocks01
    weight = tl.where(third, weight2, tl.where(second, weight1, weight0))
    bias = tl.where(third, bias2, tl.where(second, bias1, bias0))
    out = tl.where(third, out2, tl.where(second, out1, out0))
    rows = tl.where(third, rows2, tl.where(second, rows1, rows0))
    block = program - tl.where(third, blocks01, tl.where(second, blocks0, 0))
    return weight, bias, out, rows, block


@triton.jit
def grouped_gemv_kernel(x, weight0, bias0, out0, rows0, weight1, bias1, out1, rows1, weight2, bias2, out2, rows2,
                        COLS: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Up to three weights [rows_i, COLS] that read the same x [COLS], in one launch: out_i = weight_i @ x (+ bias_i),
    BLOCK_N outputs a program (a weight left out has no rows).

    A program makes BLOCK_N outputs over all of x: the products are added up per column slot while the weight streams
    by and summed once at the end, in float32 (no split of the columns, so nothing is reduced after the kernel)."""
    weight, bias, out, rows, block = _member(weight0, bias0, out0, rows0, weight1, bias1, out1, rows1, weight2, bias2,
                                             out2, rows2, BLOCK_N)
    n = block * BLOCK_N + tl.arange(0, BLOCK_N)
    in_rows = n < rows
    weight_rows = weight + n[:, None].to(tl.int64) * COLS
    products = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for start in range(0, COLS, BLOCK_K):
        k = start + tl.arange(0, BLOCK_K)
        in_cols = k < COLS
        w = tl.load(weight_rows + k[None, :], mask=in_rows[:, None] & in_cols[None, :], other=0.0,
                    eviction_policy="evict_first")  # read once
        a = tl.load(x + k, mask=in_cols, other=0.0)
        products += w.to(tl.float32) * a.to(tl.float32)[None, :]
    total = tl.sum(products, axis=1)
    if HAS_BIAS:
        total += tl.load(bias + n, mask=in_rows, other=0.0).to(tl.float32)
    tl.store(out + n, total.to(out.dtype.element_ty), mask=in_rows)


@triton.jit
def grouped_rows_kernel(x, inputs, weight0, bias0, out0, rows0, weight1, bias1, out1, rows1, weight2, bias2, out2,
                        rows2, COLS: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr):
    """Up to three weights [rows_i, COLS] that read the same x [inputs, COLS] (inputs <= BLOCK_M, a few rows: a decode
    step at a small batch), in one launch: out_i [inputs, rows_i] = x @ weight_i.T (+ bias_i), BLOCK_N output columns a
    program, for every input row at once, so each weight element is read once for all of them.

    The weight streams by in [BLOCK_N, BLOCK_K] tiles multiplied by x's [BLOCK_M, BLOCK_K] tile (rows past ``inputs``
    are zeros) on the tensor cores, with float32 sums (IEEE: exact float32 products, for float32 inputs); no split of
    the columns, so nothing is reduced after the kernel."""
    weight, bias, out, rows, block = _member(weight0, bias0, out0, rows0, weight1, bias1, out1, rows1, weight2, bias2,
                                             out2, rows2, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    n = block * BLOCK_N + tl.arange(0, BLOCK_N)
    in_inputs, in_rows = m < inputs, n < rows
    weight_rows = weight + n[:, None].to(tl.int64) * COLS
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, COLS, BLOCK_K):
        k = start + tl.arange(0, BLOCK_K)
        in_cols = k < COLS
        w = tl.load(weight_rows + k[None, :], mask=in_rows[:, None] & in_cols[None, :], other=0.0,
                    eviction_policy="evict_first")  # read once
        a = tl.load(x + m[:, None] * COLS + k[None, :], mask=in_inputs[:, None] & in_cols[None, :], other=0.0)
        if IEEE:
            total += tl.dot(a, tl.trans(w), input_precision="ieee")
        else:
            total += tl.dot(a, tl.trans(w))
    if HAS_BIAS:
        total += tl.load(bias + n, mask=in_rows, other=0.0).to(tl.float32)[None, :]
    tl.store(out + m[:, None] * rows + n[None, :], total.to(out.dtype.element_ty),
             mask=in_inputs[:, None] & in_rows[None, :])
