"""The embedded default job: a tiny random decoder through attach, generate and the routing report.

It needs no download and runs on a CPU in seconds. It shows the mechanics (routing per input and per KV head,
the sparsity it bought); the trained-router demo on the project's own backbone replaces it once that exists.
"""

from __future__ import annotations

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from elastic_attention.config import ElasticConfig
from elastic_attention.integration import attach, force_routing, routing_report


def build_tiny_model(seed: int = 0) -> Qwen3ForCausalLM:
    """A random 4-layer Qwen3-architecture model (GQA 4/2 heads of head_dim 32)."""
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=4096, use_sliding_window=False,
        pad_token_id=0, bos_token_id=None, eos_token_id=None,
    )
    return Qwen3ForCausalLM(config).eval()


def run_demo(seed: int = 0, prompt_lengths: tuple[int, ...] = (900, 520), new_tokens: int = 8) -> str:
    """Attach elastic attention to a tiny random model, generate for a left-padded batch, report the routing.

    Returns:
        The text of the report.
    """
    model = build_tiny_model(seed)
    config = ElasticConfig(block_size=64, sink_tokens=64, local_tokens=128, pool_first=100, pool_last=100)
    attach(model, config)
    _spread_routers(model, seed)

    generator = torch.Generator().manual_seed(seed)
    width = max(prompt_lengths)
    input_ids = torch.zeros(len(prompt_lengths), width, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, length in enumerate(prompt_lengths):
        input_ids[row, width - length :] = torch.randint(1, 512, (length,), generator=generator)
        attention_mask[row, width - length :] = 1

    lines = [
        "elastic-attention demo: tiny random Qwen3 (4 layers, 4 query / 2 KV heads), config "
        f"{config.configuration}, block {config.block_size}, sink {config.sink_tokens}, local {config.local_tokens}",
        f"batch of {len(prompt_lengths)} left-padded prompts of {list(prompt_lengths)} tokens, greedy, "
        f"{new_tokens} new tokens",
        "",
    ]
    for label, forced in (("router", None), ("all full", "full"), ("all sparse", "sparse")):
        force_routing(model, forced)
        tokens = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=new_tokens, do_sample=False)
        report = routing_report(model)
        lines.append(f"routing: {label}")
        for entry, decisions, row_tokens in zip(report.summary(), report.decisions, tokens[:, width:]):
            heads = " ".join("".join("F" if full else "s" for full in layer) for layer in decisions.tolist())
            lines.append(
                f"  sample {entry['row']}: MSR {entry['msr']:.2f}  ESR last {entry['esr_last']:.2f}  "
                f"ESR mean {entry['esr_mean']:.2f}  heads per layer [{heads}]  tokens {row_tokens.tolist()}"
            )
        lines.append("")
    lines.append("F = KV head on full attention, s = on sparse (SSA); MSR = share of sparse heads; "
                 "ESR = share of causal (query, key) pairs skipped.")
    return "\n".join(lines)


def _spread_routers(model, seed: int) -> None:
    """Give the untrained routers input-sensitive random weights, so that routing visibly differs per input."""
    from elastic_attention.integration import routers_of

    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for router in routers_of(model).values():
            for name, parameter in router.named_parameters():
                if name.endswith("bias"):
                    parameter.zero_()
                else:
                    noise = torch.randn(parameter.shape, generator=generator)
                    parameter.copy_(noise * 2 / parameter.shape[1] ** 0.5)
