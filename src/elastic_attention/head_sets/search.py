"""The greedy head-set search behind ``elastic-attention search-heads``.

Is there a set of full-attention KV heads at a given MSR that keeps a task, or several tasks at once, at a length?
From every KV head on full attention, each round moves to sparse attention the ``step`` full heads whose move raises
the answer cross-entropy least (teacher-forced, over ``search_samples`` rows of each task drawn with
``search_seed``, apart from the evaluation's rows), until the largest MSR asked. With several tasks the search is
joint, one set for every input as a static hybrid deploys it (DuoAttention-style): its score is the mean over the
tasks of each task's mean answer cross-entropy, so every task weighs the same whatever its answer length.

With ``start`` (``FILE@MSR``) the search prunes from a point of another search's path instead of from full attention
(e.g. the joint search's set at 0.6, pruned further on one task: a set for that task alone, sparser than the joint
one); the earlier path up to that point then begins this file's path, so its points are sets of the same model.

The file (format: `head_sets.files`) records the greedy path head by head (``path``: every head moved, in order;
within a round by rising cost), so any point of it is a head set (``eval --modes heads@0.35 --head-set FILE``), and
keeps the sets at the MSRs asked. With ``samples`` > 0 each kept set is then evaluated as `elastic-attention eval`
does (generated answers, seed 0, ``samples`` rows of each task) next to full attention and all-sparse. A set found
that keeps 97% of full attention shows such a set exists (routers could learn it); none found is evidence, not
proof, that none exists (greedy removal ignores heads that matter only together). The file is rewritten after every
round, after the search and after each set's evaluation, so a run cut short keeps what it did.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from elastic_attention.config import ElasticConfig
from elastic_attention.errors import ConfigError, InputError
from elastic_attention.head_sets.files import read_head_sets, split_set_reference

logger = logging.getLogger(__name__)

#: MSRs at which a search keeps its set when none are asked.
DEFAULT_MSRS = (0.5, 0.6, 0.7)


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

    Raises:
        ValueError: a start of another shape or dtype, a target outside its range, or a step below 1.
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
    from elastic_attention.training.losses import supervised_token_losses

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


def read_start(reference: str) -> tuple[torch.Tensor, list[list[int]]]:
    """The set at ``FILE@MSR`` of an earlier search ([layers, Hkv] bool, True = full attention) and that search's
    path up to it (the (layer, head) pairs it made sparse, in order).

    Raises:
        ConfigError: not ``FILE@MSR``, not a head-set file, an MSR the file neither keeps nor reaches, or a set that
            is not a point of the file's path.
    """
    file, msr = split_set_reference(reference, option="--start")
    earlier = read_head_sets(file, option="--start")
    start = earlier.at(msr, msr_option="--start")
    path = [list(head) for head in earlier.path[:int((~start).sum())]]
    if {tuple(head) for head in path} != {tuple(head) for head in (~start).nonzero().tolist()}:
        raise ConfigError(f"--start {reference}: not a point of that file's path (give a file `elastic-attention "
                          f"search-heads` wrote and an MSR its path reaches)")
    return start, path


def run_search(
    model_dir: str | Path,
    *,
    tasks: Sequence[str],
    length: int,
    out: str | Path,
    config: ElasticConfig | None = None,
    msrs: Sequence[float] = DEFAULT_MSRS,
    start: str | None = None,
    step: int = 4,
    search_samples: int = 8,
    search_seed: int = 1,
    pack_tokens: int = 65536,
    samples: int = 50,
    batch_size: int = 16,
    device: str | None = None,
    dtype: str | None = None,
    echo: Callable[[str], None] | None = None,
) -> dict:
    """Search head sets of a model for ``tasks`` at ``length`` and write them to ``out`` (see the module docstring).

    Args:
        model_dir: folder of a Hugging Face causal LM and its tokenizer.
        tasks: task names (of any suite); several make a joint search.
        length: prompt tokens of the search and evaluation rows.
        out: the head-set JSON file to write.
        config: the elastic settings the sparse heads run with (default: `eval`'s, sink 64 + local 256 in blocks
            of 64).
        msrs: MSRs in (0, 1] at which to keep (and evaluate) the set reached.
        start: ``FILE@MSR``: prune from that point of an earlier search's path (`read_start`).
        step: heads moved to sparse attention per round at most.
        search_samples: search rows of each task.
        search_seed: seed of the search rows (the evaluation uses seed 0).
        pack_tokens: token budget of one forward of search rows.
        samples: evaluation rows of each task after the search; 0: no evaluation.
        batch_size: rows per generate call of the evaluation.
        device: ``cpu`` or ``cuda`` (default: cuda when available).
        dtype: ``float32`` or ``bfloat16`` (default: bfloat16 on CUDA, float32 on CPU).
        echo: where progress lines go (default: this module's logger, at INFO).

    Returns:
        What ``out`` holds: the run's header, settings and cross-entropies under full and all-sparse attention,
        ``rounds``, ``path`` and ``sets`` (``msr_asked``, ``full_heads``; evaluated: ``msr``, ``accuracy``,
        ``kept``, ``predictions``), and with an evaluation ``full_accuracy`` and ``sparse_accuracy``.

    Raises:
        InputError: an MSR outside (0, 1] or not above the start's, a step or sample count below its minimum, or a
            start searched on a model of another shape.
        ConfigError: see `read_start`.
    """
    from elastic_attention.evaluation.pipeline import DEFAULT_EVAL_CONFIG, load_backbone
    from elastic_attention.integration import attach, runtime_of

    echo = echo or logger.info
    msrs = _checked_msrs(msrs)
    if step < 1 or search_samples < 1 or samples < 0 or pack_tokens < 1:
        raise InputError(f"step, search_samples and pack_tokens must be at least 1 and samples at least 0, got "
                         f"{step}, {search_samples}, {pack_tokens}, {samples}")
    start_set, start_path = read_start(start) if start else (None, [])  # before the model loads: a bad file fails now
    config = config or DEFAULT_EVAL_CONFIG
    model, tokenizer = load_backbone(model_dir, device=device, dtype=dtype)
    attach(model, config)
    runtime = runtime_of(model)
    shape = (len(runtime.routed_layers), runtime.num_kv_heads)
    targets = _targets(msrs, shape, start, start_set, len(start_path))
    packs, rows = _search_packs(tokenizer, tasks, length, search_seed, search_samples, pack_tokens)
    device = next(model.parameters()).device
    result = _search(model, packs, device, shape, targets, step, start_set, start_path, out, echo,
                     settings={"model": str(model_dir), "tasks": list(tasks), "length": length,
                               "search_samples": search_samples, "search_seed": search_seed, "samples": samples,
                               "step": step, "shape": list(shape), "elastic": config.to_dict(), "start": start},
                     rows=len(rows))
    if samples > 0:
        _evaluate_sets(model, tokenizer, result, tasks, length, samples, batch_size, out, echo)
    return result


def format_search(result: dict) -> str:
    """One line per kept set of a `run_search` result: its MSR, sparse heads and, when evaluated, the share of full
    attention's accuracy it keeps per task."""
    total = result["shape"][0] * result["shape"][1]
    lines = []
    for entry in result["sets"]:
        sparse = total - int(torch.tensor(entry["full_heads"]).sum())
        line = f"MSR {entry['msr_asked']:.3f}: {sparse} of {total} KV heads sparse"
        if "kept" in entry:
            line += "; kept " + ", ".join(f"{task} {share:.0%}" for task, share in entry["kept"].items())
        lines.append(line)
    return "\n".join(lines)


def _checked_msrs(msrs: Sequence[float]) -> list[float]:
    msrs = [float(msr) for msr in msrs]
    if not msrs or any(not 0.0 < msr <= 1.0 for msr in msrs):
        raise InputError(f"the MSRs of a search must be numbers in (0, 1], got {msrs}")
    return msrs


def _targets(msrs: list[float], shape: tuple[int, int], start: str | None, start_set: torch.Tensor | None,
             start_sparse: int) -> dict[float, int]:
    """MSR asked -> the sparse heads it keeps the set at (at least one), checked against the start."""
    total = shape[0] * shape[1]
    targets = {msr: max(1, round(msr * total)) for msr in msrs}
    if start_set is not None:
        if tuple(start_set.shape) != shape:
            raise InputError(f"--start {start}: its sets are {list(start_set.shape)} ([layers, KV heads]), this "
                             f"model routes {list(shape)} (give a search of this model)")
        if any(target <= start_sparse for target in targets.values()):
            raise InputError(f"--msr {','.join(map(str, msrs))}: every MSR must lie above the start's "
                             f"({start_sparse / total:.3f})")
    return targets


def _search_packs(tokenizer, tasks: Sequence[str], length: int, seed: int, samples: int, pack_tokens: int):
    """The search rows (``samples`` of each task, drawn with ``seed``) and their packs."""
    from elastic_attention.evaluation.suites import suite_of
    from elastic_attention.rows import encode_row
    from elastic_attention.training.data import pack_rows

    rows = [row for task in tasks for row in suite_of(task).generate(task, length, seed, samples, tokenizer)]
    return pack_rows([encode_row(tokenizer, row) for row in rows], pack_tokens), rows


def _search(model, packs, device: torch.device, shape: tuple[int, int], targets: dict[float, int], step: int,
            start_set: torch.Tensor | None, start_path: list[list[int]], out: str | Path,
            echo: Callable[[str], None], settings: dict, rows: int) -> dict:
    """Run the greedy search, writing ``out`` after every round and once more with the kept sets."""
    from elastic_attention.bench.timing import run_header
    from elastic_attention.io import atomic_write_text

    total = shape[0] * shape[1]
    per_task = task_cross_entropy(model, packs, device)
    full_tasks = per_task(torch.ones(shape, dtype=torch.bool))
    sparse_tasks = per_task(torch.zeros(shape, dtype=torch.bool))
    full_score, sparse_score = mean_over_tasks(full_tasks), mean_over_tasks(sparse_tasks)
    echo(f"answer cross-entropy: full {full_score:.4f}, all sparse {sparse_score:.4f} ({len(packs)} packs of "
         f"{rows} rows)")
    result = {
        **run_header(device), **settings,
        "cross_entropy_full": full_score, "cross_entropy_sparse": sparse_score,
        "task_cross_entropy_full": full_tasks, "task_cross_entropy_sparse": sparse_tasks,
        "rounds": [], "path": list(start_path),
    }
    started = time.perf_counter()

    def report(record: dict) -> None:  # each round is written as it ends, should the search be cut
        record["seconds"] = round(time.perf_counter() - started, 1)  # since the search's first round began
        echo(f"  {record['sparse_heads']:3d} sparse heads (MSR {record['sparse_heads'] / total:.3f}): "
             f"score {record['score']:.4f}, moved {record['moved']}")
        result["rounds"].append(record)
        result["path"].extend(record["moved"])
        atomic_write_text(out, json.dumps(result, indent=1))

    score = joint_score(per_task)
    sets, _ = greedy_prune(score, shape, sorted(targets.values()), step, on_round=report, start=start_set)
    result["sets"] = [{"msr_asked": msr, "full_heads": sets[target].tolist()} for msr, target in targets.items()]
    atomic_write_text(out, json.dumps(result, indent=1))  # the search alone, should the evaluation be cut
    return result


def _evaluate_sets(model, tokenizer, result: dict, tasks: Sequence[str], length: int, samples: int,
                   batch_size: int, out: str | Path, echo: Callable[[str], None]) -> None:
    """Evaluate full attention, all-sparse and every kept set (seed 0, ``samples`` rows of each task) into
    ``result``, rewriting ``out`` after each set."""
    from elastic_attention.evaluation.runner import run_evaluation
    from elastic_attention.io import atomic_write_text

    baseline = run_evaluation(model, tokenizer, modes=["full", "sparse"], tasks=tasks, lengths=[length],
                              samples=samples, batch_size=batch_size)
    full = {cell.task: cell.accuracy for cell in baseline if cell.mode == "full"}
    result["full_accuracy"] = full
    result["sparse_accuracy"] = {cell.task: cell.accuracy for cell in baseline if cell.mode == "sparse"}
    for entry in result["sets"]:
        cells = run_evaluation(model, tokenizer, modes=["heads"], tasks=tasks, lengths=[length], samples=samples,
                               static_routing=torch.tensor(entry["full_heads"]), batch_size=batch_size)
        kept = {cell.task: cell.accuracy / full[cell.task] if full[cell.task] else math.nan for cell in cells}
        echo(f"MSR {cells[0].msr:.3f}: " + ", ".join(f"{cell.task} {cell.accuracy:.3f} ({kept[cell.task]:.0%} of "
                                                   f"full attention's {full[cell.task]:.3f})" for cell in cells))
        entry.update(msr=cells[0].msr, accuracy={cell.task: cell.accuracy for cell in cells}, kept=kept,
                     predictions={cell.task: cell.predictions for cell in cells})
        atomic_write_text(out, json.dumps(result, indent=1))
