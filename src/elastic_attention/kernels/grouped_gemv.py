"""Linear projections of a decode step at a small batch (1 to `MAX_INPUT_ROWS` rows of input) as one Triton launch
per group of weights that read the same input.

At a small batch a decoder layer's projections must read every weight once; their time is the weights' bytes over
the memory bandwidth. cuBLAS runs the small ones (a model's q, k, v and o projections) far below it and splits the
long reductions (o and down projections) into partial sums that another kernel adds up (docs/how-it-works.md,
"Numbers behind the defaults", gives the profiles). `grouped_linear`
computes the projections that read one input (q, k and v; gate and up) in one launch, each program over a few whole
rows of one weight for every input row, so the small weights ride along with the large one, each weight element is
read once, and nothing is reduced after the kernel. One row runs `grouped_gemv_kernel` (products on the CUDA
cores), more rows `grouped_rows_kernel` (on the tensor cores).

`grouped_linear` is also the custom operator ``torch.ops.elastic_attention.grouped_linear``, so that a compiled
decoder layer calls it as it is (Inductor does not trace into it).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import torch

from elastic_attention.errors import InputError

#: Weights one launch reads.
MAX_WEIGHTS = 3

#: Rows of input one launch takes (a decode step's batch).
MAX_INPUT_ROWS = 16


@dataclass(frozen=True)
class GemvOptions:
    """How `grouped_linear` launches its kernel. The defaults (one row of input) were the fastest of a sweep for the
    Llama-3.1-8B shape (docs/how-it-works.md, "Numbers behind the defaults").

    Attributes:
        block_rows: weight rows per program (a power of two; at least 16 for more than one row of input).
        block_cols: columns per step of a program's loop over the input (a power of two, at least 16; an input of
            fewer columns takes the next power of two above its size).
        num_warps, num_stages: Triton's launch options.
    """

    block_rows: int = 4
    block_cols: int = 2048
    num_warps: int = 4
    num_stages: int = 3


#: The options `grouped_linear` uses for one row of input unless given others.
DEFAULT_OPTIONS = GemvOptions()

#: The options `grouped_linear` uses for 2 to `MAX_INPUT_ROWS` rows of input unless given others: the fastest of a
#: sweep at 8 rows for Qwen2.5-1.5B's shape (docs/how-it-works.md, "Numbers behind the defaults").
FEW_ROWS_OPTIONS = GemvOptions(block_rows=32, block_cols=256, num_warps=4, num_stages=3)


def grouped_gemv_available(device: torch.device, dtype: torch.dtype) -> bool:
    """True when the kernel can run on ``device`` for inputs of ``dtype``: a CUDA device with Triton installed (bf16,
    fp16, float32), or the CPU under Triton's interpreter (``TRITON_INTERPRET=1``, for tests; float32)."""
    if importlib.util.find_spec("triton") is None:
        return False
    if device.type == "cuda":
        return dtype in (torch.bfloat16, torch.float16, torch.float32)
    return device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1" and dtype == torch.float32


def grouped_linear_reference(x: torch.Tensor, weights: list[torch.Tensor],
                             biases: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """What `grouped_linear` computes, by ``torch.nn.functional.linear``."""
    return [torch.nn.functional.linear(x, weight, None if not biases else bias)
            for weight, bias in zip(weights, biases or [None] * len(weights))]


def grouped_linear(x: torch.Tensor, weights: list[torch.Tensor], biases: list[torch.Tensor] | None = None,
                   options: GemvOptions | None = None) -> list[torch.Tensor]:
    """``x @ weight.T (+ bias)`` for every weight, in one launch, for 1 to `MAX_INPUT_ROWS` rows of input (a decode
    step at a small batch: with more rows the product is compute-bound, and cuBLAS's).

    Args:
        x: [..., K] of 1 to `MAX_INPUT_ROWS` rows (the leading sizes' product).
        weights: 1 to `MAX_WEIGHTS` tensors [N_i, K], contiguous, of x's dtype and device.
        biases: None, or one [N_i] per weight.
        options: launch options (None: `DEFAULT_OPTIONS` for one row, `FEW_ROWS_OPTIONS` for more).

    Returns:
        One [..., N_i] tensor per weight, contiguous, in x's dtype (sums in float32).
    """
    _check(x, weights, biases, options)
    cols = x.shape[-1]
    inputs = x.numel() // cols
    flat = x.reshape(inputs, cols)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    options = options or (DEFAULT_OPTIONS if inputs == 1 else FEW_ROWS_OPTIONS)
    outs = [torch.empty(inputs, weight.shape[0], device=x.device, dtype=x.dtype) for weight in weights]
    padded = [(weight, bias, out, weight.shape[0]) for weight, bias, out in
              zip(weights, biases or weights, outs)]
    padded += [(weights[0], weights[0], outs[0], 0)] * (MAX_WEIGHTS - len(weights))  # no rows: never read
    members = [value for member in padded for value in member]
    blocks = sum(-(-weight.shape[0] // options.block_rows) for weight in weights)
    block_cols = min(options.block_cols, max(16, 1 << (cols - 1).bit_length()))
    from elastic_attention.kernels import grouped_gemv_kernel as kernels

    if inputs == 1:
        kernels.grouped_gemv_kernel[(blocks,)](
            flat, *members, COLS=cols, HAS_BIAS=bool(biases), BLOCK_N=options.block_rows, BLOCK_K=block_cols,
            num_warps=options.num_warps, num_stages=options.num_stages)
    else:
        kernels.grouped_rows_kernel[(blocks,)](
            flat, inputs, *members, COLS=cols, HAS_BIAS=bool(biases), BLOCK_M=max(16, 1 << (inputs - 1).bit_length()),
            BLOCK_N=options.block_rows, BLOCK_K=block_cols, IEEE=x.dtype == torch.float32,
            num_warps=options.num_warps, num_stages=options.num_stages)
    return [out.view(*x.shape[:-1], out.shape[-1]) for out in outs]


def _check(x: torch.Tensor, weights: list[torch.Tensor], biases: list[torch.Tensor] | None,
           options: GemvOptions | None) -> None:
    if not 1 <= len(weights) <= MAX_WEIGHTS:
        raise InputError(f"grouped_linear takes 1 to {MAX_WEIGHTS} weights, got {len(weights)}")
    if x.ndim == 0 or x.shape[-1] == 0 or not 1 <= x.numel() // x.shape[-1] <= MAX_INPUT_ROWS:
        raise InputError(f"grouped_linear takes 1 to {MAX_INPUT_ROWS} rows of input, got x {tuple(x.shape)}; use "
                         "torch.nn.functional.linear for more")
    if options is not None and x.numel() > x.shape[-1] and min(options.block_rows, options.block_cols) < 16:
        raise InputError(f"more than one row of input needs block_rows and block_cols of at least 16 (tensor-core "
                         f"tiles), got {options}")
    for index, weight in enumerate(weights):
        if weight.ndim != 2 or weight.shape[1] != x.shape[-1] or not weight.is_contiguous():
            raise InputError(f"weight {index} {tuple(weight.shape)} must be contiguous [N, {x.shape[-1]}] "
                             f"for x {tuple(x.shape)}")
        if weight.dtype != x.dtype or weight.device != x.device:
            raise InputError(f"weight {index} is {weight.dtype} on {weight.device}, x is {x.dtype} on {x.device}")
    if biases and (len(biases) != len(weights) or any(
            bias.shape != (weight.shape[0],) or bias.dtype != x.dtype or not bias.is_contiguous()
            for weight, bias in zip(weights, biases))):
        raise InputError("biases must be None or one contiguous [N_i] tensor of x's dtype per weight")


@torch.library.custom_op("elastic_attention::grouped_linear", mutates_args=())
def grouped_linear_op(x: torch.Tensor, weights: list[torch.Tensor], biases: list[torch.Tensor]) -> list[torch.Tensor]:
    """`grouped_linear` as an operator (``biases`` empty for none), with the default options."""
    return grouped_linear(x, weights, biases or None)


@grouped_linear_op.register_fake
def _(x, weights, biases):
    return [x.new_empty(*x.shape[:-1], weight.shape[0]) for weight in weights]
