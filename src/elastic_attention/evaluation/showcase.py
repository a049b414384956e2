"""First looks at a model with its routers, on any machine (a CPU included).

- `elastic-attention try`: the model answers a few suite rows, one at a time, greedy; prints each row's answer, the
  prediction, its score, the MSR and ESR of the row and the routing per layer (``F`` full attention, ``s`` sparse,
  one letter per KV head).
- `elastic-attention generate`: continues one prompt of your own and prints the continuation and its routing.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from elastic_attention.adapters import load_router
from elastic_attention.evaluation.pipeline import load_backbone
from elastic_attention.evaluation.runner import evaluate_rows
from elastic_attention.evaluation.suites import suite_of
from elastic_attention.chat import encode_prompt
from elastic_attention.errors import InputError
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


def run_generate_command(
    model_dir: str,
    *,
    router: str | None,
    prompt: str,
    max_new_tokens: int,
    chat: bool,
    device: str | None,
    dtype: str | None,
) -> str:
    """Greedy continuation of ``prompt`` (rendered as a user turn when ``chat`` and the tokenizer has a template);
    returns the printed report: the continuation, then the prompt's routing (or a line saying there is none)."""
    import torch

    if not prompt:
        raise InputError("the prompt is empty: pass --prompt TEXT or --file F with some text")
    model, tokenizer = load_backbone(model_dir, device, dtype)
    if router is not None:
        load_router(model, router)
    templated = chat and bool(getattr(tokenizer, "chat_template", None))
    ids = encode_prompt(tokenizer, prompt) if templated else tokenizer.encode(prompt)
    device_of = next(model.parameters()).device
    input_ids = torch.tensor([ids], device=device_of)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    started = time.perf_counter()
    with torch.no_grad():
        tokens = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens,
                                do_sample=False, pad_token_id=pad_id)
    seconds = time.perf_counter() - started
    continuation = tokenizer.decode(tokens[0, len(ids):], skip_special_tokens=True)
    lines = [continuation, "", f"{len(ids)} prompt tokens, {tokens.shape[1] - len(ids)} new, {seconds:.1f} s"]
    if chat and not templated:
        lines.append("the tokenizer has no chat template: the prompt went in as plain text (as with --raw)")
    if router is None:
        lines.append("no router given: the unmodified model (full attention everywhere)")
        return "\n".join(lines)
    report = routing_report(model)
    lines.append(f"routing of the prompt: MSR {float(report.msr[0]):.2f}, ESR last {float(report.esr_last[0]):.2f}, "
                 f"ESR mean {float(report.esr_mean[0]):.2f}")
    return "\n".join(lines + routing_lines(report.decisions[0], report.layers))
