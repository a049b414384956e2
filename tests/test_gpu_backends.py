"""GPU checks of the fast backends against the reference (run on the device machine: pytest -m gpu)."""

import pytest
import torch

from elastic_attention import ElasticConfig
from elastic_attention.backends import ReferenceBackend, get_backend
from elastic_attention.patterns import MODE_CODES, SequenceLayout, build_block_tables

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("backend_name", ["flex"])
@pytest.mark.parametrize("configuration", ["fa-ssa", "fa-xa", "xa-ssa"])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_backend_matches_reference_in_bf16(backend_name, configuration, group, head_dim):
    torch.manual_seed(group + head_dim)
    config = ElasticConfig(configuration=configuration, block_size=128, sink_tokens=128, local_tokens=256)
    widths = (1000, 3001)
    mask = torch.zeros(2, max(widths), dtype=torch.bool)
    mask[0, max(widths) - widths[0] :] = True
    mask[1, :] = True
    layout = SequenceLayout.from_padding_mask(mask)
    kv_heads = 2
    query = torch.randn(2, kv_heads * group, max(widths), head_dim, device="cuda", dtype=torch.bfloat16)
    key, value = torch.randn(2, 2, kv_heads, max(widths), head_dim, device="cuda", dtype=torch.bfloat16)
    retrieval, sparse = MODE_CODES[config.retrieval_mode], MODE_CODES[config.sparse_mode]
    modes = torch.tensor([[retrieval, sparse], [sparse, retrieval]], device="cuda")
    tables = build_block_tables(layout, modes, config, query.shape[1], query=query, key=key, scale=head_dim**-0.5)
    expected = ReferenceBackend().attend(query, key, value, layout, tables, head_dim**-0.5)
    actual = get_backend(backend_name).attend(query, key, value, layout, tables, head_dim**-0.5)
    torch.testing.assert_close(actual.float(), expected.float(), atol=2e-2, rtol=2e-2)
