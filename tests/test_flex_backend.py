"""The FlexAttention backend (compiled, also on CPU) against the reference backend."""

import pytest
import torch

from elastic_attention import ElasticConfig, InputError
from elastic_attention.backends import ReferenceBackend
from elastic_attention.backends.flex import FlexBackend
from elastic_attention.patterns import FULL, MODE_CODES, SequenceLayout, build_block_tables

BACKEND = FlexBackend()


def run_both(query, key, value, layout, modes, config, scale=0.125, softcap=None, sinks=None, window_tokens=None):
    tables = build_block_tables(layout, modes, config, query.shape[1], query=query, key=key, scale=scale,
                                window_tokens=window_tokens)
    expected = ReferenceBackend().attend(query, key, value, layout, tables, scale, softcap, sinks)
    actual = BACKEND.attend(query, key, value, layout, tables, scale, softcap, sinks)
    return actual, expected


@pytest.mark.parametrize("configuration", ["fa-ssa", "fa-xa", "xa-ssa"])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_prefill_with_padding_matches_the_reference(configuration, group, head_dim):
    torch.manual_seed(group * head_dim)
    config = ElasticConfig(configuration=configuration, block_size=16, sink_tokens=16, local_tokens=32, xa_stride=4,
                           xa_threshold=0.8)
    kv_heads, width = 2, 77
    mask = torch.zeros(3, width, dtype=torch.bool)
    mask[0] = True
    mask[1, 30:] = True
    mask[2, :41] = True
    layout = SequenceLayout.from_padding_mask(mask)
    query = torch.randn(3, kv_heads * group, width, head_dim)
    key, value = torch.randn(2, 3, kv_heads, width, head_dim)
    retrieval, sparse = MODE_CODES[config.retrieval_mode], MODE_CODES[config.sparse_mode]
    modes = torch.tensor([[retrieval, sparse], [sparse, sparse], [retrieval, retrieval]])
    actual, expected = run_both(query, key, value, layout, modes, config)
    torch.testing.assert_close(actual, expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("group", [1, 4])
def test_soft_capped_padded_prefill_matches_the_reference(group):
    torch.manual_seed(group)
    config = ElasticConfig(block_size=16, sink_tokens=16, local_tokens=32)
    mask = torch.ones(2, 61, dtype=torch.bool)
    mask[1, :23] = False
    layout = SequenceLayout.from_padding_mask(mask)
    query = torch.randn(2, 2 * group, 61, 32) * 4  # scores well past the cap
    key, value = torch.randn(2, 2, 2, 61, 32)
    modes = torch.tensor([[FULL, 1], [1, 1]])
    actual, expected = run_both(query, key, value, layout, modes, config, softcap=1.5)
    torch.testing.assert_close(actual, expected, atol=2e-5, rtol=1e-4)
    plain = run_both(query, key, value, layout, modes, config)[1]
    assert (expected - plain).abs().max() > 0.05


@pytest.mark.parametrize("configuration", ["fa-ssa", "fa-xa"])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("window", [19, 40])
def test_a_model_window_on_a_padded_batch_and_a_decode_step_matches_the_reference(configuration, group, window):
    torch.manual_seed(group + window)
    config = ElasticConfig(configuration=configuration, block_size=16, sink_tokens=16, local_tokens=32, xa_stride=4,
                           xa_threshold=0.8)
    mask = torch.ones(2, 93, dtype=torch.bool)
    mask[1, :23] = False
    query = torch.randn(2, 2 * group, 93, 32)
    key, value = torch.randn(2, 2, 2, 93, 32)
    sparse = MODE_CODES[config.sparse_mode]
    modes = torch.tensor([[FULL, sparse], [sparse, FULL]])
    actual, expected = run_both(query, key, value, SequenceLayout.from_padding_mask(mask), modes, config,
                                window_tokens=window)
    torch.testing.assert_close(actual, expected, atol=2e-5, rtol=1e-4)
    decode = SequenceLayout.from_padding_mask(mask, query_len=1)
    actual, expected = run_both(query[:, :, -1:], key, value, decode, modes, config, window_tokens=window)
    torch.testing.assert_close(actual, expected, atol=2e-5, rtol=1e-4)


def test_sinks_on_a_cpu_are_refused_with_the_backend_that_has_them():
    from elastic_attention import BackendUnavailableError

    config = ElasticConfig(block_size=16, sink_tokens=16, local_tokens=32)
    query, key, value = torch.randn(3, 1, 2, 40, 32)
    with pytest.raises(BackendUnavailableError, match="no attention sinks; use backend='reference'"):
        run_both(query, key, value, SequenceLayout.dense(1, 40), torch.tensor([[FULL, 1]]), config,
                 sinks=torch.zeros(2))


def test_packed_sequences_and_a_decode_step_match_the_reference():
    torch.manual_seed(0)
    config = ElasticConfig(block_size=16, sink_tokens=16, local_tokens=16, xa_stride=4)
    layout = SequenceLayout.from_position_ids(torch.tensor([list(range(37)) + list(range(50))]))
    query = torch.randn(1, 4, 87, 32)
    key, value = torch.randn(2, 1, 2, 87, 32)
    modes = torch.tensor([[FULL, 1], [1, FULL]])
    actual, expected = run_both(query, key, value, layout, modes, config)
    torch.testing.assert_close(actual, expected, atol=2e-5, rtol=1e-4)

    mask = torch.ones(2, 61, dtype=torch.bool)
    mask[1, :9] = False
    decode = SequenceLayout.from_padding_mask(mask, query_len=1)
    query = torch.randn(2, 4, 1, 32)
    key, value = torch.randn(2, 2, 2, 61, 32)
    actual, expected = run_both(query, key, value, decode, modes, config)
    torch.testing.assert_close(actual, expected, atol=2e-5, rtol=1e-4)


def test_query_chunks_across_a_block_boundary_are_refused():
    config = ElasticConfig(block_size=16, sink_tokens=16, local_tokens=16, xa_stride=4)
    layout = SequenceLayout.dense(1, 40, query_len=10)  # queries 30..39 cross the block boundary at 32
    query, key = torch.randn(1, 2, 10, 8), torch.randn(1, 2, 40, 8)
    tables = build_block_tables(layout, torch.tensor([[FULL, FULL]]), config, 2)
    with pytest.raises(InputError, match="block boundary"):
        BACKEND.attend(query, key, key, layout, tables, 0.3)


def test_attached_model_gives_the_same_logits_with_flex_and_reference():
    from conftest import tiny_model

    import elastic_attention as ea

    config = ElasticConfig(block_size=16, sink_tokens=16, local_tokens=16, xa_stride=4)
    ids = torch.randint(1, 97, (2, 50))
    mask = torch.ones(2, 50, dtype=torch.long)
    mask[1, :13] = 0
    heads = torch.tensor([[True, False], [False, True]])
    logits = {}
    for backend in ("reference", "flex"):
        model = ea.attach(tiny_model("qwen3"), config, backend=backend)
        ea.force_routing(model, heads)
        with torch.no_grad():
            logits[backend] = model(ids, attention_mask=mask).logits
    torch.testing.assert_close(logits["flex"][0], logits["reference"][0], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(logits["flex"][1, 13:], logits["reference"][1, 13:], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("width, block", [(77, 16), (129, 32), (300, 64)])
def test_full_blocks_are_wholly_visible_and_only_the_diagonal_is_cut(width, block):
    """Brute force on token masks: every block the split passes as full is visible at every (query, key) pair of
    the sequence; the partial block of a row is its diagonal."""
    from elastic_attention.backends.flex import split_diagonal
    from elastic_attention.backends.sequences import fit_tables

    config = ElasticConfig(configuration="fa-xa", block_size=block, sink_tokens=block, local_tokens=2 * block,
                           xa_stride=4)
    mask = torch.ones(2, width, dtype=torch.bool)
    mask[1, : width // 3] = False
    layout = SequenceLayout.from_padding_mask(mask)
    query, key = torch.randn(2, 4, width, 16), torch.randn(2, 2, width, 16)
    modes = torch.tensor([[0, 2], [2, 0]])
    tables = build_block_tables(layout, modes, config, 4, query=query, key=key, scale=0.25)
    blocks = (width - 1) // block + 1
    counts, index = fit_tables(tables, blocks, blocks)
    partial_counts, partial_index, full_counts, full_index = split_diagonal(counts, index, tables.first_query_block)
    for n, span in enumerate(layout.spans()):
        positions = torch.arange(span.key_len)
        for head in range(4):
            for row in range(int(tables.num_rows[n])):
                assert int(partial_counts[n, head, row]) == 1 and int(partial_index[n, head, row, 0]) == row
                queries = positions[row * block : (row + 1) * block]
                for kb in full_index[n, head, row, : int(full_counts[n, head, row])].tolist():
                    keys = positions[kb * block : (kb + 1) * block]
                    assert kb < row and bool((keys[None, :] <= queries[:, None]).all())
                assert int(full_counts[n, head, row]) + 1 == int(counts[n, head, row])


def dense_pairs_by_brute_force(tables, layout):
    """[N, Hq] bool: whether each query head's token mask equals full causal attention over its sequence."""
    from elastic_attention.patterns import block_mask_from_tables

    size = tables.block_size
    result = torch.zeros(tables.kv_block_count.shape[:2], dtype=torch.bool)
    for n, span in enumerate(layout.spans()):
        if span.query_count == 0:
            continue
        blocks = (span.key_len - 1) // size + 1
        block_mask = block_mask_from_tables(tables, n, blocks)
        positions = torch.arange(span.key_len)
        tokens = block_mask[:, positions // size][:, :, positions // size]  # [Hq, L, L]
        causal = positions[None, :] <= positions[:, None]
        result[n] = (tokens & causal).eq(causal).all(dim=(1, 2))
    return result


@pytest.mark.parametrize("group, head_dim, max_runs", [(1, 64, 4), (4, 64, 4), (1, 128, 4), (4, 128, 4), (4, 64, 0)])
def test_dense_heads_through_sdpa_match_the_reference_and_the_one_launch(group, head_dim, max_runs, monkeypatch):
    """Padded and packed prefills with mixed routings: the split (dense pairs by SDPA, one call per run of
    consecutive dense KV heads or, past ``MAX_DENSE_RUNS`` runs, one gathered call; the rest by flex with no block
    for the dense heads) equals the reference and the single flex launch, and takes exactly the pairs whose token
    mask is full causal attention (brute force)."""
    import elastic_attention.backends.flex as flex

    monkeypatch.setattr(flex, "MAX_DENSE_RUNS", max_runs)

    torch.manual_seed(group + head_dim)
    config = ElasticConfig(block_size=16, sink_tokens=16, local_tokens=16)
    kv_heads = 3
    mask = torch.ones(3, 83, dtype=torch.bool)
    mask[1, :29] = False
    mask[2, 70:] = False
    packed = SequenceLayout.from_position_ids(torch.tensor([list(range(37)) + list(range(46))]))
    modes = torch.tensor([[FULL, 1, FULL], [1, 1, FULL], [FULL, FULL, 1]])
    one_launch = FlexBackend(dense_heads="flex")
    chosen = []
    original = flex._dense_kv_heads
    monkeypatch.setattr(flex, "_dense_kv_heads", lambda *args: chosen.append(original(*args)) or chosen[-1])
    for layout, batch, sequence_modes in ((SequenceLayout.from_padding_mask(mask), 3, modes),
                                          (packed, 1, modes[:2])):
        query = torch.randn(batch, kv_heads * group, 83, head_dim)
        key, value = torch.randn(2, batch, kv_heads, 83, head_dim)
        tables = build_block_tables(layout, sequence_modes, config, query.shape[1])
        actual = BACKEND.attend(query, key, value, layout, tables, 0.125)
        expected = ReferenceBackend().attend(query, key, value, layout, tables, 0.125)
        torch.testing.assert_close(actual, expected, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(actual, one_launch.attend(query, key, value, layout, tables, 0.125),
                                   atol=2e-5, rtol=1e-4)
        brute = dense_pairs_by_brute_force(tables, layout).unflatten(1, (kv_heads, group)).all(-1)
        assert torch.equal(chosen[-1], brute) and bool(brute.any()) and not bool(brute.all())


def test_all_dense_heads_skip_flex_and_odd_lengths_match_the_reference(monkeypatch):
    torch.manual_seed(5)
    config = ElasticConfig(block_size=16, sink_tokens=16, local_tokens=16)
    backend = FlexBackend()
    monkeypatch.setattr(backend, "_flex", lambda *args, **kwargs: pytest.fail("flex ran for dense heads only"))
    for width in (1, 17, 127, 129):
        layout = SequenceLayout.dense(2, width)
        query = torch.randn(2, 8, width, 32)
        key, value = torch.randn(2, 2, 2, width, 32)
        tables = build_block_tables(layout, torch.full((2, 2), FULL), config, 8)
        expected = ReferenceBackend().attend(query, key, value, layout, tables, 0.2)
        torch.testing.assert_close(backend.attend(query, key, value, layout, tables, 0.2), expected,
                                   atol=2e-5, rtol=1e-4)


def test_gradients_of_dense_heads_equal_the_reference():
    """The training mix differentiates its all-full output, which runs through SDPA alone: its gradients to query,
    key and value equal the reference backend's (the mixed split's gradients need flex's backward, which has no CPU
    kernel: `tests/test_gpu_backends.py`)."""
    torch.manual_seed(7)
    config = ElasticConfig(block_size=16, sink_tokens=16, local_tokens=16)
    mask = torch.ones(2, 61, dtype=torch.bool)
    mask[1, :11] = False
    layout = SequenceLayout.from_padding_mask(mask)
    tables = build_block_tables(layout, torch.full((2, 2), FULL), config, 4)
    states = [torch.randn(2, 4, 61, 32), *torch.randn(2, 2, 2, 61, 32)]
    weights = torch.randn(2, 4, 61, 32)
    gradients = []
    for backend in (BACKEND, ReferenceBackend()):
        leaves = [state.clone().requires_grad_() for state in states]
        (backend.attend(*leaves, layout, tables, 0.2) * weights).sum().backward()
        gradients.append([leaf.grad for leaf in leaves])
    for actual, expected in zip(*gradients):
        torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-4)


def test_dense_heads_argument_is_checked():
    with pytest.raises(InputError, match="dense_heads"):
        FlexBackend(dense_heads="cudnn")


@pytest.mark.parametrize("group, head_dim", [(1, 32), (4, 64)])
def test_whole_block_prefills_use_the_callers_strided_tensors_and_match_the_reference(group, head_dim, monkeypatch):
    """Unpadded and right-padded batches of whole blocks, states laid out as a transformers model makes them
    ([B, S, H, D] transposed to [B, H, S, D]): flex reads them without a copy, leaves them unchanged, and equals the
    reference with mixed, dense-only and sparse-only routings."""
    import elastic_attention.backends.flex as flex
    from elastic_attention.backends.sequences import AlignedSequences

    torch.manual_seed(group * head_dim)
    config = ElasticConfig(block_size=16, sink_tokens=16, local_tokens=16)
    kv_heads, width = 3, 96
    copied = []
    gather = AlignedSequences.gather.__func__
    monkeypatch.setattr(flex.AlignedSequences, "gather",
                        classmethod(lambda cls, *a, **k: copied.append(gather(cls, *a, **k)) or copied[-1]))
    right_padded = torch.ones(2, width, dtype=torch.bool)
    right_padded[1, 53:] = False
    for layout in (SequenceLayout.dense(2, width), SequenceLayout.from_padding_mask(right_padded)):
        query = torch.randn(2, width, kv_heads * group, head_dim).transpose(1, 2)
        key, value = torch.randn(2, 2, width, kv_heads, head_dim).transpose(2, 3)
        before = [state.clone() for state in (query, key, value)]
        for modes in ([[FULL, 1, FULL], [1, 1, FULL]], [[FULL] * 3] * 2, [[1] * 3] * 2):
            actual, expected = run_both(query, key, value, layout, torch.tensor(modes), config)
            assert not copied[-1].copied
            torch.testing.assert_close(actual, expected, atol=2e-5, rtol=1e-4)
        assert all(torch.equal(state, kept) for state, kept in zip((query, key, value), before))
