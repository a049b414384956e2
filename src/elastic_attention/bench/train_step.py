"""Router-training steps at a large model shape: step time, throughput and peak memory per GPU.

Builds a decoder with random bf16 weights from a config (default: the Llama-3.1-8B shape; nothing is downloaded),
attaches routers, optionally turns on gradient checkpointing, shards the frozen backbone with FSDP2 when run by
torchrun on several GPUs, and times full router-training steps: forward in training mode (both attentions mixed by
the straight-through decision), the supervised loss on the last ``--answer-tokens`` positions plus the sparsity
regulariser, backward, AdamW on the routers. Each process trains on its own ``--length``-token sample per step.

  torchrun --standalone --nproc_per_node 2 -m elastic_attention.cli bench train-step --length 32k --out r.json
  elastic-attention bench train-step --device cpu --layers 2 --hidden 128 --heads 4 --kv-heads 2 \\
      --intermediate 256 --vocab 500 --length 256 --block-size 64 --sink 64 --local 128 --out /tmp/train.json
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from elastic_attention import attach, routers_of, routing_report
from elastic_attention.bench.model import add_model_arguments, build_model, elastic_config, model_fields
from elastic_attention.bench.timing import parse_tokens, run_header, write_result
from elastic_attention.help_format import finish_parser
from elastic_attention.training.distributed import distributed_rank, shard_backbone, training_device
from elastic_attention.training.objective import SparsityObjective
from elastic_attention.training.trainer import enable_gradient_checkpointing


def run(args) -> dict | None:
    rank, world_size = distributed_rank()
    device = training_device(args.device, rank)
    torch.manual_seed(args.seed)
    model = build_model(args, device, args.length)
    attach(model, elastic_config(args), backend=args.backend)
    for router in routers_of(model).values():
        router.float()
    if args.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    if world_size > 1:
        shard_backbone(model)
    model.train()
    objective = SparsityObjective({"task": args.target}, "signed").to(device)
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=1e-4)
    generator = torch.Generator(device).manual_seed(args.seed + rank)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds = []
    for step in range(args.warmup + args.steps):
        input_ids = torch.randint(0, args.vocab, (1, args.length + 1), device=device, generator=generator)
        keep = torch.arange(args.length - args.answer_tokens, args.length, device=device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        began = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        output = model(input_ids=input_ids[:, :-1], logits_to_keep=keep, use_cache=False)
        loss = torch.nn.functional.cross_entropy(output.logits[0].float(), input_ids[0, keep + 1])
        msr = routing_report(model).msr
        loss = loss + objective(msr, torch.zeros(1, dtype=torch.long, device=device))
        loss.backward()
        if world_size > 1:
            for parameter in objective.parameters():
                torch.distributed.all_reduce(parameter.grad)
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if step >= args.warmup:
            seconds.append(time.perf_counter() - began)
    step_seconds = sorted(seconds)[len(seconds) // 2]
    result = {
        "rank": rank,
        "step_seconds_median": step_seconds,
        "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
    }
    results = [result]
    if world_size > 1:
        results = [None] * world_size
        torch.distributed.all_gather_object(results, result)
        torch.distributed.destroy_process_group()
    if rank != 0:
        return None
    return {
        **run_header(device),
        "world_size": world_size,
        "model": model_fields(args),
        "length": args.length,
        "gradient_checkpointing": args.gradient_checkpointing,
        "backend": args.backend,
        "steps_timed": args.steps,
        "per_rank": results,
        "step_seconds": max(r["step_seconds_median"] for r in results),
        "tokens_per_second": world_size * args.length / max(r["step_seconds_median"] for r in results),
    }


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="elastic-attention bench train-step",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=lambda t: parse_tokens(t)[0], default=32768)
    parser.add_argument("--answer-tokens", type=int, default=64)
    parser.add_argument("--target", type=float, default=0.7, help="target MSR of the regulariser")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--backend", default="auto")
    add_model_arguments(parser)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    finish_parser(parser, "elastic-attention bench train-step --length 32k --gradient-checkpointing "
                          "--out train_step.json")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    arguments = parse_args(argv)
    result = run(arguments)
    if result is not None:
        write_result(arguments.out, result)
        print(result, flush=True)


if __name__ == "__main__":
    main()
