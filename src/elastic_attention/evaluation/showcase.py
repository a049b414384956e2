"""First looks at a model with its routers, on any machine (a CPU included).

- `elastic-attention try`: the model answers a few suite rows, one at a time, greedy; prints each row's answer, the
  prediction, its score, the MSR and ESR of the row and the routing per layer (``F`` full attention, ``s`` sparse,
  one letter per KV head).
- `elastic-attention generate`: continues one prompt of your own and prints the continuation and its routing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch

from elastic_attention.adapters import load_router
from elastic_attention.bench.timing import timed_generate
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


def report_lines(report, sequence: int = 0) -> list[str]:
    """How a prefill routed ``sequence``: a head-set router's choice in one line (set, MSR, full heads, probability,
    safety floor), else one line per routed layer (`routing_lines`)."""
    if report.head_sets is not None:
        return ["  " + report.head_sets.line(sequence)]
    return routing_lines(report.decisions[sequence], report.layers)


def interactive_dtype(device: str | None) -> str:
    """The default dtype of `try` and `generate`: bfloat16 on CUDA and on CPUs with bf16 instructions (AMX or
    AVX512-BF16, where it is several times faster), float32 on other CPUs (there bf16 is emulated: minutes a row)."""
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


@contextmanager
def own_window_note() -> Iterator[None]:
    """While inside, the runtime's log line about a prompt inside the sparse window is dropped: these commands print
    `window_note` beside each prompt instead."""
    runtime_logger = logging.getLogger("elastic_attention.integration.runtime")
    def drop(record: logging.LogRecord) -> bool:
        return not getattr(record, "window_note", False)

    runtime_logger.addFilter(drop)
    try:
        yield
    finally:
        runtime_logger.removeFilter(drop)


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
    compare: bool = False,
    new_tokens: int = 32,
) -> str:
    """Answer ``samples`` rows of each task at ``length`` tokens; returns the printed report. ``echo`` receives each
    part of it as soon as it is known (a CPU takes seconds to minutes a row); ``dtype`` None is
    `interactive_dtype`. With ``compare`` each row's prompt is also generated for ``new_tokens`` greedy tokens by
    the plain model (before the routers are attached) and by the routed one, timed side by side
    (`comparison_lines`)."""
    from elastic_attention.integration import runtime_of
    from elastic_attention.rows import encode_row

    dtype = dtype or interactive_dtype(device)
    lines: list[str] = []

    def say(*parts: str) -> None:
        lines.extend(parts)
        if echo is not None:
            echo("\n".join(parts))

    say(f"model {model_dir} ({dtype}), router {router}, {length}-token prompts")
    model, tokenizer = load_backbone(model_dir, device, dtype)
    rows = [(task, row) for task in tasks for row in suite_of(task).generate(task, length, seed, samples, tokenizer)]
    prompts = [torch.tensor([encode_row(tokenizer, row).prompt_ids], device=next(model.parameters()).device)
               for _, row in rows]
    plain = [timed_generation(model, tokenizer, ids, new_tokens) for ids in prompts] if compare else []
    load_router(model, router)
    config = runtime_of(model).config
    for index, (task, row) in enumerate(rows):
        started = time.perf_counter()
        with own_window_note():
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
            *report_lines(routing_report(model)),
        )
        if compare:
            with own_window_note():
                routed = timed_generation(model, tokenizer, prompts[index], new_tokens)
            say(*("  " + line for line in comparison_lines(plain[index], routed, str(prompts[index].device))))
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
    compare: bool = False,
    echo: Callable[[str], None] | None = None,
) -> str:
    """Greedy continuation of ``prompt`` (rendered as a user turn when ``chat`` and the tokenizer has a template);
    returns the printed report: the continuation, then the prompt's routing (or a line saying there is none). With
    ``compare`` (a router needed), the same prompt and number of new tokens also run on the plain model (transformers'
    own attention and cache), and a table sets prefill time, decode speed and KV-cache bytes side by side. ``echo``
    hears what is about to run before each generation (long on a CPU)."""
    if not prompt:
        raise InputError("the prompt is empty: pass --prompt TEXT or --file F with some text")
    if compare and router is None:
        raise InputError("--compare sets the routed model beside the plain one: pass --router ADAPTER_FOLDER")
    dtype = dtype or interactive_dtype(device)
    model, tokenizer = load_backbone(model_dir, device, dtype)
    templated = chat and bool(getattr(tokenizer, "chat_template", None))
    ids = encode_prompt(tokenizer, prompt) if templated else tokenizer.encode(prompt)
    input_ids = torch.tensor([ids], device=next(model.parameters()).device)
    say = echo or (lambda text: None)
    plain = None
    if compare:
        say(f"the plain model: {len(ids)} prompt tokens, up to {max_new_tokens} new, on {input_ids.device} ({dtype})")
        plain = timed_generation(model, tokenizer, input_ids, max_new_tokens)
    if router is not None:
        load_router(model, router)
    say(f"{'the routed model' if router else 'the model'}: {len(ids)} prompt tokens, up to {max_new_tokens} new, on "
        f"{input_ids.device} ({dtype})")
    with own_window_note():
        measured = timed_generation(model, tokenizer, input_ids, max_new_tokens)
    continuation = tokenizer.decode(measured["tokens"][0], skip_special_tokens=True)
    lines = [continuation, "", f"{len(ids)} prompt tokens, {measured['tokens'].shape[1]} new, "
                               f"{measured['ttft_s'] + measured['decode_s']:.1f} s"]
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
    lines += report_lines(report)
    if plain is not None:
        lines += ["", *comparison_lines(plain, measured, str(input_ids.device))]
    return "\n".join(lines)


def timed_generation(model, tokenizer, input_ids: torch.Tensor, new_tokens: int) -> dict:
    """`bench.timing.timed_generate` of one prompt ``input_ids`` [1, S], up to the end-of-sequence token."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return timed_generate(model, input_ids, torch.ones_like(input_ids), new_tokens, pad_id, exact=False)


def comparison_lines(plain: dict, elastic: dict, device: str) -> list[str]:
    """The side-by-side table of `timed_generation` results: the plain model, the routed one, and per column how the
    routed one compares. Every column's ratio is taken the same way, the larger cost over the smaller (prefill:
    seconds; decode: seconds per token, the inverse of tok/s; KV cache: bytes), and a word says which way it goes."""
    def row(name: str, result: dict) -> str:
        return (f"{name:<16} {result['ttft_s']:>9.3f} s {result['decode_tokens_per_s']:>10.1f} tok/s "
                f"{result['kv_cache_bytes'] / 2**20:>10.2f} MiB")

    same = ("the same tokens" if torch.equal(plain["tokens"], elastic["tokens"])
            else "different tokens (routing changed them)")
    return [
        f"on {device}, one run each (times vary; a first call warms up): {same}",
        f"{'':<16} {'prefill':>11} {'decode':>16} {'KV cache':>14}",
        row("plain model", plain),
        row("elastic", elastic),
        f"{'elastic vs plain':<16} "
        f"{relative(plain['ttft_s'], elastic['ttft_s'], 'faster', 'slower'):>11} "
        f"{relative(per_token(plain), per_token(elastic), 'faster', 'slower'):>16} "
        f"{relative(plain['kv_cache_bytes'], elastic['kv_cache_bytes'], 'smaller', 'larger'):>14}",
    ]


def per_token(result: dict) -> float:
    """Seconds per decoded token of a `timed_generation` result (nan when it decoded none after the first)."""
    rate = result["decode_tokens_per_s"]
    return 1 / rate if rate and rate == rate else float("nan")


def relative(plain_cost: float, elastic_cost: float, less: str, more: str) -> str:
    """``elastic_cost`` beside ``plain_cost`` (both costs: lower is better) as "1.16x slower" or "1.20x faster": the
    larger over the smaller, with ``less`` when the routed model costs less and ``more`` when it costs more."""
    if not (plain_cost > 0 and elastic_cost > 0):  # nan or 0: no ratio to give
        return "n/a"
    if plain_cost == elastic_cost:
        return "the same"
    ratio = max(plain_cost, elastic_cost) / min(plain_cost, elastic_cost)
    return f"{ratio:.2f}x {less if elastic_cost < plain_cost else more}"
