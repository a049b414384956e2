"""Where does the time to the first token go, elastic against dense? The prefill of `bench request`'s prompts (one
forward over the left-padded batch, the cache built, the last position's logits) on a real model, once with its
router attached as `bench request` attaches it and once dense (FlashAttention-4 where transformers can turn it on,
else SDPA), each:

- timed (the median of ``--repeats`` after two warm-up calls; CUDA events on a GPU);
- on CUDA, its host-device synchronizations counted by the Python line that made them
  (`torch.cuda.set_sync_debug_mode`): each one stalls the host until the GPU has drained its queue, and the GPU then
  waits for the next launches;
- profiled once (`torch.profiler`): the kernels summed by name (the ``--top`` longest), their count, and the time
  the GPU ran no kernel (the call's time minus the kernels' sum); on a CPU, the operators by self time.

  python studies/kernel_tuning/profile_first_token.py --model /tmp/qwen2.5-coder-1.5b-instruct \
      --router src/elastic_attention/assets/routers/qwen2.5-coder-1.5b-instruct --length 16k --batch 1

It answers why `request_complete_2026-12-04.md` measured elastic's first token later than dense at 16K batch 1.
"""

from __future__ import annotations

import argparse
import collections
import warnings

import torch
from torch.profiler import ProfilerActivity, profile

import elastic_attention as ea
from elastic_attention.bench.request import dense_setups, left_padded, prompt_batches, prompt_positions
from elastic_attention.bench.timing import timed
from elastic_attention.cli import parse_length
from elastic_attention.evaluation.pipeline import load_backbone
from elastic_attention.integration import runtime_of


def first_token(model, ids: torch.Tensor, mask: torch.Tensor):
    """One prefill as `bench request`'s own loop runs it: the cache the model's setup builds, the last logits."""
    with torch.no_grad():
        output = model(input_ids=ids, attention_mask=mask, position_ids=prompt_positions(mask), use_cache=True,
                       logits_to_keep=1)
        return output.logits[:, -1].argmax(-1)


def synchronizations(call) -> collections.Counter:
    """(file:line) -> how many host-device synchronizations ``call()`` made there (CUDA only)."""
    counts: collections.Counter = collections.Counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            call()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for warning in caught:
        if "synchroniz" in str(warning.message):
            counts[f"{warning.filename}:{warning.lineno}"] += 1
    return counts


def kernel_report(call, device: torch.device, seconds: float, top: int) -> list[str]:
    """The profile of one ``call()``: on CUDA the kernels by total time and the GPU's idle time; on a CPU the
    operators by self time."""
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as profiler:
        call()
        if cuda:
            torch.cuda.synchronize(device)
    totals: collections.Counter = collections.Counter()
    counts: collections.Counter = collections.Counter()
    for event in profiler.events():
        if cuda and event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] += event.time_range.elapsed_us() / 1e6
            counts[event.name] += 1
        elif not cuda and event.device_type == torch.autograd.DeviceType.CPU:
            totals[event.name] += event.self_cpu_time_total / 1e6
            counts[event.name] += 1
    busy = sum(totals.values())
    what = "kernels" if cuda else "operators (self time)"
    lines = [f"  {what}: {sum(counts.values())} launches, {busy * 1e3:.2f} ms"
             + (f"; the GPU ran no kernel for {max(seconds - busy, 0.0) * 1e3:.2f} ms of {seconds * 1e3:.2f}"
                if cuda else "")]
    for name, total in totals.most_common(top):
        lines.append(f"  {total * 1e3:9.3f} ms {counts[name]:6d}x  {name[:110]}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a local Hugging Face folder")
    parser.add_argument("--router", required=True, help="the router adapter's folder")
    parser.add_argument("--length", type=parse_length, default=16384, help="prompt tokens, e.g. 16k")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--suite", default="code")
    parser.add_argument("--task", default="passkey", help="the suite's task whose rows are the prompts")
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--top", type=int, default=20, help="how many kernels (operators on a CPU) to list")
    args = parser.parse_args()

    model, tokenizer = load_backbone(args.model, args.device, args.dtype)
    device = next(model.parameters()).device
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    prompts = prompt_batches(tokenizer, args.suite, {"prompt": args.task}, args.length, args.rows, args.seed)
    ids, mask = left_padded(prompts["prompt"], args.batch, pad_id, device)
    setups, _ = dense_setups(model, device)
    dense = "flash_attention_4" if any(name == "flash_attention_4" for name, _, _ in setups) else "sdpa"
    print(f"{args.task} at {args.length} tokens ({int(mask.sum(1).max())} in the longest row), batch {args.batch}, "
          f"{device}, {next(model.parameters()).dtype}")

    def measure(label: str) -> None:
        call = lambda: first_token(model, ids, mask)  # noqa: E731
        seconds = timed(call, device, args.repeats)
        print(f"{label}: {seconds * 1e3:.2f} ms (median of {args.repeats})")
        if device.type == "cuda":
            syncs = synchronizations(call)
            print(f"  {sum(syncs.values())} host-device synchronizations"
                  + "".join(f"\n  {count:6d}x  {where}" for where, count in syncs.most_common(args.top)))
        print("\n".join(kernel_report(call, device, seconds, args.top)))

    model.set_attn_implementation(dense)
    measure(f"dense ({dense})")
    model.set_attn_implementation("sdpa")
    ea.load_router(model, args.router)
    try:
        measure(f"elastic (backend {runtime_of(model).backend.name})")
        print(f"  MSR {float(ea.routing_report(model).msr.mean()):.2f}")
    finally:
        ea.detach(model)


if __name__ == "__main__":
    main()
