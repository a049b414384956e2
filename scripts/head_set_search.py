"""Is there a set of full-attention KV heads at a given MSR that keeps a task's accuracy at a length? A greedy search:
from every KV head on full attention, each round moves to sparse attention the ``--step`` full heads whose move
raises the answer's cross-entropy least (teacher-forced, over ``--search-samples`` rows drawn with ``--search-seed``,
apart from the evaluation's rows), until the largest MSR asked. The head set reached at each MSR is then evaluated like
`elastic-attention eval` (generated answers, seed 0, ``--samples`` rows) next to full attention and all-sparse.

    python scripts/head_set_search.py --model /tmp/qwen2.5-coder-0.5b-instruct \
        --config configs/qwen2.5_coder_code_six_tasks.yaml --task passkey --length 16k --msr 0.5,0.6,0.7 \
        --out search.json

A set found that keeps 97% of full attention shows such a set exists (the routers could learn it); none found is
evidence, not proof, that none exists (greedy removal ignores heads that matter only together). Writes every round
(the heads moved, the cross-entropy) to --out as it ends, the sets after the search, then again after each set's
evaluation.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence

import torch


def greedy_prune(score: Callable[[torch.Tensor], float], shape: tuple[int, int], targets: Sequence[int], step: int,
                 on_round: Callable[[dict], None] | None = None) -> tuple[dict[int, torch.Tensor], list[dict]]:
    """Greedy backward elimination of full-attention heads.

    Args:
        score: loss of a head set ([layers, Hkv] bool, True = full attention); lower is better.
        shape: (layers, Hkv).
        targets: numbers of sparse heads at which to keep the set reached (each in 1..layers * Hkv).
        step: heads moved to sparse per round at most (a round never passes a target).
        on_round: called with each round's record as it ends (progress).

    Returns:
        ``{sparse heads: head set}`` for every target, and one record per round: the sparse count after it, the
        heads moved (layer, head) and the score after the move.
    """
    total = shape[0] * shape[1]
    if step < 1 or not targets or any(not 0 < target <= total for target in targets):
        raise ValueError(f"targets must lie in 1..{total} and step must be at least 1, got {list(targets)}, {step}")
    routing = torch.ones(shape, dtype=torch.bool)
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
    """``score(head set)``: the mean answer cross-entropy over ``packs`` (nats per answer token) with those heads
    on full attention and the others on sparse attention."""
    from elastic_attention.integration import force_routing
    from elastic_attention.training.data import IGNORE_INDEX
    from elastic_attention.training.trainer import supervised_loss

    tokens = [int((pack.labels != IGNORE_INDEX).sum()) for pack in packs]

    @torch.no_grad()
    def score(routing: torch.Tensor) -> float:
        force_routing(model, routing)
        try:
            losses = [float(supervised_loss(model, pack, device)) for pack in packs]
        finally:
            force_routing(model, None)
        return sum(loss * count for loss, count in zip(losses, tokens)) / sum(tokens)

    return score


def main(argv: Sequence[str] | None = None) -> dict:
    from elastic_attention import attach
    from elastic_attention.bench.timing import run_header
    from elastic_attention.cli import parse_length
    from elastic_attention.evaluation.pipeline import load_backbone
    from elastic_attention.evaluation.runner import run_evaluation
    from elastic_attention.evaluation.suites import suite_of
    from elastic_attention.integration import runtime_of
    from elastic_attention.io import atomic_write_text
    from elastic_attention.rows import encode_row
    from elastic_attention.training.data import pack_rows
    from elastic_attention.training.train_config import TrainConfig

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="folder of the backbone and its tokenizer")
    parser.add_argument("--config", required=True, help="a training config: its `elastic` settings are used")
    parser.add_argument("--task", required=True)
    parser.add_argument("--length", type=parse_length, required=True, help="prompt length, e.g. 16k")
    parser.add_argument("--msr", default="0.5,0.6,0.7", help="comma list of MSRs at which to keep and evaluate the set")
    parser.add_argument("--step", type=int, default=4, help="heads moved to sparse attention per round at most")
    parser.add_argument("--search-samples", type=int, default=8)
    parser.add_argument("--search-seed", type=int, default=1, help="seed of the search rows (the evaluation uses 0)")
    parser.add_argument("--pack-tokens", type=int, default=65536, help="token budget of one forward of search rows")
    parser.add_argument("--samples", type=int, default=50, help="evaluation rows (seed 0, as elastic-attention eval)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], help="default: bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    model, tokenizer = load_backbone(args.model, device=args.device, dtype=args.dtype)
    attach(model, TrainConfig.from_yaml(args.config).elastic_config)
    runtime = runtime_of(model)
    shape = (len(runtime.routed_layers), runtime.num_kv_heads)
    total = shape[0] * shape[1]
    msrs = [float(text) for text in args.msr.split(",") if text.strip()]
    if not msrs or any(not 0.0 < msr <= 1.0 for msr in msrs):
        parser.error(f"--msr must list numbers in (0, 1], got {args.msr!r}")
    targets = {msr: max(1, round(msr * total)) for msr in msrs}

    rows = suite_of(args.task).generate(args.task, args.length, args.search_seed, args.search_samples, tokenizer)
    packs = pack_rows([encode_row(tokenizer, row) for row in rows], args.pack_tokens)
    score = answer_cross_entropy(model, packs, next(model.parameters()).device)
    full_score, sparse_score = score(torch.ones(shape, dtype=torch.bool)), score(torch.zeros(shape, dtype=torch.bool))
    print(f"answer cross-entropy: full {full_score:.4f}, all sparse {sparse_score:.4f} ({len(packs)} packs)",
          flush=True)

    result = {
        **run_header(next(model.parameters()).device),
        "model": args.model, "task": args.task, "length": args.length, "search_samples": args.search_samples,
        "search_seed": args.search_seed, "samples": args.samples, "step": args.step,
        "cross_entropy_full": full_score, "cross_entropy_sparse": sparse_score, "rounds": [],
    }

    def report(record: dict) -> None:  # each round is written as it ends, should the search be cut
        print(f"  {record['sparse_heads']:3d} sparse heads (MSR {record['sparse_heads'] / total:.3f}): "
              f"cross-entropy {record['score']:.4f}, moved {record['moved']}", flush=True)
        result["rounds"].append(record)
        atomic_write_text(args.out, json.dumps(result, indent=1))

    sets, _ = greedy_prune(score, shape, sorted(targets.values()), args.step, on_round=report)
    result["sets"] = [{"msr_asked": msr, "full_heads": sets[target].tolist()} for msr, target in targets.items()]
    atomic_write_text(args.out, json.dumps(result, indent=1))  # the search alone, should the evaluation be cut

    baseline = run_evaluation(model, tokenizer, modes=["full", "sparse"], tasks=[args.task], lengths=[args.length],
                              samples=args.samples, batch_size=args.batch_size)
    result["full_accuracy"], result["sparse_accuracy"] = baseline[0].accuracy, baseline[1].accuracy
    for entry, target in zip(result["sets"], targets.values()):
        (cell,) = run_evaluation(model, tokenizer, modes=["heads"], tasks=[args.task], lengths=[args.length],
                                 samples=args.samples, static_routing=sets[target], batch_size=args.batch_size)
        kept = cell.accuracy / result["full_accuracy"] if result["full_accuracy"] else math.nan
        print(f"MSR {cell.msr:.3f}: accuracy {cell.accuracy:.3f} ({kept:.0%} of full attention's "
              f"{result['full_accuracy']:.3f})", flush=True)
        entry.update(msr=cell.msr, accuracy=cell.accuracy, kept=kept, predictions=cell.predictions)
        atomic_write_text(args.out, json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
