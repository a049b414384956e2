"""Is there a set of full-attention KV heads at a given MSR that keeps a task, or several tasks at once, at a length?
A greedy search: from every KV head on full attention, each round moves to sparse attention the ``--step`` full heads
whose move raises the answer cross-entropy least (teacher-forced, over ``--search-samples`` rows of each task drawn
with ``--search-seed``, apart from the evaluation's rows), until the largest MSR asked. With several ``--tasks`` the
search is joint, one set for every input as a static hybrid deploys it (DuoAttention-style): its score is the mean
over the tasks of each task's mean answer cross-entropy, so every task weighs the same whatever its answer length.

    python scripts/head_set_search.py --model /tmp/qwen2.5-coder-1.5b-instruct \
        --config configs/qwen2.5_coder_1.5b_code.yaml --tasks sensitive --length 16k \
        --msr 0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8 --search-samples 2 --samples 0 --out search.json

With ``--start FILE@MSR`` the search prunes from a point of another search's path instead of from full attention
(e.g. the joint search's set at 0.6, pruned further on one task: a set for that task alone, sparser than the joint
one); the earlier path up to that point then begins this file's path, so its points are sets of the same model.

The file records the greedy path head by head (``path``: every head moved, in order; within a round by rising
cost), so any point of it is a head set (`elastic_attention.head_sets`: ``eval --modes heads@0.35 --head-set FILE``),
and keeps the sets at the MSRs asked. With ``--samples N`` > 0 each kept set is then evaluated like `elastic-attention
eval` (generated answers, seed 0, N rows of each task) next to full attention and all-sparse; ``--samples 0`` leaves
that to `elastic-attention eval`. A set found that keeps 97% of full attention shows such a set exists (the routers
could learn it); none found is evidence, not proof, that none exists (greedy removal ignores heads that matter only
together). Writes every round (the heads moved, the score) to --out as it ends, the sets after the search, then
again after each set's evaluation.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence

import torch


def greedy_prune(score: Callable[[torch.Tensor], float], shape: tuple[int, int], targets: Sequence[int], step: int,
                 on_round: Callable[[dict], None] | None = None,
                 start: torch.Tensor | None = None) -> tuple[dict[int, torch.Tensor], list[dict]]:
    """Greedy backward elimination of full-attention heads.

    Args:
        score: loss of a head set ([layers, Hkv] bool, True = full attention); lower is better.
        shape: (layers, Hkv).
        targets: numbers of sparse heads at which to keep the set reached (each in 1..layers * Hkv, above the
            start's).
        step: heads moved to sparse per round at most (a round never passes a target).
        on_round: called with each round's record as it ends (progress).
        start: the set to prune from ([layers, Hkv] bool); ``None``: every head on full attention.

    Returns:
        ``{sparse heads: head set}`` for every target, and one record per round: the sparse count after it, the
        heads moved (layer, head) and the score after the move.
    """
    total = shape[0] * shape[1]
    routing = torch.ones(shape, dtype=torch.bool) if start is None else start.clone()
    if tuple(routing.shape) != tuple(shape) or routing.dtype != torch.bool:
        raise ValueError(f"the start set must be a {tuple(shape)} bool tensor, got {tuple(routing.shape)} "
                         f"{routing.dtype}")
    first = int((~routing).sum())
    if step < 1 or not targets or any(not first < target <= total for target in targets):
        raise ValueError(f"targets must lie in {first + 1}..{total} and step must be at least 1, got "
                         f"{list(targets)}, {step}")
    sets, rounds = {}, []
    for target in sorted(set(targets)):
        while int((~routing).sum()) < target:
            moves = min(step, target - int((~routing).sum()))
            candidates = [(layer, head) for layer, head in routing.nonzero().tolist()]
            costs = []
            for layer, head in candidates:
                trial = routing.clone()
                trial[layer, head] = False
                costs.append(score(trial))
            chosen = sorted(range(len(candidates)), key=lambda index: costs[index])[:moves]
            for index in chosen:
                routing[candidates[index]] = False
            rounds.append({"sparse_heads": int((~routing).sum()), "moved": [list(candidates[i]) for i in chosen],
                           "score": costs[chosen[0]] if moves == 1 else score(routing)})
            if on_round is not None:
                on_round(rounds[-1])
        sets[target] = routing.clone()
    return sets, rounds


def answer_cross_entropy(model, packs, device) -> Callable[[torch.Tensor], float]:
    """``score(head set)``: the answer cross-entropy over ``packs`` (nats per answer token) with those heads on full
    attention and the others on sparse attention; the `joint_score` of the tasks when the packs hold several."""
    return joint_score(task_cross_entropy(model, packs, device))


def joint_score(per_task: Callable[[torch.Tensor], dict[str, float]]) -> Callable[[torch.Tensor], float]:
    """``score(head set)``: the mean over tasks of ``per_task(head set)`` (task -> that task's mean loss), so every
    task weighs the same whatever its number of rows or answer tokens."""

    def score(routing: torch.Tensor) -> float:
        return mean_over_tasks(per_task(routing))

    return score


def mean_over_tasks(losses: dict[str, float]) -> float:
    """The joint score of per-task losses: their plain mean."""
    return sum(losses.values()) / len(losses)


def task_cross_entropy(model, packs, device) -> Callable[[torch.Tensor], dict[str, float]]:
    """``score(head set)``: task -> mean answer cross-entropy of that task's rows in ``packs`` (nats per answer
    token), the model's routing forced to the head set ([layers, Hkv] bool, True = full attention)."""
    from elastic_attention.integration import force_routing
    from elastic_attention.training.trainer import supervised_token_losses

    @torch.no_grad()
    def score(routing: torch.Tensor) -> dict[str, float]:
        sums: dict[str, list[float]] = {}
        force_routing(model, routing)
        try:
            for pack in packs:
                losses, samples = supervised_token_losses(model, pack, device)
                per_sample = torch.bincount(samples, weights=losses.double().cpu(), minlength=len(pack.tasks))
                tokens = torch.bincount(samples, minlength=len(pack.tasks))
                for task, total, count in zip(pack.tasks, per_sample.tolist(), tokens.tolist()):
                    entry = sums.setdefault(task, [0.0, 0])
                    entry[0] += total
                    entry[1] += count
        finally:
            force_routing(model, None)
        return {task: total / count for task, (total, count) in sums.items()}

    return score


def main(argv: Sequence[str] | None = None) -> dict:
    from elastic_attention import attach
    from elastic_attention.bench.timing import run_header
    from elastic_attention.cli import parse_length
    from elastic_attention.errors import ConfigError
    from elastic_attention.evaluation.pipeline import load_backbone, resolve_tasks
    from elastic_attention.evaluation.runner import run_evaluation
    from elastic_attention.evaluation.suites import suite_of
    from elastic_attention.head_sets import read_head_sets, split_set_reference
    from elastic_attention.integration import runtime_of
    from elastic_attention.io import atomic_write_text
    from elastic_attention.rows import encode_row
    from elastic_attention.training.data import pack_rows
    from elastic_attention.training.train_config import TrainConfig

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="folder of the backbone and its tokenizer")
    parser.add_argument("--config", required=True, help="a training config: its `elastic` settings are used")
    parser.add_argument("--tasks", required=True, help="comma list of tasks, or sensitive / robust / all; several "
                                                       "make a joint search")
    parser.add_argument("--suite", default="code", choices=["synthetic", "code"], help="suite of the task groups")
    parser.add_argument("--length", type=parse_length, required=True, help="prompt length, e.g. 16k")
    parser.add_argument("--msr", default="0.5,0.6,0.7", help="comma list of MSRs at which to keep and evaluate the set")
    parser.add_argument("--start", metavar="FILE@MSR",
                        help="prune from this point of another search's path (e.g. the joint search's set at 0.6, "
                             "to go on with one task); the file's path up to it starts this one's")
    parser.add_argument("--step", type=int, default=4, help="heads moved to sparse attention per round at most")
    parser.add_argument("--search-samples", type=int, default=8, help="search rows of each task")
    parser.add_argument("--search-seed", type=int, default=1, help="seed of the search rows (the evaluation uses 0)")
    parser.add_argument("--pack-tokens", type=int, default=65536, help="token budget of one forward of search rows")
    parser.add_argument("--samples", type=int, default=50,
                        help="evaluation rows of each task (seed 0, as elastic-attention eval); 0: no evaluation")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], help="default: bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    tasks = resolve_tasks([name for name in args.tasks.split(",") if name.strip()], args.suite)
    msrs = [float(text) for text in args.msr.split(",") if text.strip()]
    if not msrs or any(not 0.0 < msr <= 1.0 for msr in msrs):
        parser.error(f"--msr must list numbers in (0, 1], got {args.msr!r}")

    start, start_path = None, []
    if args.start:  # read before the model loads: a wrong file or MSR fails at once
        try:
            file, start_msr = split_set_reference(args.start, option="--start")
            earlier = read_head_sets(file, option="--start")
            start = earlier.at(start_msr, msr_option="--start")
        except ConfigError as error:
            parser.error(str(error))
        start_path = [list(head) for head in earlier.path[:int((~start).sum())]]
        if {tuple(head) for head in start_path} != {tuple(head) for head in (~start).nonzero().tolist()}:
            parser.error(f"--start {args.start}: not a point of that file's path (give a file of "
                         "scripts/head_set_search.py and an MSR its path reaches)")

    model, tokenizer = load_backbone(args.model, device=args.device, dtype=args.dtype)
    attach(model, TrainConfig.from_yaml(args.config).elastic_config)
    runtime = runtime_of(model)
    shape = (len(runtime.routed_layers), runtime.num_kv_heads)
    total = shape[0] * shape[1]
    targets = {msr: max(1, round(msr * total)) for msr in msrs}
    if start is not None:
        if tuple(start.shape) != shape:
            parser.error(f"--start {args.start}: its sets are {list(start.shape)} ([layers, KV heads]), this model "
                         f"routes {list(shape)} (give a search of this model)")
        if any(target <= len(start_path) for target in targets.values()):
            parser.error(f"--msr {args.msr}: every MSR must lie above the start's ({len(start_path) / total:.3f})")

    rows = [row for task in tasks
            for row in suite_of(task).generate(task, args.length, args.search_seed, args.search_samples, tokenizer)]
    packs = pack_rows([encode_row(tokenizer, row) for row in rows], args.pack_tokens)
    device = next(model.parameters()).device
    per_task = task_cross_entropy(model, packs, device)
    full_tasks = per_task(torch.ones(shape, dtype=torch.bool))
    sparse_tasks = per_task(torch.zeros(shape, dtype=torch.bool))
    full_score, sparse_score = mean_over_tasks(full_tasks), mean_over_tasks(sparse_tasks)
    print(f"answer cross-entropy: full {full_score:.4f}, all sparse {sparse_score:.4f} ({len(packs)} packs of "
          f"{len(rows)} rows)", flush=True)

    result = {
        **run_header(device),
        "model": args.model, "tasks": tasks, "length": args.length, "search_samples": args.search_samples,
        "search_seed": args.search_seed, "samples": args.samples, "step": args.step, "shape": list(shape),
        "cross_entropy_full": full_score, "cross_entropy_sparse": sparse_score,
        "task_cross_entropy_full": full_tasks, "task_cross_entropy_sparse": sparse_tasks, "start": args.start,
        "rounds": [], "path": list(start_path),
    }

    started = time.perf_counter()

    def report(record: dict) -> None:  # each round is written as it ends, should the search be cut
        record["seconds"] = round(time.perf_counter() - started, 1)  # since the search's first round began
        print(f"  {record['sparse_heads']:3d} sparse heads (MSR {record['sparse_heads'] / total:.3f}): "
              f"score {record['score']:.4f}, moved {record['moved']}", flush=True)
        result["rounds"].append(record)
        result["path"].extend(record["moved"])
        atomic_write_text(args.out, json.dumps(result, indent=1))

    score = answer_cross_entropy(model, packs, device)
    sets, _ = greedy_prune(score, shape, sorted(targets.values()), args.step, on_round=report, start=start)
    result["sets"] = [{"msr_asked": msr, "full_heads": sets[target].tolist()} for msr, target in targets.items()]
    atomic_write_text(args.out, json.dumps(result, indent=1))  # the search alone, should the evaluation be cut
    if args.samples <= 0:
        return result

    baseline = run_evaluation(model, tokenizer, modes=["full", "sparse"], tasks=tasks, lengths=[args.length],
                              samples=args.samples, batch_size=args.batch_size)
    full = {cell.task: cell.accuracy for cell in baseline if cell.mode == "full"}
    result["full_accuracy"] = full
    result["sparse_accuracy"] = {cell.task: cell.accuracy for cell in baseline if cell.mode == "sparse"}
    for entry, target in zip(result["sets"], targets.values()):
        cells = run_evaluation(model, tokenizer, modes=["heads"], tasks=tasks, lengths=[args.length],
                               samples=args.samples, static_routing=sets[target], batch_size=args.batch_size)
        kept = {cell.task: cell.accuracy / full[cell.task] if full[cell.task] else math.nan for cell in cells}
        print(f"MSR {cells[0].msr:.3f}: " + ", ".join(f"{cell.task} {cell.accuracy:.3f} ({kept[cell.task]:.0%} of "
                                                     f"full attention's {full[cell.task]:.3f})" for cell in cells),
              flush=True)
        entry.update(msr=cells[0].msr, accuracy={cell.task: cell.accuracy for cell in cells}, kept=kept,
                     predictions={cell.task: cell.predictions for cell in cells})
        atomic_write_text(args.out, json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
