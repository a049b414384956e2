"""The attention function registered with transformers' AttentionInterface, and the names it is registered under.

Each attention layer of an attached model calls it with the layer's queries, keys and values; it hands routed layers
to the model's `ElasticRuntime` and runs the model's own attention on sliding-window layers.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from elastic_attention.attached import RUNTIME_ATTRIBUTE
from elastic_attention.errors import InputError

ATTENTION_NAME = "elastic_attention"
#: The same function, for models with sliding-window layers: registered with a mask function that gives those layers
#: the model's own window mask.
WINDOWED_ATTENTION_NAME = "elastic_attention_windowed"


def elastic_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The function registered with transformers' AttentionInterface under ``"elastic_attention"``.

    Padding reaches elastic attention through the decoder pre-hook (the 2D mask), not through ``attention_mask``.

    Returns:
        ([B, S_q, Hq, D], None).
    """
    runtime = getattr(module, RUNTIME_ATTRIBUTE, None)
    if runtime is None:
        raise InputError(
            f"attention implementation {ATTENTION_NAME!r} is set on a model that is not attached; "
            "call elastic_attention.attach(model, config)"
        )
    if dropout and module.training:
        raise InputError(
            f"attention dropout ({dropout}) is not supported by elastic attention; set config.attention_dropout=0"
        )
    if module.layer_idx in runtime.sliding_layers:  # the model's own attention, with the model's mask and cache
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      sliding_window=sliding_window, **kwargs)
    if sliding_window is not None:
        raise InputError(f"sliding-window attention (window {sliding_window}) reached a full-attention layer")
    output = runtime.attention(module, query, key, value, scaling)
    return output.transpose(1, 2).contiguous(), None
