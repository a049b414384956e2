"""A real request end to end: with a trained router on a real model, how much sooner does the first token come, how
fast does generation go, how much memory does it take, against the fastest dense setup a user would run?

For each prompt kind (``--tasks SENSITIVE,ROBUST`` of a suite, ``--rows`` rows each, cycled to fill a batch,
left-padded), each ``--lengths`` and each ``--batch``, one greedy `generate` call (or one run of the bench's own
loop) of ``--new-tokens`` tokens (end of sequence suppressed, so every call makes them all) per setup, timed by
stamping each token (synchronized): ``ttft_s`` is the first stamp (routing, prefill and the first token),
``decode_tokens_per_s`` is batch x (new tokens - 1) over the time from the first stamp to the last, of which
``first_step_s`` is the first decode step (with what it sets up for the rest: static storage, a captured graph) and
``steady_decode_tokens_per_s`` batch over the median later step. Each setup runs once to warm up on the same prompts,
then ``--timed-calls`` times (default 3), and each timing is its median over those calls (`warm_then_timed`; the
first call compiles and captures what it needs, and its time to its last token is ``first_call_s``; the timed ones
replay the first's captured step, elastic and ``static_cache_graph`` alike, as a process serving requests of one
shape would).

- ``elastic``: the model with its router attached as `load_router` attaches it (backend ``auto``, the bounded cache,
  captured decode steps), once per ``--compile-decode`` setting (``off``: the captured steps run the layers as they
  are; ``on``: compiled, ``attach(compile_decode=True)``; ``compile_decode`` in the row). The first compiled cell's
  ``first_call_s`` holds the compile (a process compiles once; a new batch size may compile again); then once more
  with the last of those settings in the bench's own decode loop (`own_loop_generate`; ``decode_loop``: ``own``
  rather than ``generate``), as the ``static_cache_graph`` setup decodes: like for like. Its rows also
  say the routing (``msr``), the bytes the routing implies for the cache (every entry of a full head, sink + window
  of an SSA head) and whether its tokens equal those of the same model on the reference path (backend
  ``reference``, the model's own cache, no graphs; the routers decide again from the same prompts; the first
  ``--reference-rows`` sequences of the batch), with ``leading_tokens_equal``: per checked sequence, how many of the
  first generated tokens agree, and ``divergences``: where a sequence first differs, how far apart the reference's
  own logits put the two tokens (`divergences`: a near-tie that rounding decides, or a wrong path).
- ``dense``: the model without elastic attention: ``sdpa`` (transformers' SDPA and its dynamic cache);
  ``flash_attention_4`` where transformers can turn FlashAttention-4 on (installed, on a GPU; the result's
  ``dense_setups_missing`` says why not otherwise); on CUDA ``static_cache_compiled`` (transformers' static cache,
  whose decode steps `generate` compiles in ``reduce-overhead`` mode; ``cuda_graphs`` says whether Inductor replayed
  them as CUDA graphs: it skips them when it sees mutated inputs) and ``static_cache_graph`` (`own_loop_generate`: the
  fastest dense prefill here, then each step a captured CUDA graph over transformers' static cache, decoder layers
  compiled, attention by this project's fused split-K decode kernel over each sequence's unpadded entries: the fastest
  dense decode we know of; it runs the bench's own loop, without `generate`'s host work between steps, so its decode
  rate bounds a dense decode under `generate` from above); with ``--compile-prefill on`` (where the elastic setups
  compile their prefill's decoder layers, ``compile_prefill`` in their rows) ``sdpa_compiled_layers`` (SDPA, every
  decoder layer through ``torch.compile`` for the whole `generate`: a dense prefill with the same fusion).
  ``--dense-setups`` leaves some out. ``baseline`` names the setup; the fastest of them, per metric, is what the
  elastic rows compare against (``speedup_*``). Each dense row's ``leading_tokens_equal`` compares it with the first
  dense row's tokens: how far two dense implementations agree, the floor for the elastic rows' agreement.

  elastic-attention bench request --model /tmp/qwen2.5-coder-1.5b-instruct \\
      --router ROUTER_FOLDER --lengths 16k,32k --batch 1,8 \\
      --new-tokens 128 --out request_qwen2.5-coder-1.5b-instruct.json

Writes the JSON (rewritten after each cell) and a markdown table beside it (same name, ``.md``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
from pathlib import Path

import torch

from elastic_attention.bench.merge_runs import runs_lines
from elastic_attention.bench.timing import (
    output_cache,
    parse_tokens,
    run_header,
    timed_generate,
    warm_then_timed,
    write_result,
)
from elastic_attention.errors import InputError
from elastic_attention.help_format import finish_parser
from elastic_attention.io import atomic_write_text

#: The fields of a result row (the issue's names; a results script reads them).
ROW_FIELDS = ("prompt_kind", "length", "batch", "mode", "baseline", "msr", "ttft_s", "decode_tokens_per_s",
              "peak_memory_bytes", "kv_cache_bytes", "tokens_equal_reference")


def prompt_batches(tokenizer, suite_name: str, tasks: dict[str, str], length: int, rows: int, seed: int):
    """kind -> the token ids of ``rows`` rows of that kind's task at ``length`` tokens."""
    from elastic_attention.evaluation.suites import get_suite
    from elastic_attention.rows import encode_row

    suite = get_suite(suite_name)
    return {kind: [encode_row(tokenizer, row).prompt_ids for row in suite.generate(task, length, seed, rows,
                                                                                    tokenizer)]
            for kind, task in tasks.items()}


def left_padded(prompts: list[list[int]], batch: int, pad_id: int, device: torch.device):
    """(input_ids [batch, S], attention_mask [batch, S]) of the prompts cycled to ``batch`` rows, padded on the left."""
    chosen = [prompts[index % len(prompts)] for index in range(batch)]
    width = max(map(len, chosen))
    ids = torch.full((batch, width), pad_id, dtype=torch.long)
    mask = torch.zeros((batch, width), dtype=torch.long)
    for row, prompt in enumerate(chosen):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    return ids.to(device), mask.to(device)


def implied_cache_bytes(report, lengths: list[int], config, head_dim: int, element_size: int) -> int:
    """Bytes the routing implies: per sequence of ``lengths`` tokens (prompt and generated), every entry of a head on
    full attention (or XA), sink + local entries of a head on SSA; keys and values."""
    decisions = report.decisions  # [N, L, Hkv], True = full attention
    window = config.sink_tokens + config.local_tokens
    streams = config.sparse_mode == "ssa"
    total = 0
    for sequence, length in enumerate(lengths):
        full = int(decisions[sequence].sum())
        sparse = decisions[sequence].numel() - full
        total += full * length + sparse * (min(length, window) if streams else length)
    return 2 * total * head_dim * element_size


#: The dense setup of `own_loop_generate` (its own decode loop, captured steps over a static cache).
CAPTURED_SETUP = "static_cache_graph"
#: The dense setup of `compiled_layers_generate` (``--compile-prefill on``: its decoder layers compiled).
COMPILED_LAYERS_SETUP = "sdpa_compiled_layers"
#: Every dense setup, in the order they run (``--dense-setups`` picks among them).
DENSE_SETUPS = ("sdpa", "flash_attention_4", "static_cache_compiled", CAPTURED_SETUP, COMPILED_LAYERS_SETUP)


def dense_setups(model, device: torch.device, compile_prefill: bool = False
                 ) -> tuple[list[tuple[str, str, dict]], dict[str, str]]:
    """The dense setups that run here, as (name, attention implementation, generate arguments), and why each other
    one does not (``sdpa_compiled_layers`` runs with ``compile_prefill``, beside the elastic setups that compile
    their prefill)."""
    setups, missing = [("sdpa", "sdpa", {})], {}
    try:
        model.set_attn_implementation("flash_attention_4")
        setups.append(("flash_attention_4", "flash_attention_4", {}))
    except Exception as error:  # noqa: BLE001 - a probe: not installed, unknown to this transformers, no hub here
        missing["flash_attention_4"] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    finally:
        model.set_attn_implementation("sdpa")
    if device.type == "cuda":
        setups.append(("static_cache_compiled", "sdpa", {"cache_implementation": "static"}))
        setups.append((CAPTURED_SETUP, setups[-2][1], {}))  # prefill: FlashAttention-4 where it runs, else SDPA
    else:
        missing["static_cache_compiled"] = missing[CAPTURED_SETUP] = "CUDA graphs need a GPU"
    if compile_prefill:
        setups.append((COMPILED_LAYERS_SETUP, "sdpa", {}))
    else:
        missing[COMPILED_LAYERS_SETUP] = "runs with --compile-prefill on"
    return setups, missing


def chosen_setups(setups: list[tuple[str, str, dict]], missing: dict[str, str], wanted: list[str]):
    """The setups of ``dense_setups`` named in ``wanted`` (in their running order) and, for each other one, why it
    did not run."""
    missing = {**missing, **{name: "not asked for (--dense-setups)" for name, _, _ in setups if name not in wanted}}
    return [setup for setup in setups if setup[0] in wanted], missing


def own_loop_generate(model, ids: torch.Tensor, mask: torch.Tensor, new_tokens: int, pad_id: int, *,
                      elastic: bool = False, kept_steps: dict | None = None) -> dict:
    """Greedy decoding in a loop of this module's own, without `generate` around it (none of its host work between
    steps); timed as `timed_generate` (a stamp per token after synchronizing; end of sequence never chosen) and
    returning its fields. The prefill and the steps are `own_loop_steps`' (with ``kept_steps``)."""
    from elastic_attention.bench.timing import TokenClock
    from elastic_attention.cache import cache_nbytes

    clock = TokenClock(ids.device)
    cuda = ids.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(ids.device)
    clock.start()
    with own_loop_steps(model, ids, mask, new_tokens, elastic=elastic, first_token_done=lambda: clock(None, None),
                        kept_steps=kept_steps) as step:
        tokens = [step.token.clone()]
        for _ in range(new_tokens - 1):
            step()
            tokens.append(step.token.clone())
            clock(None, None)
        cache_bytes = cache_nbytes(step.cache)
    return {**clock.timings(ids.shape[0]),
            "peak_memory_bytes": torch.cuda.max_memory_allocated(ids.device) if cuda else None,
            "kv_cache_bytes": cache_bytes, "tokens": torch.cat(tokens, dim=1).cpu()}


@contextlib.contextmanager
def own_loop_steps(model, ids: torch.Tensor, mask: torch.Tensor, new_tokens: int, *, elastic: bool = False,
                   first_token_done=None, kept_steps: dict | None = None):
    """The decode steps of `own_loop_generate` after its prefill: yields a `decode_graphs.Stepper` whose ``token``
    [B, 1] is the prefill's greedy token and whose calls make the next ``new_tokens - 1`` (room for 8 more).

    One prefill (left padding masked, positions counted from each sequence's first token; end of sequence never
    chosen), ``first_token_done()`` called once its token is on the host's side of a synchronization if it asks for
    one, then:

    - ``elastic`` False (CUDA only): the model without elastic attention; its cache copied into transformers'
      `StaticCache`; each step replayed as a captured CUDA graph (decoder layers compiled, projections grouped as
      the elastic model's are: `integration.decode_projections`) whose attention is the fused split-K decode kernel
      over each sequence's unpadded entries (`decode_graphs.StaticCacheDecodeAttention`): the fastest dense decode
      this project knows; the model's attention implementation is put back on exit. With ``kept_steps`` (a dict the
      caller keeps between calls), a later call of the same batch and capacity refills the earlier call's static
      cache and replays its captured step, as an elastic model's later caches replay its kept steps
      (`integration.decode_graph`);
    - ``elastic`` True: the model as attached, over the cache its prefill gets (`attach`'s ``cache``: an
      `ElasticCache` by default, whose steps are captured as `attach` set them).
    """
    from elastic_attention.bench.decode_graphs import STATIC_ATTENTION, STATIC_ATTENTION_NAME, Stepper, static_copy

    if not elastic and ids.device.type != "cuda":
        raise InputError("the captured dense decode replays CUDA graphs: give it inputs on a CUDA device")
    eos = model.generation_config.eos_token_id
    suppressed = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    length = ids.shape[1]
    positions = prompt_positions(mask)
    prefill_implementation = model.config._attn_implementation
    with torch.no_grad():
        output = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
        logits = output.logits[:, -1]
        logits[:, suppressed] = float("-inf")
        token = logits.argmax(-1, keepdim=True)
        if first_token_done is not None:
            first_token_done()
        steps = {"positions": positions[:, -1:] + 1, "suppressed_tokens": suppressed}
        key, pads = (ids.shape[0], length + new_tokens + 8), (mask == 0).sum(1).tolist()
        if elastic:
            stepper = Stepper(model, output_cache(output), token, length, **steps)
        elif kept_steps is not None and key in kept_steps:
            stepper, STATIC_ATTENTION.segments, STATIC_ATTENTION.pads = kept_steps[key]
            static_copy(model, output_cache(output), length, key[1], into=stepper.cache)
            STATIC_ATTENTION.prepare(stepper.cache, length, None, pads=pads, in_place=True)
            stepper.restart(token, length, steps["positions"])
        else:
            cache = static_copy(model, output_cache(output), length, key[1])
            STATIC_ATTENTION.prepare(cache, length, None, pads=pads)
            steps.update(graph_over_static=STATIC_ATTENTION, compile_layers=True, group_projections=True)
            stepper = Stepper(model, cache, token, length, **steps)
            if kept_steps is not None:
                kept_steps[key] = (stepper, STATIC_ATTENTION.segments, STATIC_ATTENTION.pads)
        if not elastic:
            model.set_attn_implementation(STATIC_ATTENTION_NAME)
        del output, logits
        try:
            yield stepper
        finally:
            if not elastic:
                model.set_attn_implementation(prefill_implementation)
                STATIC_ATTENTION.segments = {}


def compiled_layers_generate(model, ids: torch.Tensor, mask: torch.Tensor, new_tokens: int, pad_id: int,
                             **generate_kwargs) -> dict:
    """`timed_generate` with every decoder layer through ``torch.compile`` for the whole call (prefill and steps), as
    ``attach(compile_prefill=True)`` runs an elastic model's prefill: the dense setup ``sdpa_compiled_layers``."""
    from elastic_attention.bench.decode_graphs import decoder_layers_of
    from elastic_attention.integration.decode_graph import compiled

    with compiled(decoder_layers_of(model)):
        return timed_generate(model, ids, mask, new_tokens, pad_id, **generate_kwargs)


def prompt_positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids [B, S] of a left-padded batch (its attention mask [B, S]): each sequence counts from its first
    token; padding gets 0."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def leading_tokens_equal(tokens: torch.Tensor, reference: torch.Tensor) -> list[int]:
    """Per sequence of ``reference`` [R, T], how many of the first generated tokens ``tokens`` [>= R, T] shares
    with it (T when all)."""
    differs = tokens[: reference.shape[0]] != reference
    return [int(row.nonzero()[0, 0]) if row.any() else row.numel() for row in differs]


def divergences(tokens: torch.Tensor, reference: torch.Tensor, reference_logits: torch.Tensor) -> list[dict | None]:
    """Per sequence of ``reference`` [R, T] (greedy tokens), where ``tokens`` [>= R, T] first leaves it: ``step``,
    ``margin`` (the reference's logit of its own token minus its logit of the token taken instead, >= 0: a margin
    within the logits' rounding, 0.125 for bf16 logits between 16 and 32, is a near-tie that precision decides) and
    ``top_logit`` (the reference's logit of its own token); None where the sequences agree.

    Args:
        reference_logits: [R, T, vocab], the reference's scores at each step (before logits processors).
    """
    found = []
    for row, step in enumerate(leading_tokens_equal(tokens, reference)):
        if step == reference.shape[1]:
            found.append(None)
            continue
        scores = reference_logits[row, step].float()
        mine, taken = int(reference[row, step]), int(tokens[row, step])
        found.append({"step": step, "margin": float(scores[mine] - scores[taken]), "top_logit": float(scores[mine])})
    return found


def widest_margin(row: dict) -> str:
    """``widest margin M at logit L``: of an elastic row's `divergences`, the one whose reference logits set the two
    tokens farthest apart; empty where the row records none."""
    found = [divergence for divergence in row.get("divergences") or [] if divergence]
    if not found:
        return ""
    widest = max(found, key=lambda divergence: divergence["margin"])
    return f"widest margin {widest['margin']:.3g} at logit {widest['top_logit']:.1f}"


def cudagraph_skips() -> int:
    """How many compiled graphs Inductor has run without CUDA graphs in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"])


def run_cell(model, pad_id: int, router: str, ids, mask, args, kind: str, length: int,
             setups: list[tuple[str, str, dict]]) -> list[dict]:
    """The rows of one (prompt kind, length, batch): every dense setup (`dense_setups`), then elastic with its
    reference check."""
    import elastic_attention as ea
    from elastic_attention.integration import runtime_of

    batch, rows = ids.shape[0], []
    common = {"prompt_kind": kind, "length": length, "batch": batch, "prompt_tokens": int(mask.sum(1).max())}
    for name, implementation, kwargs in setups:
        model.set_attn_implementation(implementation)
        skips = cudagraph_skips()
        try:
            kept_steps = {}  # the first call's captured dense step, replayed by the timed call
            generate = {CAPTURED_SETUP: functools.partial(own_loop_generate, kept_steps=kept_steps),
                        COMPILED_LAYERS_SETUP: compiled_layers_generate}.get(name, timed_generate)
            measured = warm_then_timed(model, ids, mask, args.new_tokens, pad_id, generate=generate,
                                       timed_calls=args.timed_calls, **kwargs)
        finally:
            kept_steps.clear()
            model.set_attn_implementation("sdpa")
        extra = {"cuda_graphs": cudagraph_skips() == skips} if name == "static_cache_compiled" else {}
        rows.append({**common, "mode": "dense", "baseline": name, "msr": 0.0, **measured, **extra,
                     "decode_loop": "own" if name == CAPTURED_SETUP else "generate"})
    dense = list(rows)
    for row in dense:
        row["leading_tokens_equal"] = leading_tokens_equal(row["tokens"], dense[0]["tokens"])
    fastest_first = min(dense, key=lambda r: r["ttft_s"])
    fastest_decode = max(dense, key=lambda r: r["decode_tokens_per_s"])
    config = adapter_config(model, router)
    # under generate once per compile setting, then in the module's own loop (as the static_cache_graph setup)
    elastic_setups = [(compile_decode, "generate") for compile_decode in args.compile_decode]
    elastic_setups.append((args.compile_decode[-1], "own"))
    for compile_decode, loop in elastic_setups:
        ea.attach(model, config, backend=args.backend, compile_decode=compile_decode,
                  compile_prefill=args.compile_prefill)
        ea.load_router(model, router)
        try:
            runtime = runtime_of(model)
            generate = functools.partial(own_loop_generate, elastic=True) if loop == "own" else timed_generate
            measured = warm_then_timed(model, ids, mask, args.new_tokens, pad_id, generate=generate,
                                       timed_calls=args.timed_calls)
            report = ea.routing_report(model)
            lengths = [int(n) + args.new_tokens - 1 for n in mask.sum(1).tolist()]
            element = next(model.parameters()).element_size()
            rows.append({
                **common, "mode": "elastic", "baseline": None, "msr": float(report.msr.mean()), **measured,
                "kv_cache_bytes_implied": implied_cache_bytes(report, lengths, config, runtime.head_dim, element),
                "backend": runtime.backend.name, "compile_decode": compile_decode, "decode_loop": loop,
                "compile_prefill": args.compile_prefill,
                "speedup_ttft": fastest_first["ttft_s"] / measured["ttft_s"],
                "speedup_ttft_over": fastest_first["baseline"],
                "speedup_decode": measured["decode_tokens_per_s"] / fastest_decode["decode_tokens_per_s"],
                "speedup_decode_over": fastest_decode["baseline"]})
        finally:
            ea.detach(model)
    checked = min(args.reference_rows or batch, batch)
    ea.attach(model, config, backend="reference", cache="full", cuda_graphs=False)
    ea.load_router(model, router)
    try:
        reference = timed_generate(model, ids[:checked], mask[:checked], args.new_tokens, pad_id, output_logits=True)
    finally:
        ea.detach(model)
    for row in rows[len(dense):]:
        row["leading_tokens_equal"] = leading_tokens_equal(row["tokens"], reference["tokens"])
        row["divergences"] = divergences(row["tokens"], reference["tokens"], reference["logits"])
        row["reference_rows_checked"] = checked
        row["tokens_equal_reference"] = bool(torch.equal(reference["tokens"], row["tokens"][:checked]))
    return rows


def adapter_config(model, router: str):
    """The `ElasticConfig` an adapter was trained with (read by attaching it once)."""
    import elastic_attention as ea
    from elastic_attention.integration import runtime_of

    ea.load_router(model, router)
    try:
        return runtime_of(model).config
    finally:
        ea.detach(model)


def setup_label(row: dict) -> str:
    """A row's setup in words: the dense setup's name, or ``router`` with ``, compiled``, ``, compiled prefill`` and
    ``, own loop`` as they apply."""
    if row["mode"] == "dense":
        return row["baseline"]
    return ("router" + (", compiled" if row.get("compile_decode") else "")
            + (", compiled prefill" if row.get("compile_prefill") else "")
            + (", own loop" if row.get("decode_loop") == "own" else ""))


def markdown(result: dict) -> str:
    """The results as one markdown table (a row per prompt kind, length, batch and setup)."""
    several_runs = len(result.get("runs") or []) > 1
    lines = runs_lines(result, "Request benchmark")
    lines += ["", "| prompt kind | length | batch | mode | setup | MSR | TTFT (s) | decode (tok/s) | first step (ms) | "
              "steady decode (tok/s) | peak memory (GiB) | KV cache (MiB) | tokens = reference | "
              "tokens agreeing (fewest) | first call (s) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in result["results"]:
        peak = "-" if row["peak_memory_bytes"] is None else f"{row['peak_memory_bytes'] / 2**30:.2f}"
        equal = "-" if row["tokens_equal_reference"] is None else str(row["tokens_equal_reference"]).lower()
        setup = setup_label(row)
        agreeing = row.get("leading_tokens_equal")
        agreeing = "-" if not agreeing else f"{min(agreeing)} of {result['new_tokens']}"
        margin = widest_margin(row)
        agreeing += f" ({margin})" if margin else ""
        setup += f" (run {row['run']})" if several_runs else ""
        first_step = "-" if row.get("first_step_s") is None else f"{row['first_step_s'] * 1e3:.1f}"
        steady = "-" if row.get("steady_decode_tokens_per_s") is None else f"{row['steady_decode_tokens_per_s']:.1f}"
        lines.append(f"| {row['prompt_kind']} | {row['length']} | {row['batch']} | {row['mode']} | "
                     f"{setup} | {row['msr']:.2f} | {row['ttft_s']:.3f} | "
                     f"{row['decode_tokens_per_s']:.1f} | {first_step} | {steady} | {peak} | "
                     f"{row['kv_cache_bytes'] / 2**20:.1f} | {equal} | {agreeing} | {row['first_call_s']:.2f} |")
    return "\n".join(lines) + "\n"


def run(args) -> dict:
    import transformers

    from elastic_attention.evaluation.pipeline import load_backbone

    model, tokenizer = load_backbone(args.model, args.device, args.dtype)
    # the compiled dense setups compile once per (length, batch) and step shape: past dynamo's recompile limit they
    # would run eagerly and the baseline would be slower than what a user gets
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 64))
    device = next(model.parameters()).device
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    sensitive, robust = args.tasks.split(",")
    setups, missing = chosen_setups(*dense_setups(model, device, args.compile_prefill), args.dense_setups)
    if not setups:
        raise SystemExit(f"none of --dense-setups {','.join(args.dense_setups)} runs here: {missing}")
    result = {**run_header(device), "transformers": transformers.__version__, "model": args.model,
              "router": args.router, "new_tokens": args.new_tokens, "rows_per_kind": args.rows,
              "tasks": {"sensitive": sensitive, "robust": robust}, "dense_setups": [name for name, _, _ in setups],
              "dense_setups_missing": missing, "results": []}
    for length in args.lengths:
        prompts = prompt_batches(tokenizer, args.suite, {"sensitive": sensitive, "robust": robust}, length, args.rows,
                                 args.seed)
        for batch in args.batch:
            for kind, kind_prompts in prompts.items():
                ids, mask = left_padded(kind_prompts, batch, pad_id, device)
                for row in run_cell(model, pad_id, args.router, ids, mask, args, kind, length, setups):
                    row.pop("tokens")
                    row.setdefault("tokens_equal_reference", None)
                    result["results"].append(row)
                write_result(args.out, result)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    atomic_write_text(args.out.with_suffix(".md"), markdown(result))
    return result


def compile_settings(text: str) -> list[bool]:
    """``off``, ``on`` or ``off,on`` as the `attach` ``compile_decode`` values to run."""
    names = text.split(",")
    if not names or any(name not in ("off", "on") for name in names) or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"takes off, on or off,on; got {text!r}")
    return [name == "on" for name in names]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="elastic-attention bench request", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a local Hugging Face model folder")
    parser.add_argument("--router", required=True, help="the router adapter folder for that model, or a shipped "
                        "router's name (qwen2.5-coder-1.5b-instruct, ...)")
    parser.add_argument("--tasks", default="passkey,next_line", help="SENSITIVE,ROBUST: one task of each kind")
    parser.add_argument("--suite", default="code", choices=["code", "synthetic"])
    parser.add_argument("--lengths", type=parse_tokens, default=parse_tokens("16k,32k"))
    parser.add_argument("--batch", type=lambda text: [int(b) for b in text.split(",")], default=[1, 8])
    parser.add_argument("--rows", type=int, default=4, help="rows of each kind (cycled to fill a batch)")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", default="auto", help="elastic attention's prefill backend")
    parser.add_argument("--compile-decode", type=compile_settings, default=[False, True], metavar="off,on",
                        help="elastic setups: captured decode steps with their layers as they are (off), compiled "
                             "(on), or both (off,on; the default)")
    parser.add_argument("--compile-prefill", choices=["off", "on"], default="off",
                        help="on: the elastic setups compile their prefill's decoder layers "
                             "(attach(compile_prefill=True)) and the dense setup sdpa_compiled_layers runs beside")
    parser.add_argument("--dense-setups", type=lambda text: text.split(","), default=list(DENSE_SETUPS),
                        metavar="NAME,...", help=f"dense setups to run among {','.join(DENSE_SETUPS)} (default: all "
                                                 "that run here)")
    parser.add_argument("--reference-rows", type=int, default=None, metavar="N",
                        help="check the elastic tokens against the reference path on the first N sequences of each "
                             "batch (default: all; the reference path is slow at long prompts)")
    parser.add_argument("--timed-calls", type=int, default=3, metavar="N",
                        help="timed calls of each setup after its warm-up call; each timing is their median")
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"])
    parser.add_argument("--out", type=Path, required=True)
    finish_parser(parser, "elastic-attention bench request --model artifacts/qwen2.5-coder-1.5b-instruct --router "
                          "qwen2.5-coder-1.5b-instruct --lengths 16k,32k --batch 1,8 --out request.json")
    args = parser.parse_args(argv)
    if len(args.tasks.split(",")) != 2:
        parser.error(f"--tasks takes SENSITIVE,ROBUST, got {args.tasks!r}")
    unknown = [name for name in args.dense_setups if name not in DENSE_SETUPS]
    if unknown or not args.dense_setups:
        parser.error(f"--dense-setups takes names among {','.join(DENSE_SETUPS)}, got {','.join(args.dense_setups)}")
    if args.reference_rows is not None and args.reference_rows < 1:
        parser.error(f"--reference-rows must be at least 1, got {args.reference_rows}")
    if args.timed_calls < 1:
        parser.error(f"--timed-calls must be at least 1, got {args.timed_calls}")
    if args.new_tokens < 2:
        parser.error("--new-tokens must be at least 2 (a first token and a decode step)")
    args.compile_prefill = args.compile_prefill == "on"
    return args


def main(argv=None) -> None:
    run(parse_args(argv))
