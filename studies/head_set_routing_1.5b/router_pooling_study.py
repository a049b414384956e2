"""Which prompt spans should a head-set router pool to tell the tasks apart? For each pair of spans (``first/last``:
the router's ``pool_first`` and ``pool_last``) it fits the task-label router (`studies/head_set_routing_1.5b/task_label_router.py`'s
``fit``: the project's `HeadSetRouter`, told each training row's set) on rows drawn with --train-seed and counts the
evaluation rows (--seed, the evaluation's) per set. No objective a router is trained with sorts the rows better than
its inputs allow, so the spans that sort them best are the ones worth a training run.

    python studies/head_set_routing_1.5b/router_pooling_study.py --model artifacts/qwen2.5-coder-1.5b-instruct \\
        --sets multikey=0,passkey=1,find_definition=1,next_line=2,recent_fact=2,pattern=2 \\
        --set-msrs 0,0.6071428571428571,1 --train-lengths 4k,8k,12k,16000 --lengths 8k,16k \\
        --pools 100/100,0/40,40/30,50/30 --fit-seeds 0,1,2 --predictions /tmp/pooling

Layer 0's pre-RoPE keys depend on each token alone, so a row's pooled keys for any spans are the mean of its first
``first`` and last ``last`` tokens' keys: each row runs once, on those tokens only (the router pools a prompt no
longer than its two spans whole). So the study holds for the first layer only, where a head-set router decides.
--predictions writes, per spans and fit seed, the choices in `studies/head_set_routing_1.5b/head_set_choices.py`'s format (``set_msrs``
and each row's ``logits`` per ``task@length``), which `studies/head_set_routing_1.5b/row_outcomes.py --predict` scores with the cells each
set was measured in. --out writes the table as JSON with the date, device, command and model.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from task_label_router import fit, set_of_each_task  # noqa: E402


def parse_spans(text: str) -> list[tuple[int, int]]:
    """``"100/100,0/40"`` -> [(100, 100), (0, 40)]; each pair pools at least one token."""
    spans = []
    for item in text.split(","):
        first, _, last = item.partition("/")
        if not (first.isdigit() and last.isdigit()) or int(first) + int(last) == 0:
            raise argparse.ArgumentTypeError(f"spans {item!r}: give FIRST/LAST token counts, e.g. 40/30, not 0/0")
        spans.append((int(first), int(last)))
    return spans


def span_inputs(model, router, prompt_ids: Sequence[int], spans: Sequence[tuple[int, int]]) -> torch.Tensor:
    """[len(spans), Hkv, D] float32: what a router at layer 0 pooling each pair of spans reads for ``prompt_ids``.
    ``router`` is the attached layer-0 router, pooling at least max(first) + max(last) tokens, so that each
    forward's few tokens are pooled whole."""
    from elastic_attention.integration.routing import read_router_input

    device = next(model.parameters()).device
    pooled = []
    for first, last in spans:
        if first + last > len(prompt_ids):
            raise ValueError(f"a prompt of {len(prompt_ids)} tokens is shorter than the spans {first}/{last}")
        ids = torch.tensor([list(prompt_ids[:first]) + list(prompt_ids[len(prompt_ids) - last:])], device=device)
        pooled.append(read_router_input(router, lambda: model(input_ids=ids, use_cache=False, logits_to_keep=1))[0])
    return torch.stack(pooled)


def cell_inputs(model, router, tokenizer, suite, task: str, length: int, rows: int, seed: int,
                spans: Sequence[tuple[int, int]]) -> torch.Tensor:
    """[rows, len(spans), Hkv, D]: `span_inputs` of the suite's rows of ``task`` at ``length`` (as the evaluation
    draws and encodes them)."""
    from elastic_attention.rows import encode_row

    return torch.stack([span_inputs(model, router, encode_row(tokenizer, row).prompt_ids, spans)
                        for row in suite.generate(task, length, seed, rows, tokenizer)])


def main(argv: Sequence[str] | None = None) -> dict:
    import elastic_attention as ea
    from elastic_attention.bench.timing import run_header
    from elastic_attention.cli import parse_length
    from elastic_attention.evaluation.pipeline import load_backbone, resolve_tasks
    from elastic_attention.evaluation.suites import get_suite
    from elastic_attention.io import atomic_write_text

    lengths = lambda text: [parse_length(t) for t in text.split(",")]  # noqa: E731
    numbers = lambda text: [float(t) for t in text.split(",")]  # noqa: E731
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="folder of the backbone and its tokenizer")
    parser.add_argument("--suite", default="code", choices=["synthetic", "code"])
    parser.add_argument("--sets", required=True, help="comma list task=set index: the training tasks and their sets")
    parser.add_argument("--set-msrs", type=numbers, required=True, help="comma list: each set's MSR, in index order")
    parser.add_argument("--pools", type=parse_spans, required=True, help="comma list FIRST/LAST, e.g. 100/100,40/30")
    parser.add_argument("--train-lengths", type=lengths, default=[4096, 8192, 12288, 16000])
    parser.add_argument("--train-rows", type=int, default=50, help="training rows per task and length")
    parser.add_argument("--train-seed", type=int, default=7, help="must differ from --seed")
    parser.add_argument("--tasks", default="all", help="evaluation tasks: comma list, or all / sensitive / robust")
    parser.add_argument("--lengths", type=lengths, default=[8192, 16384])
    parser.add_argument("--rows", type=int, default=50, help="evaluation rows per task and length")
    parser.add_argument("--seed", type=int, default=0, help="the evaluation's seed")
    parser.add_argument("--fit-seeds", type=lambda text: [int(t) for t in text.split(",")], default=[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--predictions", type=Path, help="folder for each fit's choices (head_set_choices format)")
    parser.add_argument("--out", type=Path, help="JSON file for the table")
    args = parser.parse_args(argv)
    if args.train_seed == args.seed:
        parser.error("--train-seed equals --seed: fit on rows apart from the ones the fit is judged on")
    try:
        target = set_of_each_task(args.sets, len(args.set_msrs))
    except ValueError as error:
        parser.error(str(error))
    suite = get_suite(args.suite)
    suite.resolve(list(target))  # unknown names are refused
    evaluation_tasks = resolve_tasks([name for name in args.tasks.split(",") if name], args.suite)

    model, tokenizer = load_backbone(args.model, device=args.device, dtype="float32")
    widest = (max(first for first, _ in args.pools), max(last for _, last in args.pools))
    ea.attach(model, ea.ElasticConfig(routed_layers=(0,), pool_first=widest[0], pool_last=widest[1]),
              backend="reference")
    (router,) = ea.routers_of(model).values()
    train, names = [], []
    for task in target:
        for length in args.train_lengths:
            train.append(cell_inputs(model, router, tokenizer, suite, task, length, args.train_rows, args.train_seed,
                                     args.pools))
            names += [task] * args.train_rows
    train = torch.cat(train)
    labels = torch.tensor([target[name] for name in names])
    evaluation = {(task, length): cell_inputs(model, router, tokenizer, suite, task, length, args.rows, args.seed,
                                              args.pools)
                  for task in evaluation_tasks for length in args.lengths}
    ea.detach(model)

    results = []
    for index, (first, last) in enumerate(args.pools):
        for fit_seed in args.fit_seeds:
            router_fit = fit(train[:, index], labels, len(args.set_msrs), args.steps, fit_seed)
            with torch.no_grad():
                trained = float((router_fit.choice_logits(train[:, index]).argmax(-1) == labels).float().mean())
                logits = {f"{task}@{length}": router_fit.choice_logits(rows[:, index]).double()
                          for (task, length), rows in evaluation.items()}
            counts = {key: torch.bincount(value.argmax(-1), minlength=len(args.set_msrs)).tolist()
                      for key, value in logits.items()}
            results.append({"pool_first": first, "pool_last": last, "fit_seed": fit_seed,
                            "training_rows_on_their_set": trained, "rows_per_set": counts})
            print(f"spans {first}/{last}, fit seed {fit_seed}: {trained:.1%} of {len(names)} training rows on their "
                  "set; evaluation rows per set (" + ", ".join(f"{msr:.3f}" for msr in args.set_msrs) + "):")
            for key, count in counts.items():
                print(f"  {key:24} {' '.join(f'{value:3d}' for value in count)}")
            if args.predictions is not None:
                args.predictions.mkdir(parents=True, exist_ok=True)
                atomic_write_text(args.predictions / f"choices_{first}_{last}_seed{fit_seed}.json", json.dumps(
                    {"set_msrs": args.set_msrs, "pool_first": first, "pool_last": last, "fit_seed": fit_seed,
                     "logits": {key: value.tolist() for key, value in logits.items()}}))
    document = {**run_header(torch.device(args.device)), "model": args.model, "sets": target,
                "set_msrs": args.set_msrs, "train_seed": args.train_seed, "train_lengths": args.train_lengths,
                "train_rows": args.train_rows, "seed": args.seed, "lengths": args.lengths, "rows": args.rows,
                "steps": args.steps, "results": results}
    if args.out is not None:
        atomic_write_text(args.out, json.dumps(document, indent=1))
    return document


if __name__ == "__main__":
    main(sys.argv[1:])
