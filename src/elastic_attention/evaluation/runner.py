"""Evaluation runner: exact-match accuracy next to the sparsity that bought it, per mode, task and length.

Modes:
- ``full``: every routed head on retrieval attention (the backbone's own quality);
- ``elastic``: the trained routers decide per input;
- ``static``: a fixed head set from the retrieval-score ranking at a chosen MSR (DuoAttention / PruLong family);
- ``sparse``: every routed head on sparse attention.
All modes run through the same attached model and backend, so they differ only in routing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

import torch
from torch import nn

from elastic_attention.errors import InputError
from elastic_attention.evaluation.tasks import TaskRow, generate, score
from elastic_attention.evaluation.vocabulary import decode_answer, encode_row
from elastic_attention.integration import force_routing, routing_report

MODES = ("full", "elastic", "static", "sparse")


@dataclass(frozen=True)
class CellResult:
    """Quality and sparsity of one (mode, task, length) cell.

    Attributes:
        mode: routing mode.
        task: task name.
        length: prompt length in tokens.
        samples: number of rows.
        accuracy: exact-match accuracy in [0, 1].
        msr: mean model sparsity ratio over the rows.
        esr_last: mean effective sparsity of the last routed layer.
        esr_mean: mean effective sparsity over the routed layers.
        seconds: wall-clock time of the cell.
        head_full_share: [routed layers][Hkv] share of the rows that routed each KV head to full attention.
    """

    mode: str
    task: str
    length: int
    samples: int
    accuracy: float
    msr: float
    esr_last: float
    esr_mean: float
    seconds: float
    head_full_share: list[list[float]]

    def to_dict(self) -> dict:
        return asdict(self)


@torch.no_grad()
def evaluate_rows(model: nn.Module, tokenizer, rows: list[TaskRow], batch_size: int = 8) -> dict[str, list[float]]:
    """Greedy answers for ``rows`` on an attached model, in left-padded batches.

    Returns:
        ``{"correct": [...], "msr": [...], "esr_last": [...], "esr_mean": [...], "decisions": [...]}``, one entry
        per row (decisions as [routed layers, Hkv] bool tensors).
    """
    device = next(model.parameters()).device
    results: dict[str, list] = {"correct": [], "msr": [], "esr_last": [], "esr_mean": [], "decisions": []}
    for start in range(0, len(rows), batch_size):
        batch_rows = rows[start : start + batch_size]
        encoded = [encode_row(tokenizer, row) for row in batch_rows]
        width = max(len(prompt) for prompt, _ in encoded)
        input_ids = torch.full((len(encoded), width), tokenizer.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for row_index, (prompt, _) in enumerate(encoded):
            input_ids[row_index, width - len(prompt) :] = torch.tensor(prompt)
            attention_mask[row_index, width - len(prompt) :] = 1
        new_tokens = max(len(answer) for _, answer in encoded) + 1
        tokens = model.generate(
            input_ids.to(device),
            attention_mask=attention_mask.to(device),
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        report = routing_report(model)
        for row_index, row in enumerate(batch_rows):
            prediction = decode_answer(tokenizer, tokens[row_index, width:].tolist())
            results["correct"].append(float(score(prediction, row)))
        results["msr"].extend(report.msr.tolist())
        results["esr_last"].extend(report.esr_last.tolist())
        results["esr_mean"].extend(report.esr_mean.tolist())
        results["decisions"].extend(report.decisions.cpu())
    return results


def run_evaluation(
    model: nn.Module,
    tokenizer,
    *,
    modes: Iterable[str],
    tasks: Iterable[str],
    lengths: Iterable[int],
    samples: int,
    seed: int = 0,
    static_routing: torch.Tensor | None = None,
    batch_size: int = 8,
    on_cell: Callable[[CellResult], None] | None = None,
) -> list[CellResult]:
    """Evaluate an attached model over modes x tasks x lengths.

    Args:
        model: a causal LM with elastic attention attached (trained routers for the ``elastic`` mode).
        tokenizer: the suite tokenizer.
        modes: subset of `MODES`.
        tasks: task names of the suite.
        lengths: prompt lengths in tokens.
        samples: rows per (task, length); the same rows for every mode.
        seed: suite seed.
        static_routing: [routed layers, Hkv] bool head set for the ``static`` mode (True = full attention).
        batch_size: rows per generate call.
        on_cell: called after each cell (progress reporting).

    Returns:
        One `CellResult` per (mode, task, length), in that nesting order.
    """
    modes, tasks, lengths = list(modes), list(tasks), list(lengths)
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise InputError(f"unknown evaluation modes {unknown}; choose from {list(MODES)}")
    if "static" in modes and static_routing is None:
        raise InputError("the static mode needs a head set: pass static_routing (see head_ranking.static_routing)")
    forced = {"full": "full", "sparse": "sparse", "elastic": None, "static": static_routing}
    rows = {(task, length): generate(task, length, seed, samples) for task in tasks for length in lengths}
    results = []
    try:
        for mode in modes:
            force_routing(model, forced[mode])
            for task in tasks:
                for length in lengths:
                    started = time.perf_counter()
                    cell = evaluate_rows(model, tokenizer, rows[(task, length)], batch_size)
                    result = CellResult(
                        mode=mode,
                        task=task,
                        length=length,
                        samples=samples,
                        accuracy=_mean(cell["correct"]),
                        msr=_mean(cell["msr"]),
                        esr_last=_mean(cell["esr_last"]),
                        esr_mean=_mean(cell["esr_mean"]),
                        seconds=time.perf_counter() - started,
                        head_full_share=torch.stack(cell["decisions"]).float().mean(0).tolist(),
                    )
                    results.append(result)
                    if on_cell is not None:
                        on_cell(result)
    finally:
        force_routing(model, None)
    return results


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")
