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
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The function registered with transformers' AttentionInterface under ``"elastic_attention"``.

    Padding reaches elastic attention through the decoder pre-hook (the 2D mask), not through ``attention_mask``.
    ``softcap`` (Gemma 2's attention modules pass it) must be the soft-cap the model was attached with.

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
    if softcap != runtime.softcap:
        raise InputError(
            f"layer {module.layer_idx} soft-caps its attention logits at {softcap}, but the model was attached with "
            f"attn_logit_softcapping={runtime.softcap}; set the config before attach"
        )
    if module.layer_idx in runtime.sliding_layers:  # the model's own attention, with the model's mask and cache
        if softcap is not None:  # SDPA has no soft-cap
            return softcapped_eager_attention(query, key, value, attention_mask, scaling, softcap), None
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      sliding_window=sliding_window, **kwargs)
    if sliding_window is not None:
        raise InputError(f"sliding-window attention (window {sliding_window}) reached a full-attention layer")
    output = runtime.attention(module, query, key, value, scaling)
    return output.transpose(1, 2).contiguous(), None


def softcapped_eager_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None,
    softcap: float,
) -> torch.Tensor:
    """Eager attention with soft-capped logits, as Gemma 2 computes it, for the layers that keep the model's own
    attention.

    Args:
        query: [B, Hq, S_q, D]; key, value: [B, Hkv, S_k, D].
        attention_mask: the model's mask for the layer, [B or 1, 1, S_q, >= S_k] bool (True = attend) or additive
            float; None means causal (the last S_q of S_k positions).
        scaling: softmax scale (None: D ** -0.5).
        softcap: the cap c: scores become c * tanh(scores / c) before the mask.

    Returns:
        [B, S_q, Hq, D] in the dtype of ``query``; zero for a query that sees no key (a padding row).
    """
    group = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = torch.matmul(query, key.transpose(2, 3)).float() * scale
    scores = softcap * torch.tanh(scores / softcap)
    query_len, key_len = query.shape[2], key.shape[2]
    if attention_mask is None:
        attention_mask = torch.ones(query_len, key_len, dtype=torch.bool, device=query.device).tril(key_len - query_len)
    mask = attention_mask[..., :key_len]
    scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0).to(query.dtype)  # a row that sees no key (padding): 0
    return torch.matmul(weights, value).transpose(1, 2).contiguous()
