"""Which head set does a head-set router adapter choose for each prompt, and how would a sparsity price fitted on other
rows move those choices? For the evaluation's rows of each task and length (same suite, seed and encoding as
`elastic-attention eval`), runs every prompt up to the router (its layer's pooled keys: nothing after them is
computed, so 16K prompts take about a second on a CPU) and counts the prompts per set.

With --calibrate-tasks it also fits a **sparsity price** on rows of those tasks drawn with --calibrate-seed (rows
apart from the evaluation's): the router then chooses argmax_c (logit_c - price * MSR_c) instead of argmax_c logit_c,
and the price is the smallest that sends every calibration row of a sensitive task to the set with the most full
heads, plus --price-margin. The table shows each task's choices before and after. --write-adapter stores the router
with the price folded into its output bias (each set's logit lowered by price * its MSR), an adapter every loader
reads as it reads the original.

    python studies/head_set_routing_1.5b/head_set_choices.py --model artifacts/qwen2.5-coder-1.5b-instruct \
        --router src/elastic_attention/assets/routers/qwen2.5-coder-1.5b-instruct --lengths 8k,16k --rows 50 \
        --calibrate-tasks passkey,multikey,find_definition,next_line,recent_fact,pattern \
        --calibrate-lengths 4k,8k,16k --calibrate-rows 20 --calibrate-seed 7 --out choices.json

--out writes the table, the price and each row's logits as JSON with the date, device, command, model and router.
--inputs FILE keeps every row's pooled keys (safetensors): a later call with the same file scores another router of
the same model and layer without running the model (e.g. `real_model_1.5b_eval_router_inputs_cpu_2026-12-06.safetensors`
in benchmarks/results, the evaluation's 50 rows of every task at 8K and 16K).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from router_input_probe import pooled_router_input  # noqa: E402


def choice_logits(model, router, tokenizer, task: str, length: int, rows: int, seed: int,
                  kept_inputs: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """[rows, C] float64: the router's logits over its sets for the evaluation's rows of ``task`` at ``length``.
    ``kept_inputs`` (`read_inputs`) serves the rows' pooled keys where it holds them and keeps those it computes."""
    from elastic_attention.evaluation.suites import suite_of
    from elastic_attention.rows import encode_row

    key = f"{task}@{length}@{seed}@{rows}"
    pooled = None if kept_inputs is None else kept_inputs.get(key)
    if pooled is None:
        pooled = []
        for row in suite_of(task).generate(task, length, seed, rows, tokenizer):
            ids = torch.tensor([encode_row(tokenizer, row).prompt_ids])
            pooled.append(pooled_router_input(model, router, ids))
        pooled = torch.cat(pooled)
        if kept_inputs is not None:
            kept_inputs[key] = pooled
    with torch.no_grad():
        return router.choice_logits(pooled.to(router.head_sets.device)).double().cpu()


def spans_label(pooling: Sequence[int]) -> str:
    """How a kept inputs file names the spans its keys were pooled over: (40, 30) -> ``"40 + 30"``."""
    first, last = pooling
    return f"{first} + {last}"


def inputs_metadata(model_folder: str, layer: int, dtype: torch.dtype, pooling: tuple[int, int]) -> dict[str, str]:
    """What the pooled keys depend on besides the rows: the model (its folder's name, so that a kept file serves the
    same model in another checkout), the router's layer, the dtype and the pooled spans (pool_first, pool_last)."""
    return {"model": Path(model_folder).resolve().name, "layer": str(layer), "dtype": str(dtype),
            "pooling": spans_label(pooling)}


def load_kept_inputs(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """What a kept inputs file holds: ``task@length@seed@rows`` -> [rows, Hkv, D] float32 pooled keys, in key
    order, and the metadata they were written with (`inputs_metadata`)."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as handle:
        return ({key: handle.get_tensor(key).float() for key in sorted(handle.keys())}, handle.metadata() or {})


def read_inputs(path: Path, metadata: dict[str, str]) -> dict[str, torch.Tensor]:
    """The pooled keys an earlier call kept in ``path`` (`load_kept_inputs`), or nothing when there is no file yet.
    Refuses a file written for another model, router layer, dtype or pooled spans."""
    if not path.exists():
        return {}
    cells, written = load_kept_inputs(path)
    if written != metadata:
        raise SystemExit(f"{path} holds router inputs of {written}, not {metadata}: name another --inputs file")
    return cells


def write_inputs(path: Path, inputs: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    from safetensors.torch import save

    from elastic_attention.io import atomic_write_bytes

    atomic_write_bytes(path, save({key: value.contiguous() for key, value in inputs.items()}, metadata=metadata))


def fit_price(sensitive_logits: torch.Tensor, msrs: torch.Tensor, margin: float) -> float:
    """The smallest price >= 0 at which argmax_c (logit_c - price * msr_c) is the lowest-MSR set for every row of
    ``sensitive_logits`` [M, C], plus ``margin``. Row r needs price > (logit_c - logit_lowest) / (msr_c - msr_lowest)
    for every sparser set c."""
    lowest = int(msrs.argmin())
    sparser = msrs > msrs[lowest]
    needed = (sensitive_logits[:, sparser] - sensitive_logits[:, lowest : lowest + 1]) / (msrs[sparser] - msrs[lowest])
    return max(0.0, float(needed.max())) + margin if needed.numel() else 0.0


def choices(logits: torch.Tensor, msrs: torch.Tensor, price: float) -> torch.Tensor:
    """[M] the set each row chooses at ``price``."""
    return (logits - price * msrs).argmax(dim=-1)


def set_labels(msrs: torch.Tensor) -> list[str]:
    """Each set's name in the tables: its MSR (``"0.500"``), with its index when another set has the same MSR
    (``"0.500 #1"``: sets from several search files)."""
    names = [f"{float(msr):.3f}" for msr in msrs]
    return [f"{name} #{c}" if names.count(name) > 1 else name for c, name in enumerate(names)]


def summary(task: str, kind: str, length: int, logits: torch.Tensor, msrs: torch.Tensor, price: float) -> dict:
    """A task's share of rows per set (keyed by `set_labels`) and mean MSR, without and with the price."""
    record = {"task": task, "kind": kind, "length": length, "rows": len(logits)}
    for name, value in (("argmax", 0.0), ("priced", price)):
        chosen = choices(logits, msrs, value)
        record[name] = {"msr": float(msrs[chosen].mean()),
                        "share_per_set": {label: float((chosen == c).double().mean())
                                          for c, label in enumerate(set_labels(msrs))}}
    return record


def main(argv: Sequence[str] | None = None) -> dict:
    from elastic_attention.adapters import load_router, save_router
    from elastic_attention.bench.timing import run_header
    from elastic_attention.cli import parse_length
    from elastic_attention.evaluation.pipeline import load_backbone, resolve_tasks
    from elastic_attention.evaluation.suites import get_suite
    from elastic_attention.integration import routers_of, runtime_of
    from elastic_attention.io import atomic_write_text
    from elastic_attention.router import HeadSetRouter

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="folder of the backbone and its tokenizer")
    parser.add_argument("--router", required=True, help="adapter folder of a head-set router")
    parser.add_argument("--suite", default="code", choices=["synthetic", "code"])
    parser.add_argument("--tasks", default="all", help="comma list of tasks to tabulate, or all / sensitive / robust")
    lengths = lambda text: [parse_length(t) for t in text.split(",")]  # noqa: E731
    parser.add_argument("--lengths", type=lengths, default=[8192])
    parser.add_argument("--rows", type=int, default=50, help="rows per task and length")
    parser.add_argument("--seed", type=int, default=0, help="the evaluation's seed")
    parser.add_argument("--calibrate-tasks", default="", help="comma list: fit the price on these tasks' rows")
    parser.add_argument("--calibrate-lengths", type=lengths, default=[4096, 8192, 16384])
    parser.add_argument("--calibrate-rows", type=int, default=20, help="rows per calibration task and length")
    parser.add_argument("--calibrate-seed", type=int, default=7, help="must differ from --seed")
    parser.add_argument("--price-margin", type=float, default=0.5, help="added to the fitted price (logits per MSR)")
    parser.add_argument("--write-adapter", type=Path, help="folder for the router with the price folded in")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], help="default: bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--inputs", type=Path, help="safetensors file keeping the rows' pooled keys (read where it "
                        "holds them, the rest added): another router of the same layer and spans is then scored in "
                        "seconds")
    parser.add_argument("--out", type=Path, help="JSON file for the table")
    args = parser.parse_args(argv)
    calibration_tasks = [name for name in args.calibrate_tasks.split(",") if name]
    if calibration_tasks and args.calibrate_seed == args.seed:
        parser.error("--calibrate-seed equals --seed: fit the price on rows apart from the ones it is judged on")
    if args.write_adapter is not None and not calibration_tasks:
        parser.error("--write-adapter needs --calibrate-tasks (the price is fitted on them)")

    model, tokenizer = load_backbone(args.model, device=args.device, dtype=args.dtype)
    load_router(model, args.router, backend="reference")
    layer, router = next(iter(routers_of(model).items()))
    if not isinstance(router, HeadSetRouter):
        parser.error(f"{args.router} holds per-head routers, not a head-set router: studies/router_recipes_0.5b/router_margins.py "
                     "reads those")
    router.eval()
    suite = get_suite(args.suite)
    msrs = router.set_msrs().cpu()
    elastic = runtime_of(model).config
    metadata = inputs_metadata(args.model, layer, next(model.parameters()).dtype,
                               (elastic.pool_first, elastic.pool_last))
    kept_inputs = read_inputs(args.inputs, metadata) if args.inputs is not None else None
    kept_before = set(kept_inputs or ())

    price, calibration = 0.0, []
    if calibration_tasks:
        suite.resolve(calibration_tasks)  # unknown names are refused
        for task in calibration_tasks:
            for length in args.calibrate_lengths:
                logits = choice_logits(model, router, tokenizer, task, length, args.calibrate_rows, args.calibrate_seed,
                                       kept_inputs)
                calibration.append((task, length, logits))
        sensitive = [logits for task, _, logits in calibration if suite.kind(task) == "sensitive"]
        if not sensitive:
            parser.error("--calibrate-tasks has no sensitive task: the price is fitted on sensitive rows")
        price = fit_price(torch.cat(sensitive), msrs, args.price_margin)

    table, logits_per_cell = [], {}
    for task in resolve_tasks([name for name in args.tasks.split(",") if name], args.suite):
        for length in args.lengths:
            logits = choice_logits(model, router, tokenizer, task, length, args.rows, args.seed, kept_inputs)
            logits_per_cell[f"{task}@{length}"] = logits.tolist()
            table.append(summary(task, suite.kind(task), length, logits, msrs, price))
    if args.inputs is not None and set(kept_inputs) != kept_before:  # a file that holds every row stays untouched
        write_inputs(args.inputs, kept_inputs, metadata)
    calibration_table = [summary(task, suite.kind(task), length, logits, msrs, price)
                         for task, length, logits in calibration]

    print(f"sets (MSR): {', '.join(set_labels(msrs))}; price {price:.3f} logits per unit of MSR"
          + (f" (fitted on {', '.join(calibration_tasks)}, seed {args.calibrate_seed})" if calibration_tasks else ""))
    for label, records in (("calibration rows", calibration_table), ("evaluation rows", table)):
        if not records:
            continue
        print(f"{label}: task, length, MSR and share of rows per set, argmax -> priced")
        for record in records:
            shares = lambda key: " ".join(f"{share:.2f}" for share in record[key]["share_per_set"].values())  # noqa: E731
            print(f"  {record['task']:18} {record['kind']:9} {record['length']:6d}  MSR {record['argmax']['msr']:.3f} "
                  f"[{shares('argmax')}] -> {record['priced']['msr']:.3f} [{shares('priced')}]")

    if args.write_adapter is not None:
        with torch.no_grad():
            output = router.router_mlp[-1].bias
            output -= (price * msrs).to(output)
        save_router(model, args.write_adapter)
        print(f"wrote {args.write_adapter}: the router with the price folded into its output bias")
    document = {**run_header(next(model.parameters()).device), "model": args.model, "router": args.router,
                "set_msrs": msrs.tolist(), "price": price, "calibration_tasks": calibration_tasks,
                "calibration_seed": args.calibrate_seed if calibration_tasks else None,
                "calibration": calibration_table, "results": table, "logits": logits_per_cell}
    if args.out is not None:
        atomic_write_text(args.out, json.dumps(document, indent=1))
    return document


if __name__ == "__main__":
    main(sys.argv[1:])
