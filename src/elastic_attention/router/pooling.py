"""Boundary pooling: the mean of a prompt's first and last tokens, per sequence."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from elastic_attention.errors import InputError
from elastic_attention.patterns import SequenceLayout


def boundary_pool(
    keys: torch.Tensor,
    layout: SequenceLayout,
    first: int,
    last: int,
    prompt_lengths: Sequence[int] | None = None,
) -> torch.Tensor:
    """Mean over the first ``first`` and last ``last`` tokens of each sequence's prompt, each token counted once.

    A prompt shorter than ``first + last`` pools every token it has.

    Args:
        keys: [B, S, Hkv, D] key states of the prefill (pre-RoPE).
        layout: the sequences of the prefill (one per row when padded, several when packed).
        first: leading tokens pooled.
        last: trailing tokens pooled.
        prompt_lengths: per sequence, how many of its leading tokens are the prompt (a training sample's answer
            follows it and must not be seen by the router); ``None``: every token is prompt.

    Returns:
        [N, Hkv, D] in float32, one vector per sequence and KV head.

    Raises:
        InputError: ``prompt_lengths`` does not give one length in ``[1, sequence length]`` per sequence.
    """
    spans = layout.spans()
    if prompt_lengths is not None and (
        len(prompt_lengths) != len(spans)
        or any(not 1 <= prompt <= span.key_len for prompt, span in zip(prompt_lengths, spans))
    ):
        raise InputError(
            f"prompt_lengths must give one length in [1, sequence length] for each of the {len(spans)} sequences "
            f"(lengths {[span.key_len for span in spans]}), got {list(prompt_lengths)}"
        )
    pooled = []
    for index, span in enumerate(spans):
        length = span.key_len if prompt_lengths is None else prompt_lengths[index]
        tokens = keys[span.row, span.key_start : span.key_start + length]
        if length > first + last:  # slice before the float32 copy: only first + last tokens are converted
            tokens = torch.cat([tokens[:first], tokens[length - last :]])
        pooled.append(tokens.float().mean(dim=0))
    return torch.stack(pooled)
