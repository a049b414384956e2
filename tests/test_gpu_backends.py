"""GPU checks of the fast backends and of GPU table construction against the reference (device: pytest -m gpu)."""

import pytest
import torch

from elastic_attention import ElasticConfig
from elastic_attention.backends import ReferenceBackend, get_backend
from elastic_attention.backends.fa4 import fa4_available
from elastic_attention.patterns import MODE_CODES, SequenceLayout, attended_pairs, build_block_tables

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

needs_fa4 = pytest.mark.skipif(not fa4_available()[0], reason=f"fa4: {fa4_available()[1]}")
BACKENDS = ["flex", pytest.param("fa4", marks=needs_fa4)]


def random_states(batch, kv_heads, group, width, head_dim, seed):
    generator = torch.Generator("cuda").manual_seed(seed)
    shape = (batch, kv_heads, width, head_dim)
    query = torch.randn(batch, kv_heads * group, width, head_dim, device="cuda", generator=generator)
    key = torch.randn(shape, device="cuda", generator=generator)
    value = torch.randn(shape, device="cuda", generator=generator)
    return query.bfloat16(), key.bfloat16(), value.bfloat16()


def compare(backend_name, query, key, value, layout, modes, config, softcap=None):
    scale = query.shape[-1] ** -0.5
    tables = build_block_tables(layout, modes, config, query.shape[1], query=query, key=key, scale=scale)
    expected = ReferenceBackend().attend(query, key, value, layout, tables, scale, softcap)
    actual = get_backend(backend_name).attend(query, key, value, layout, tables, scale, softcap)
    torch.testing.assert_close(actual.float(), expected.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_soft_capped_left_padded_batch(backend_name):
    config = ElasticConfig(block_size=128, sink_tokens=128, local_tokens=256)
    mask = torch.ones(2, 1500, dtype=torch.bool, device="cuda")
    mask[0, :377] = False
    query, key, value = random_states(2, 2, 4, 1500, 128, seed=5)
    modes = torch.tensor([[0, 1], [1, 1]], device="cuda")
    compare(backend_name, query * 4, key, value, SequenceLayout.from_padding_mask(mask), modes, config, softcap=8.0)


@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("configuration", ["fa-ssa", "fa-xa", "xa-ssa"])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_left_padded_batch_with_per_sample_routing(backend_name, configuration, group, head_dim):
    config = ElasticConfig(configuration=configuration, block_size=128, sink_tokens=128, local_tokens=256)
    widths = (1000, 3001)
    mask = torch.zeros(2, max(widths), dtype=torch.bool, device="cuda")
    mask[0, max(widths) - widths[0] :] = True
    mask[1, :] = True
    layout = SequenceLayout.from_padding_mask(mask)
    query, key, value = random_states(2, 2, group, max(widths), head_dim, seed=group + head_dim)
    retrieval, sparse = MODE_CODES[config.retrieval_mode], MODE_CODES[config.sparse_mode]
    modes = torch.tensor([[retrieval, sparse], [sparse, retrieval]], device="cuda")
    compare(backend_name, query, key, value, layout, modes, config)


@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("block_size", [64, 128])
@pytest.mark.parametrize("width", [1, 129, 2047, 2048, 4999])
def test_unpadded_and_right_padded_prefill_of_odd_lengths(backend_name, block_size, width):
    config = ElasticConfig(block_size=block_size, sink_tokens=block_size, local_tokens=2 * block_size)
    query, key, value = random_states(1, 8, 4, width, 128, seed=width)
    modes = torch.tensor([[0, 1, 1, 0, 1, 1, 1, 0]], device="cuda")
    compare(backend_name, query, key, value, SequenceLayout.dense(1, width), modes, config)

    query, key, value = random_states(3, 2, 2, width + 5, 64, seed=width + 1)
    mask = torch.ones(3, width + 5, dtype=torch.bool, device="cuda")
    mask[1, width // 2 + 1 :] = False
    mask[2, 3:] = False
    modes = torch.tensor([[0, 1], [1, 1], [1, 0]], device="cuda")
    compare(backend_name, query, key, value, SequenceLayout.from_padding_mask(mask), modes, config)


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_packed_sequences_and_decode_steps(backend_name):
    config = ElasticConfig(block_size=128, sink_tokens=128, local_tokens=256)
    positions = torch.tensor([list(range(700)) + list(range(1301))], device="cuda")
    query, key, value = random_states(1, 2, 4, 2001, 128, seed=3)
    modes = torch.tensor([[0, 1], [1, 0]], device="cuda")
    compare(backend_name, query, key, value, SequenceLayout.from_position_ids(positions), modes, config)

    mask = torch.ones(2, 3333, dtype=torch.bool, device="cuda")
    mask[1, :1000] = False
    decode = SequenceLayout.from_padding_mask(mask, query_len=1)
    query, key, value = random_states(2, 2, 4, 3333, 128, seed=4)
    compare(backend_name, query[:, :, -1:], key, value, decode, modes, config)


@pytest.mark.parametrize("configuration", ["fa-ssa", "fa-xa", "xa-ssa"])
def test_tables_built_on_the_gpu_equal_the_cpu_tables(configuration):
    config = ElasticConfig(configuration=configuration, block_size=64, sink_tokens=64, local_tokens=256)
    mask = torch.ones(2, 3000, dtype=torch.bool)
    mask[0, :777] = False
    layout_cpu = SequenceLayout.from_padding_mask(mask)
    layout_gpu = SequenceLayout.from_padding_mask(mask.cuda())
    query, key, _ = random_states(2, 4, 2, 3000, 64, seed=5)
    query, key = query.float(), key.float()
    retrieval, sparse = MODE_CODES[config.retrieval_mode], MODE_CODES[config.sparse_mode]  # heads on XA need XA
    modes = torch.tensor([[retrieval, sparse, retrieval, sparse], [sparse, sparse, retrieval, sparse]])
    gpu = build_block_tables(layout_gpu, modes.cuda(), config, 8, query=query, key=key)
    cpu = build_block_tables(layout_cpu, modes, config, 8, query=query.cpu(), key=key.cpu())
    assert gpu.kv_block_count.is_cuda
    # The XA estimate may flip a block whose score sits at the threshold between CPU and GPU arithmetic.
    agreement = (gpu.kv_block_index.cpu() == cpu.kv_block_index).float().mean()
    assert agreement > 0.999
    assert torch.equal(attended_pairs(gpu, layout_gpu).cpu(), attended_pairs(cpu, layout_cpu))


def test_auto_picks_fa4_when_it_can_run():
    expected = "fa4" if fa4_available()[0] else "flex"
    assert get_backend("auto").name == expected


@pytest.mark.parametrize("length", [1000, 4099])
def test_xa_scores_of_bf16_states_on_the_gpu_match_float64(length):
    """The estimate's products of bf16 states (bf16 products into float32 results, or TF32 products where torch
    lacks them) against float64 products of the same values."""
    from elastic_attention.patterns.xattention import antidiagonal_block_scores

    query, key, _ = random_states(1, 2, 4, length, 128, seed=length)
    actual = antidiagonal_block_scores(query[0], key[0], block_size=128, stride=16)
    expected = antidiagonal_block_scores(query[0].double().cpu(), key[0].double().cpu(), block_size=128, stride=16)
    assert float((actual.double().cpu() - expected).abs().max()) < 1e-4


@pytest.mark.parametrize("group, width, padding, max_runs",
                         [(1, 1500, "left", 4), (7, 1500, "left", 0), (4, 1536, "right", 4)])
def test_flex_dense_heads_split_equals_one_launch_and_its_gradients_the_reference(group, width, padding, max_runs,
                                                                                  monkeypatch):
    """Mixed routing on a padded batch: flex with its full KV heads through SDPA (one call per run of dense KV heads,
    or gathered into one call with ``max_runs`` 0) equals flex in one launch, and its gradients (what the training
    mix differentiates) equal the reference backend's. The right-padded batch of whole blocks, in a transformers
    model's strided layout, takes the path that reads the caller's tensors without a copy (the CPU test
    `test_whole_block_prefills_use_the_callers_strided_tensors_and_match_the_reference` asserts that no copy is made)."""
    import elastic_attention.backends.flex as flex
    from elastic_attention.backends.flex import FlexBackend

    monkeypatch.setattr(flex, "MAX_DENSE_RUNS", max_runs)

    config = ElasticConfig(block_size=128, sink_tokens=128, local_tokens=256)
    mask = torch.ones(2, width, dtype=torch.bool, device="cuda")
    if padding == "left":
        mask[1, :333] = False
    else:
        mask[1, 1111:] = False
    layout = SequenceLayout.from_padding_mask(mask)
    states = random_states(2, 2, group, width, 64, seed=group)
    if padding == "right":
        states = [state.transpose(1, 2).contiguous().transpose(1, 2) for state in states]
    modes = torch.tensor([[0, 1], [1, 0]], device="cuda")
    scale = 64**-0.5
    tables = build_block_tables(layout, modes, config, 2 * group)
    weights = torch.randn(states[0].shape, device="cuda", dtype=torch.bfloat16)
    outputs, gradients = [], []
    for backend in (FlexBackend(), FlexBackend(dense_heads="flex"), ReferenceBackend()):
        leaves = [state.float().requires_grad_() for state in states]
        output = backend.attend(*leaves, layout, tables, scale)
        (output * weights.float()).sum().backward()
        outputs.append(output.detach())
        gradients.append([leaf.grad for leaf in leaves])
    torch.testing.assert_close(outputs[0], outputs[1], atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(outputs[0], outputs[2], atol=2e-3, rtol=2e-3)
    for actual, expected in zip(gradients[0], gradients[2]):
        torch.testing.assert_close(actual, expected, atol=2e-2, rtol=2e-2)
