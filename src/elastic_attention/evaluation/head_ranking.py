"""Retrieval-score head ranking (paper Appendix C) and the static hybrid baseline it defines.

The retrieval score of a (layer, KV head) is the attention mass that the last prompt token puts on the needle
(evidence) tokens, averaged over the query heads of the KV head's group and over needle samples. Keeping the top
heads on full attention for a chosen MSR gives the static hybrid of the DuoAttention / PruLong family. Evidence is
each needle sentence (marker to period) in the synthetic suite, and each row's ``evidence_spans`` (character spans of
its prompt) in the code suite.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from elastic_attention.chat import render_prompt
from elastic_attention.errors import InputError
from elastic_attention.rows import Row, encode_row
from elastic_attention.integration import is_attached
from elastic_attention.integration.families import attention_modules, decoder_of, family_of

PROBE_NAME = "elastic_attention_probe"
_LAST_ROW_ATTRIBUTE = "_elastic_probe_last_row"


def _probe_attention(module: nn.Module, query, key, value, attention_mask, **kwargs):
    """SDPA attention that also records the last query's attention probabilities: [B, Hq, S_kv]."""
    group = query.shape[1] // key.shape[1]
    keys = key.repeat_interleave(group, dim=1).float()
    scale = kwargs.get("scaling") or query.shape[-1] ** -0.5
    scores = torch.einsum("bhd,bhkd->bhk", query[:, :, -1].float(), keys) * scale
    object.__setattr__(module, _LAST_ROW_ATTRIBUTE, torch.softmax(scores, dim=-1))
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


AttentionInterface.register(PROBE_NAME, _probe_attention)


def evidence_positions(tokenizer, row: Row, prompt_ids: list[int]) -> list[int]:
    """Prompt token positions of the row's evidence.

    Code-suite rows carry ``evidence_spans`` (character spans of ``row.prompt``): the positions are the tokens of
    the rendered prompt that overlap a span. Synthetic rows carry ``evidence_offsets``, which point at the first
    token of each needle (``remember k v .``); a needle runs to its period, and the context starts right after the
    instruction, wherever the chat template puts the instruction.
    """
    if "evidence_spans" in row.metadata:
        return _span_positions(tokenizer, row, prompt_ids)
    offsets = row.metadata.get("evidence_offsets")
    if not offsets:
        raise InputError(f"row of task {row.task!r} has no evidence_offsets; rank heads on needle tasks")
    instruction = tokenizer.encode(row.instruction, add_special_tokens=False)
    period = tokenizer.convert_tokens_to_ids(".")
    for start in range(len(prompt_ids) - len(instruction) + 1):
        if prompt_ids[start : start + len(instruction)] == instruction:
            positions = []
            for offset in offsets:
                position = start + len(instruction) + offset
                while position < len(prompt_ids) and prompt_ids[position] != period:
                    positions.append(position)
                    position += 1
                positions.append(position)
            return positions
    raise InputError(f"the instruction of a {row.task!r} row is not in its rendered prompt")


def _span_positions(tokenizer, row: Row, prompt_ids: list[int]) -> list[int]:
    spans = row.metadata["evidence_spans"]
    if not spans:
        raise InputError(f"row of task {row.task!r} has no evidence spans; rank heads on needle tasks")
    text = render_prompt(tokenizer, row.prompt, row.system, assistant_prefix=row.assistant_prefix)
    base = text.index(row.prompt)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    if encoded["input_ids"] != prompt_ids:
        raise InputError("the rendered prompt does not encode to the prompt ids; rank heads with the row's tokenizer")
    return [
        position
        for position, (begin, end) in enumerate(encoded["offset_mapping"])
        if any(begin < base + stop and end > base + start for start, stop in spans)
    ]


@torch.no_grad()
def retrieval_scores(model: nn.Module, tokenizer, rows: list[Row]) -> torch.Tensor:
    """Mean attention mass from the last prompt token onto the evidence tokens.

    Args:
        model: a Hugging Face causal LM without elastic attention attached.
        tokenizer: the tokenizer the rows are rendered with.
        rows: needle rows (with ``evidence_offsets`` or ``evidence_spans`` metadata), run one at a time.

    Returns:
        [layers, Hkv] float32 retrieval scores.
    """
    if is_attached(model):
        raise InputError("rank heads on the unmodified model: call detach(model) first")
    previous = model.config._attn_implementation
    model.set_attn_implementation(PROBE_NAME)
    _, family = family_of(model)
    attention_layers = attention_modules(decoder_of(model, family), family)
    device = next(model.parameters()).device
    total = None
    try:
        for row in rows:
            prompt_ids = encode_row(tokenizer, row).prompt_ids
            positions = torch.tensor(evidence_positions(tokenizer, row, prompt_ids), device=device)
            model(torch.tensor([prompt_ids], device=device), logits_to_keep=1)
            mass = torch.stack(
                [getattr(layer, _LAST_ROW_ATTRIBUTE)[0][:, positions].sum(-1) for layer in attention_layers]
            )
            total = mass if total is None else total + mass
    finally:
        model.set_attn_implementation(previous)
        for layer in attention_layers:
            layer.__dict__.pop(_LAST_ROW_ATTRIBUTE, None)
    per_query_head = total / len(rows)
    num_kv_heads = model.config.num_key_value_heads
    return per_query_head.unflatten(1, (num_kv_heads, -1)).mean(-1).cpu()


def static_routing(scores: torch.Tensor, msr: float) -> torch.Tensor:
    """Keep the highest-scoring heads on full attention so that a fraction ``msr`` of heads is sparse.

    Args:
        scores: [layers, Hkv] retrieval scores.
        msr: target model sparsity ratio in [0, 1].

    Returns:
        [layers, Hkv] bool, True = full attention; exactly round((1 - msr) * layers * Hkv) heads are True.
    """
    if not 0.0 <= msr <= 1.0:
        raise InputError(f"msr must be in [0, 1], got {msr}")
    keep = round((1.0 - msr) * scores.numel())
    routing = torch.zeros(scores.numel(), dtype=torch.bool)
    routing[torch.argsort(scores.flatten(), descending=True, stable=True)[:keep]] = True
    return routing.view_as(scores)
