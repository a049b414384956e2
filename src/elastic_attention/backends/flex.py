"""FlexAttention backend: one flex_attention launch per layer, its BlockMask built from the block tables, and the
KV heads on full causal attention through SDPA.

Each sequence is gathered into its own batch row of a left-aligned buffer (logical position p at index p - offset),
so the kernel's block grid is the sequences' logical block grid whatever the padding or packing; a prefill batch
that already has that shape in whole blocks (one sequence per row from index 0, right padding at most) is used as it
is, strided or not, and the output is written in place where no gradient flows. The BlockMask comes
from the tables with `BlockMask.from_kv_blocks` (no per-position mask is materialized). Only the diagonal block of
a query block is cut (causality, and the sequence end, which falls in the last query block's diagonal); every other
attended block lies wholly before the queries and is passed as a full block, so the kernel evaluates no mask there
(`split_diagonal`). With a model window on every layer the blocks its edge cuts are partial too
(`split_window_edges`). Query rows past a sequence's end compute over full blocks and are dropped.

At a prefill from the first token, the (sequence, KV head) pairs whose tables are exactly full causal attention run
through causal SDPA (`dense_heads="sdpa"`, the default; on Hopper-or-newer GPUs cuDNN first; one call per run of
consecutive dense KV heads, on views, or one gathered call past `MAX_DENSE_RUNS` runs): torch's dense
kernels do the same work in less time than flex (docs/how-it-works.md, "Numbers behind the defaults"). Flex then
computes the other heads only (the dense heads' rows get no block). `dense_heads="flex"`
keeps every head in the one flex launch.

Queries of a sequence must start on a block boundary (prefill) or lie inside one block (a decode step).
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

from elastic_attention.backends.sequences import AlignedSequences, fit_tables
from elastic_attention.errors import BackendUnavailableError, InputError
from elastic_attention.patterns import BlockTables, SequenceLayout


_RECOMPILE_LIMIT = 64
#: On the CPU, smaller head dims are zero-padded to this many before the kernel (see `FlexBackend.attend`).
CPU_MIN_HEAD_DIM = 32

# Kernel options measured fastest per (GPU major version, head_dim, block size) for bf16 prefill; shapes not listed
# take torch's defaults. Tiles must divide the block (torch's default tile is 128 for large head dims).
# `studies/kernel_tuning/flex_kernel_sweep.py` measures candidates; the winners go here, the run that chose them in
# docs/how-it-works.md (Numbers behind the defaults).
KERNEL_OPTIONS: dict[tuple[int, int, int], dict] = {
    # Compute capability 9 (Hopper), head_dim 128, block 128: less time than torch's default (BLOCK_N 64, 3 stages,
    # no TMA) over 32K and 128K at MSR 0.5. Forward only (``fwd_``): the backward kernel keeps torch's choice, which
    # the sweep did not measure.
    (9, 128, 128): {"fwd_BLOCK_M": 128, "fwd_BLOCK_N": 128, "fwd_num_stages": 2, "fwd_num_warps": 8,
                    "fwd_USE_TMA": True},
}


def kernel_options_for(device: torch.device, head_dim: int, block_size: int) -> dict | None:
    """The kernel options flex_attention gets for this GPU, head_dim and block size (None: torch's defaults)."""
    if device.type != "cuda":
        return None
    major = torch.cuda.get_device_capability(device)[0]
    options = KERNEL_OPTIONS.get((major, head_dim, block_size))
    if options is not None:
        return dict(options)
    return {"BLOCK_M": block_size, "BLOCK_N": block_size} if block_size < 128 else None


def flex_available() -> tuple[bool, str]:
    """Whether FlexAttention can run here, and why not."""
    try:
        from torch.nn.attention.flex_attention import BlockMask, flex_attention  # noqa: F401
    except ImportError as error:
        return False, f"torch {torch.__version__} has no FlexAttention ({error}); it needs torch >= 2.6"
    return True, ""


class FlexBackend:
    """Hybrid attention through torch's compiled FlexAttention.

    Always compiled: besides being the fast path, it is the correct one; eager flex_attention (seen with torch 2.13 on
    CPU) gives wrong results for query blocks whose key-block list has a gap, which SSA rows have.
    """

    name = "flex"
    supports_softcap = True
    #: No attention sinks: they would rescale the output by its log-sum-exp, which torch's CPU flex does not return,
    #: so that GPU-only path could not be tested here.
    supports_sinks = False

    def __init__(self, kernel_options: dict | None = None, dense_heads: str = "sdpa") -> None:
        """Args:
            kernel_options: flex_attention ``kernel_options`` for every call, instead of those `kernel_options_for`
                picks per GPU, head_dim and block size (for tuning; see `studies/kernel_tuning/flex_kernel_sweep.py`).
            dense_heads: ``"sdpa"``: at a prefill from the first token, KV heads whose tables are full causal
                attention run through one causal SDPA call and flex computes the rest; ``"flex"``: every head in
                the flex launch.

        Raises:
            BackendUnavailableError: torch has no FlexAttention.
            InputError: ``dense_heads`` is neither ``"sdpa"`` nor ``"flex"``.
        """
        available, reason = flex_available()
        if not available:
            raise BackendUnavailableError(f"backend 'flex' cannot run: {reason}")
        if dense_heads not in ("sdpa", "flex"):
            raise InputError(f"`dense_heads` must be 'sdpa' or 'flex', got {dense_heads!r}")
        self.dense_heads = dense_heads
        from torch.nn.attention.flex_attention import flex_attention

        # Past the recompile limit dynamo runs flex_attention eagerly, which is wrong for SSA rows (above): leave
        # room for the shapes of several models and head layouts in one process.
        dynamo_config = torch._dynamo.config
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(dynamo_config, name):
                setattr(dynamo_config, name, max(getattr(dynamo_config, name), _RECOMPILE_LIMIT))
        self._flex = torch.compile(flex_attention, dynamic=True)
        self._kernel_options = kernel_options

    def attend(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        layout: SequenceLayout,
        tables: BlockTables,
        scale: float,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        from torch.nn.attention.flex_attention import BlockMask

        size = tables.block_size
        spans = layout.spans()
        offsets = [first for first, _ in layout.query_positions()]
        for offset, span in zip(offsets, spans):
            if span.query_count and offset % size and (offset // size) != (span.key_len - 1) // size:
                raise InputError(
                    f"the flex backend needs query chunks that start on a block boundary or fit in one block; "
                    f"got queries {offset}..{span.key_len - 1} with block size {size}"
                )
        # The caller's tensors serve as they are where they already form whole blocks (no copy; strided is fine).
        whole_blocks = query.shape[2] % size == 0 and key.shape[2] % size == 0
        aligned = AlignedSequences.gather(query, key, value, layout, size, allow_views=whole_blocks)
        device = query.device
        lengths = torch.tensor(aligned.lengths, device=device)
        query_offsets = torch.tensor(aligned.query_offsets, device=device)

        window = tables.window_tokens
        # A tensor, like the lengths: a Python int here made torch's CPU flex template fail to compile (torch 2.13).
        window_size = None if window is None else torch.tensor(window, device=device)

        def causal_within_sequence(batch, head, query_index, key_index):
            position = query_index + query_offsets[batch]
            return (key_index <= position) & (position < lengths[batch])

        def causal_within_window(batch, head, query_index, key_index):
            position = query_index + query_offsets[batch]
            return (key_index <= position) & (key_index > position - window_size) & (position < lengths[batch])

        padded_queries, padded_keys = aligned.query.shape[2], aligned.key.shape[2]
        counts, index = fit_tables(tables, padded_queries // size, padded_keys // size)
        counts = counts.to(device)
        dense = dense_parts = None
        if self.dense_heads == "sdpa" and window is None and softcap is None and sinks is None:
            dense = _dense_kv_heads(counts, tables, aligned, key.shape[1])
        if dense is not None and bool(dense.any()):
            # Launched before the flex call is prepared: the GPU runs it while the host builds the block mask.
            dense_parts = _dense_attention(aligned, dense, scale)
            if bool(dense.all()):
                return aligned.scatter(dense_parts[0][1], query)
            group = query.shape[1] // key.shape[1]
            counts = counts.masked_fill(dense.repeat_interleave(group, dim=1)[:, :, None].to(device), 0)
        if window is None:
            split = split_diagonal(counts, index.to(device), tables.first_query_block.to(device))
        else:
            split = split_window_edges(counts, index.to(device), tables.first_query_block.to(device), size, window)
        block_mask = BlockMask.from_kv_blocks(
            *split, BLOCK_SIZE=size, mask_mod=causal_within_sequence if window is None else causal_within_window,
            seq_lengths=(padded_queries, padded_keys), **_without_backward_tables(query, key, value),
        )
        options = self._kernel_options
        if options is None:
            options = kernel_options_for(device, query.shape[-1], size)
        score_mod = None if softcap is None else _softcap_score_mod(torch.tensor(float(softcap), device=device))
        arguments = dict(score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=True,
                         kernel_options=options)
        if sinks is not None:
            raise BackendUnavailableError("the flex backend has no attention sinks; use backend='reference'")
        states = (aligned.query, aligned.key, aligned.value)
        head_dim = query.shape[-1]
        if device.type == "cpu" and head_dim < CPU_MIN_HEAD_DIM:
            # torch's CPU flex kernel (2.13, seen on an AMD EPYC without AVX-512) returns wrong values for head_dim
            # 8 and 16 with blocks of 8 mod 16 tokens; zero columns change no score (the scale is explicit) and
            # add output columns that are dropped.
            states = tuple(F.pad(state, (0, CPU_MIN_HEAD_DIM - head_dim)) for state in states)
        attended = self._flex(*states, **arguments)[..., :head_dim]
        if dense_parts is not None:
            attended = _with_dense_heads(attended, dense_parts)
        return aligned.scatter(attended, query)


def _dense_kv_heads(counts: torch.Tensor, tables: BlockTables, aligned: AlignedSequences,
                    num_kv_heads: int) -> torch.Tensor | None:
    """Which (sequence, KV head) pairs attend full causal attention in every row: [N, Hkv] bool on the host, or
    None where SDPA cannot stand in for them (queries that do not start at each sequence's first token).

    Args:
        counts: [N, Hq, R] attended key blocks per row of the kernel grid (rows past a sequence's queries: 0).
    """
    if any(aligned.query_offsets) or aligned.query.shape[2] != aligned.key.shape[2]:
        return None
    rows = torch.arange(counts.shape[2], device=counts.device)
    first = tables.first_query_block.to(counts.device)[:, None, None]
    live = rows[None, None, :] < tables.num_rows.to(counts.device)[:, None, None]
    full = ((counts == first + rows + 1) | ~live).all(dim=-1)  # [N, Hq]
    has_queries = torch.tensor([count > 0 for count in aligned.query_counts], device=counts.device)
    full &= has_queries[:, None]
    return full.unflatten(1, (num_kv_heads, -1)).all(dim=-1).cpu()


#: Up to this many runs of consecutive dense KV heads get one SDPA call each, on views of the caller's heads; more
#: are gathered into one call. Gathering the dense pairs and writing them back costs a tenth of a split layer's
#: kernel time, which views save; but many runs (a large batch routed head by head) would add a launch each, so past
#: this count one gathered call serves.
MAX_DENSE_RUNS = 4


def _dense_attention(aligned: AlignedSequences, dense: torch.Tensor, scale: float) -> list[tuple[tuple, torch.Tensor]]:
    """Causal SDPA over the ``dense`` [N, Hkv] (sequence, KV head) pairs of the aligned states.

    Returns:
        (index, output) parts: ``attended[index] = output`` puts the pairs' query heads into an [N, Hq, S, D]
        output. When every pair is dense, one part whose output is all of it.
    """
    query, key, value = aligned.query, aligned.key, aligned.value
    if bool(dense.all()):
        return [((slice(None),), _causal_sdpa(query, key, value, scale))]
    group = query.shape[1] // key.shape[1]
    runs = _dense_head_runs(dense)
    if len(runs) <= MAX_DENSE_RUNS:
        parts = []
        for sequence, first, end in runs:
            heads = (slice(sequence, sequence + 1), slice(first * group, end * group))
            kv_heads = (slice(sequence, sequence + 1), slice(first, end))
            parts.append((heads, _causal_sdpa(query[heads], key[kv_heads], value[kv_heads], scale)))
        return parts
    sequences, kv_heads = dense.nonzero(as_tuple=True)
    sequences, kv_heads = sequences.to(query.device), kv_heads.to(query.device)
    output = _causal_sdpa(query.unflatten(1, (key.shape[1], group))[sequences, kv_heads],
                          key[sequences, kv_heads][:, None], value[sequences, kv_heads][:, None], scale)
    query_heads = (kv_heads[:, None] * group + torch.arange(group, device=query.device)).flatten()
    return [((sequences.repeat_interleave(group), query_heads), output.flatten(0, 1))]


def _causal_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal SDPA through the fastest dense kernel here (`_dense_kernels`), grouped query heads allowed."""
    with _dense_kernels(query.device):
        return F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scale,
                                              enable_gqa=key.shape[1] != query.shape[1])


def _dense_head_runs(dense: torch.Tensor) -> list[tuple[int, int, int]]:
    """(sequence, first KV head, KV head after the last) of each run of consecutive True entries of ``dense``
    [N, Hkv], in row-major order."""
    runs = []
    for sequence, row in enumerate(dense.tolist()):
        first = None
        for head, is_dense in enumerate([*row, False]):
            if is_dense and first is None:
                first = head
            elif not is_dense and first is not None:
                runs.append((sequence, first, head))
                first = None
    return runs


def _with_dense_heads(attended: torch.Tensor, parts: list[tuple[tuple, torch.Tensor]]) -> torch.Tensor:
    """The flex output [N, Hq, S, D] with the dense heads' outputs (`_dense_attention`'s parts) written over their
    heads: in place when no gradient flows, else into a copy (gradients reach both)."""
    if attended.requires_grad:
        attended = attended.clone()
    for index, output in parts:
        attended[index] = output.to(attended.dtype)
    return attended


def _without_backward_tables(*states: torch.Tensor) -> dict:
    """``BlockMask.from_kv_blocks`` arguments that skip the query-block tables only a backward pass reads (a sort
    over every table) when no gradient flows through ``states`` and this torch can skip them."""
    from torch.nn.attention.flex_attention import BlockMask

    if torch.is_grad_enabled() and any(state.requires_grad for state in states):
        return {}
    if "compute_q_blocks" not in inspect.signature(BlockMask.from_kv_blocks).parameters:
        return {}
    return {"compute_q_blocks": False}


def _dense_kernels(device: torch.device):
    """SDPA's kernels for the dense heads, fastest first: on GPUs of compute capability 9 or more cuDNN leads
    (docs/how-it-works.md, "Numbers behind the defaults"); elsewhere torch's own order."""
    from contextlib import nullcontext

    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] < 9:
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    order = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
             SDPBackend.MATH]
    try:
        return sdpa_kernel(order, set_priority=True)
    except TypeError:  # torch without priorities: the same backends in torch's order
        return sdpa_kernel(order)


def _softcap_score_mod(cap: torch.Tensor):
    """A flex score_mod that soft-caps the scaled scores: c * tanh(score / c), c a 0-d tensor."""
    def softcapped(score, batch, head, query_index, key_index):
        return cap * torch.tanh(score / cap)

    return softcapped


def split_diagonal(counts: torch.Tensor, index: torch.Tensor, first_query_block: torch.Tensor):
    """Split attended key blocks into the partial diagonal block and the full blocks before it.

    Args:
        counts: [N, H, R] int, attended key blocks per query block row.
        index: [N, H, R, K] int, their indices in ascending order (entries past the count are ignored).
        first_query_block: [N] int, logical block of row 0 of each sequence.

    Returns:
        (partial_counts [N, H, R], partial_index [N, H, R, K], full_counts [N, H, R], full_index [N, H, R, K]):
        the diagonal block (logical query block ``first_query_block + r``) where attended, and the other attended
        blocks, all before it (the patterns are causal at block level, so the diagonal is the last attended block).
    """
    rows = torch.arange(counts.shape[2], device=counts.device)
    diagonal = first_query_block.to(counts.device)[:, None, None] + rows[None, None, :]
    last = index.gather(-1, (counts.long() - 1).clamp(min=0)[..., None])[..., 0]
    has_diagonal = (counts > 0) & (last == diagonal)
    partial_counts = has_diagonal.to(counts.dtype)
    partial_index = torch.zeros_like(index)  # flex wants every index table as wide as the key blocks
    partial_index[..., 0] = torch.where(has_diagonal, last, 0)
    return partial_counts, partial_index, (counts - partial_counts).contiguous(), index


def split_window_edges(counts: torch.Tensor, index: torch.Tensor, first_query_block: torch.Tensor, block_size: int,
                       window_tokens: int):
    """`split_diagonal` under a model window of ``window_tokens``: a block is full only if it lies before the
    diagonal and inside the window for every query of its row; the diagonal and the blocks the window's edge cuts
    are partial (their mask is evaluated).

    Returns:
        (partial_counts, partial_index, full_counts, full_index), shaped as `split_diagonal`'s, each list in
        ascending block order.
    """
    rows = torch.arange(counts.shape[2], device=counts.device)
    row_block = (first_query_block.to(counts.device)[:, None, None] + rows[None, None, :])[..., None]
    blocks = index.long()
    attended = torch.arange(index.shape[-1], device=index.device) < counts[..., None]
    last_query = row_block * block_size + block_size - 1
    partial = attended & ((blocks == row_block) | (last_query - blocks * block_size >= window_tokens))
    full = attended & ~partial

    def packed(chosen: torch.Tensor):
        order = torch.argsort((~chosen).to(torch.int8), dim=-1, stable=True)  # chosen entries first, in order
        return chosen.sum(-1).to(counts.dtype), torch.where(chosen, index, 0).gather(-1, order).contiguous()

    return (*packed(partial), *packed(full))
