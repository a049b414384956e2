"""`elastic-attention try`: a model with its routers answers a few suite rows; print answers and routing.

For a first look on any machine (a CPU included): one row at a time, greedy, with the row's answer, the model's
prediction, its score, the MSR and ESR of the row, and the routing per layer (``F`` full attention, ``s`` sparse, one
letter per KV head).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from elastic_attention.adapters import load_router
from elastic_attention.evaluation.pipeline import load_backbone
from elastic_attention.evaluation.runner import evaluate_rows
from elastic_attention.evaluation.suites import suite_of
from elastic_attention.integration import routing_report


def routing_lines(decisions, layers: Sequence[int]) -> list[str]:
    """One ``layer NN: FsF...`` line per routed layer from [layers, Hkv] bool decisions (True = full attention)."""
    return [f"  layer {layer:>2}: " + "".join("F" if full else "s" for full in row)
            for layer, row in zip(layers, decisions.tolist())]


def run_try_command(
    model_dir: str,
    *,
    router: str,
    tasks: Sequence[str],
    length: int,
    samples: int,
    seed: int,
    device: str | None,
    dtype: str | None,
) -> str:
    """Answer ``samples`` rows of each task at ``length`` tokens; returns the printed report."""
    model, tokenizer = load_backbone(model_dir, device, dtype)
    load_router(model, router)
    lines = [f"model {model_dir}, router {router}, {length}-token prompts"]
    for task in tasks:
        for row in suite_of(task).generate(task, length, seed, samples, tokenizer):
            started = time.perf_counter()
            result = evaluate_rows(model, tokenizer, [row], batch_size=1)
            seconds = time.perf_counter() - started
            lines += [
                "",
                f"{task} ({suite_of(task).kind(task)}), {row.metadata.get('prompt_tokens', length)} tokens, "
                f"{seconds:.1f} s",
                f"  answer:     {row.answer!r}",
                f"  prediction: {result['prediction'][0]!r}",
                f"  score {result['accuracy'][0]:.2f}, MSR {result['msr'][0]:.2f}, ESR last "
                f"{result['esr_last'][0]:.2f}, ESR mean {result['esr_mean'][0]:.2f}",
                *routing_lines(result["decisions"][0], routing_report(model).layers),
            ]
    return "\n".join(lines)
