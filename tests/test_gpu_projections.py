"""The grouped decode projections' kernels (1 to 16 rows of input) on the GPU against a float64 product, on odd
shapes (device: pytest -m gpu; on the CPU through Triton's interpreter: `interpreted_fused_decode.py`)."""

import pytest
import torch

from elastic_attention.kernels.grouped_gemv import GemvOptions, grouped_linear, grouped_linear_op

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

#: (input size, rows of each weight, bias): one to three weights, sizes off every block.
SHAPES = [(4096, [4096, 1024, 1024], False), (896, [896, 128, 128], True), (4864, [896], False),
          (1000, [37], True), (33, [5, 70], False), (14336, [4096], False)]


@pytest.mark.parametrize("cols, rows, bias", SHAPES)
@pytest.mark.parametrize("dtype, tolerance", [(torch.bfloat16, 1e-2), (torch.float16, 2e-3), (torch.float32, 1e-5)])
@pytest.mark.parametrize("options", [None, GemvOptions(block_rows=16, block_cols=256, num_warps=8, num_stages=1)])
@pytest.mark.parametrize("inputs", [1, 3, 8, 16])
def test_grouped_linear_matches_float64(inputs, cols, rows, bias, dtype, tolerance, options):
    generator = torch.Generator("cuda").manual_seed(cols + len(rows) + inputs)
    x = torch.randn(inputs, 1, cols, device="cuda", generator=generator).to(dtype)
    weights = [(torch.randn(n, cols, device="cuda", generator=generator) * cols**-0.5).to(dtype) for n in rows]
    biases = [torch.randn(n, device="cuda", generator=generator).to(dtype) for n in rows] if bias else None
    outputs = grouped_linear(x, weights, biases, options)
    for index, (output, weight) in enumerate(zip(outputs, weights)):
        expected = x.double() @ weight.double().T + (biases[index].double() if bias else 0)
        assert output.shape == (inputs, 1, weight.shape[0]) and output.dtype == dtype
        assert float((output.double() - expected).abs().max()) <= tolerance * max(1.0, float(expected.abs().max()))


def test_the_operator_is_the_function():
    x = torch.randn(1, 64, device="cuda", dtype=torch.bfloat16)
    weights = [torch.randn(48, 64, device="cuda", dtype=torch.bfloat16)]
    assert torch.equal(grouped_linear_op(x, weights, [])[0], grouped_linear(x, weights)[0])
