"""First looks at a model with its routers, on any machine (a CPU included).

- `elastic-attention try`: the model answers a few suite rows, one at a time, greedy; prints each row's answer, the
  prediction, its score, the MSR and ESR of the row and the routing per layer (``F`` full attention, ``s`` sparse,
  one letter per KV head).
- `elastic-attention generate`: continues one prompt of your own and prints the continuation and its routing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

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


def interactive_dtype(device: str | None) -> str:
    """The default dtype of `try` and `generate`: bfloat16 on CUDA and on CPUs with bf16 instructions (AMX or
    AVX512-BF16, where it is several times faster), float32 on other CPUs (there bf16 is emulated: minutes a row)."""
    import torch

    if (device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda"):
        return "bfloat16"
    return "bfloat16" if cpu_has_bf16() else "float32"


def cpu_has_bf16() -> bool:
    """Whether this CPU executes bf16 matrix products natively (Linux: its /proc/cpuinfo flags)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            flags = next((line for line in cpuinfo if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def window_note(prompt_tokens: int, config) -> str | None:
    """A line saying that a prompt inside the sparse window leaves an SSA head nothing to skip, else None."""
    if config.sparse_mode != "ssa":
        return None
    window = config.sink_tokens + config.local_tokens
    if prompt_tokens > window:
        return None
    return (f"  the prompt ({prompt_tokens} tokens) fits in the sparse window (sink {config.sink_tokens} + local "
            f"{config.local_tokens} tokens): a head on SSA skips nothing here, whatever the MSR")


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
    echo: Callable[[str], None] | None = None,
) -> str:
    """Answer ``samples`` rows of each task at ``length`` tokens; returns the printed report. ``echo`` receives each
    part of it as soon as it is known (a CPU takes seconds to minutes a row); ``dtype`` None is
    `interactive_dtype`."""
    from elastic_attention.integration import runtime_of

    dtype = dtype or interactive_dtype(device)
    lines: list[str] = []

    def say(*parts: str) -> None:
        lines.extend(parts)
        if echo is not None:
            echo("\n".join(parts))

    say(f"model {model_dir} ({dtype}), router {router}, {length}-token prompts")
    model, tokenizer = load_backbone(model_dir, device, dtype)
    load_router(model, router)
    config = runtime_of(model).config
    for task in tasks:
        for row in suite_of(task).generate(task, length, seed, samples, tokenizer):
            started = time.perf_counter()
            result = evaluate_rows(model, tokenizer, [row], batch_size=1)
            seconds = time.perf_counter() - started
            tokens = row.metadata.get("prompt_tokens", length)
            note = window_note(tokens, config)
            say(
                "",
                f"{task} ({suite_of(task).kind(task)}), {tokens} tokens, {seconds:.1f} s",
                f"  answer:     {row.answer!r}",
                f"  prediction: {result['prediction'][0]!r}",
                f"  score {result['accuracy'][0]:.2f}, MSR {result['msr'][0]:.2f}, ESR last "
                f"{result['esr_last'][0]:.2f}, ESR mean {result['esr_mean'][0]:.2f}",
                *([note] if note else []),
                *routing_lines(result["decisions"][0], routing_report(model).layers),
            )
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
    model, tokenizer = load_backbone(model_dir, device, dtype or interactive_dtype(device))
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
    from elastic_attention.integration import runtime_of

    report = routing_report(model)
    lines.append(f"routing of the prompt: MSR {float(report.msr[0]):.2f}, ESR last {float(report.esr_last[0]):.2f}, "
                 f"ESR mean {float(report.esr_mean[0]):.2f}")
    note = window_note(len(ids), runtime_of(model).config)
    if note:
        lines.append(note.strip())
    return "\n".join(lines + routing_lines(report.decisions[0], report.layers))
