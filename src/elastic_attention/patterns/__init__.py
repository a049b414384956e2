"""What each attention mode attends: sequence layouts, block rules, XA selection and block tables. Pure torch."""

from elastic_attention.patterns.block_tables import (
    FULL,
    MODE_CODES,
    SSA,
    XA,
    BlockTableBuilder,
    BlockTables,
    attended_pairs,
    block_mask_from_tables,
    build_block_tables,
    causal_block_mask,
    causal_pairs,
    streaming_block_mask,
    tables_from_block_masks,
    window_block_mask,
)
from elastic_attention.patterns.layout import SequenceLayout, SequenceSpan

__all__ = [
    "FULL",
    "MODE_CODES",
    "SSA",
    "XA",
    "BlockTableBuilder",
    "BlockTables",
    "SequenceLayout",
    "SequenceSpan",
    "attended_pairs",
    "block_mask_from_tables",
    "build_block_tables",
    "causal_block_mask",
    "causal_pairs",
    "streaming_block_mask",
    "tables_from_block_masks",
    "window_block_mask",
]
