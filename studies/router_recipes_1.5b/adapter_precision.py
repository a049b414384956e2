"""Would a router adapter route the same if its weights were stored in float16 or bfloat16 (half the bytes of
float32)? For rows of a suite (code by default), one prefill per stored precision with the adapter's weights rounded to it
(the routers still compute in float32): how many (layer, KV head) decisions differ from the float32 adapter's.

    python studies/router_recipes_1.5b/adapter_precision.py --model artifacts/qwen2.5-coder-1.5b-instruct \
        --router artifacts/routers/qwen15_distill --length 4k --rows 2 --dtype bfloat16 --out precision.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

PRECISIONS = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def main(argv=None) -> dict:
    import elastic_attention as ea
    from elastic_attention.bench.timing import parse_tokens, run_header
    from elastic_attention.evaluation.pipeline import load_backbone
    from elastic_attention.evaluation.suites import get_suite
    from elastic_attention.integration import routers_of
    from elastic_attention.io import atomic_write_text
    from elastic_attention.rows import encode_row

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--router", required=True)
    parser.add_argument("--tasks", default="passkey,multikey,find_definition,multivalue,next_line,recent_fact,"
                                           "recent_definition,pattern")
    parser.add_argument("--suite", default="code", choices=["code", "synthetic"])
    parser.add_argument("--length", type=lambda text: parse_tokens(text)[0], default=4096)
    parser.add_argument("--rows", type=int, default=2, help="rows of each task")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], help="the model's (default: bfloat16 where the "
                                                                        "device has it natively, else float32)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    model, tokenizer = load_backbone(args.model, args.device, args.dtype)
    ea.load_router(model, args.router)
    routers = routers_of(model)
    stored = {index: {name: tensor.clone() for name, tensor in router.state_dict().items()}
              for index, router in routers.items()}
    device = next(model.parameters()).device
    result = {**run_header(device), "model": args.model, "router": args.router, "length": args.length, "rows": []}
    suite = get_suite(args.suite)
    for task in args.tasks.split(","):
        for row in suite.generate(task, args.length, args.seed, args.rows, tokenizer):
            ids = torch.tensor([encode_row(tokenizer, row).prompt_ids], device=device)
            decisions, began = {}, time.perf_counter()
            for name, dtype in PRECISIONS.items():
                for index, router in routers.items():
                    router.load_state_dict({key: value.to(dtype).float() if value.is_floating_point() else value
                                            for key, value in stored[index].items()})
                with torch.no_grad():
                    model(input_ids=ids, logits_to_keep=1, use_cache=False)
                decisions[name] = ea.routing_report(model).decisions[0].clone()
            reference = decisions["float32"]
            result["rows"].append({"task": task, "msr": float((~reference).float().mean()),
                                   "decisions": reference.numel(), "seconds": time.perf_counter() - began,
                                   **{f"differ_{name}": int((decisions[name] != reference).sum())
                                      for name in ("float16", "bfloat16")}})
            print(json.dumps(result["rows"][-1]), flush=True)
    total = sum(row["decisions"] for row in result["rows"])
    result["differ"] = {name: sum(row[f"differ_{name}"] for row in result["rows"]) / total
                        for name in ("float16", "bfloat16")}
    atomic_write_text(args.out, json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
