"""Linear projections of a decode step at batch 1 (one row of input) as one Triton launch per group of weights that
read the same input.

At batch 1 a decoder layer's projections are matrix-vector products that must read every weight once; their time
is the weights' bytes over the memory bandwidth. cuBLAS runs the small ones (a model's k and v projections) far below
it and splits the long reductions (o and down projections) into partial sums that another kernel adds up
(benchmarks/results/decode_graph_profile_128k_2026-12-01.log). `grouped_linear` computes the projections that read
one input (q, k and v; gate and up) in one launch, each program over a few whole rows of one weight, so the small
weights ride along with the large one and nothing is reduced after the kernel.

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


@dataclass(frozen=True)
class GemvOptions:
    """How `grouped_linear` launches its kernel. The defaults were the fastest of `scripts/gemv_sweep.py` on the
    H200 for the Llama-3.1-8B shape (benchmarks/results/gemv_sweep.json: "r4_c2048_w4_s3", 106.7 us per layer
    against cuBLAS's 133.1, 0.98 of the copy bandwidth).

    Attributes:
        block_rows: weight rows per program (a power of two).
        block_cols: columns per step of a program's loop over the input (a power of two, at least 16; an input of
            fewer columns takes the next power of two above its size).
        num_warps, num_stages: Triton's launch options.
    """

    block_rows: int = 4
    block_cols: int = 2048
    num_warps: int = 4
    num_stages: int = 3


#: The options `grouped_linear` uses unless given others.
DEFAULT_OPTIONS = GemvOptions()


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
    """``x @ weight.T (+ bias)`` for every weight, in one launch, for one row of input (a decode step at batch 1:
    with more rows cuBLAS reads each weight once for all of them, and this kernel would read it once per row).

    Args:
        x: [..., K] of one row (every leading size 1).
        weights: 1 to `MAX_WEIGHTS` tensors [N_i, K], contiguous, of x's dtype and device.
        biases: None, or one [N_i] per weight.
        options: launch options (None: `DEFAULT_OPTIONS`).

    Returns:
        One [..., N_i] tensor per weight, contiguous, in x's dtype (sums in float32).
    """
    _check(x, weights, biases)
    cols = x.shape[-1]
    flat = x.reshape(cols)
    if flat.stride(0) != 1:
        flat = flat.contiguous()
    options = options or DEFAULT_OPTIONS
    outs = [torch.empty(weight.shape[0], device=x.device, dtype=x.dtype) for weight in weights]
    padded = [(weight, bias, out, weight.shape[0]) for weight, bias, out in
              zip(weights, biases or weights, outs)]
    padded += [(weights[0], weights[0], outs[0], 0)] * (MAX_WEIGHTS - len(weights))  # no rows: never read
    blocks = sum(-(-weight.shape[0] // options.block_rows) for weight in weights)
    from elastic_attention.kernels.grouped_gemv_kernel import grouped_gemv_kernel

    grouped_gemv_kernel[(blocks,)](
        flat, *[value for group in padded for value in group], COLS=cols, HAS_BIAS=bool(biases),
        BLOCK_N=options.block_rows, BLOCK_K=min(options.block_cols, max(16, 1 << (cols - 1).bit_length())),
        num_warps=options.num_warps, num_stages=options.num_stages,
    )
    return [out.view(*x.shape[:-1], out.shape[-1]) for out in outs]


def _check(x: torch.Tensor, weights: list[torch.Tensor], biases: list[torch.Tensor] | None) -> None:
    if not 1 <= len(weights) <= MAX_WEIGHTS:
        raise InputError(f"grouped_linear takes 1 to {MAX_WEIGHTS} weights, got {len(weights)}")
    if x.ndim == 0 or x.numel() != x.shape[-1]:
        raise InputError(f"grouped_linear takes one row of input, got x {tuple(x.shape)}; use "
                         "torch.nn.functional.linear for more")
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
