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
from elastic_attention.errors import InputError, NotAttachedError

ATTENTION_NAME = "elastic_attention"
#: The same function, for models with sliding-window layers: registered with a mask function that gives those layers
#: the model's own window mask.
WINDOWED_ATTENTION_NAME = "elastic_attention_windowed"


@torch.compiler.disable  # a compiled decoder layer (compile_decode) calls it as it is, without tracing into it
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
    s_aux: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The function registered with transformers' AttentionInterface under ``"elastic_attention"``.

    Padding reaches elastic attention through the decoder pre-hook (the 2D mask), not through ``attention_mask``.
    ``softcap`` (Gemma 2's attention modules pass it) must be the soft-cap the model was attached with; ``s_aux``
    (gpt-oss) is the layer's [Hq] attention-sink logits.

    Returns:
        ([B, S_q, Hq, D], None).
    """
    runtime = getattr(module, RUNTIME_ATTRIBUTE, None)
    if runtime is None:
        raise NotAttachedError(
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
    if (s_aux is not None) != runtime.has_sinks:
        raise InputError(
            f"layer {module.layer_idx} {'passes' if s_aux is not None else 'does not pass'} attention sinks (s_aux), "
            f"but its family row in elastic_attention.integration.families has attention_sinks={runtime.has_sinks}; "
            "correct the row"
        )
    if module.layer_idx in runtime.sliding_layers:  # the model's own attention, with the model's mask and cache
        if softcap is not None or s_aux is not None:  # SDPA has neither
            return eager_attention(query, key, value, attention_mask, scaling, softcap, s_aux), None
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      sliding_window=sliding_window, **kwargs)
    if sliding_window is not None and sliding_window != runtime.model_window:
        raise InputError(f"sliding-window attention (window {sliding_window}) reached a full-attention layer")
    output = runtime.attention(module, query, key, value, scaling, s_aux)
    return output.transpose(1, 2).contiguous(), None


def eager_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Eager attention with soft-capped logits (Gemma 2) and attention sinks (gpt-oss), as those models compute it,
    for the layers that keep the model's own attention.

    Args:
        query: [B, Hq, S_q, D]; key, value: [B, Hkv, S_k, D].
        attention_mask: the model's mask for the layer, [B or 1, 1, S_q, >= S_k] bool (True = attend) or additive
            float; None means causal (the last S_q of S_k positions).
        scaling: softmax scale (None: D ** -0.5).
        softcap: None, or the cap c: scores become c * tanh(scores / c) before the mask.
        sinks: None, or [Hq] sink logits: one more logit per head in the softmax's denominator, with no value.

    Returns:
        [B, S_q, Hq, D] in the dtype of ``query``; zero for a query that sees no key (a padding row).
    """
    group = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = torch.matmul(query, key.transpose(2, 3)).float() * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    query_len, key_len = query.shape[2], key.shape[2]
    if attention_mask is None:
        attention_mask = torch.ones(query_len, key_len, dtype=torch.bool, device=query.device).tril(key_len - query_len)
    mask = attention_mask[..., :key_len]
    scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    if sinks is not None:
        column = sinks.float()[None, :, None, None].expand(scores.shape[0], -1, query_len, 1)
        scores = torch.cat([scores, column], dim=-1)
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row that sees no key (padding): 0
    weights = (weights[..., :-1] if sinks is not None else weights).to(query.dtype)
    return torch.matmul(weights, value).transpose(1, 2).contiguous()
