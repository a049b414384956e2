"""Evaluation runner: accuracy (each task's score: exact match, or edit similarity for next_line) next to the sparsity that bought it, per mode, task and length.

Modes:
- ``full``: every routed head on retrieval attention (the backbone's own quality);
- ``elastic``: the trained routers decide per input;
- ``static``: a fixed head set from the retrieval-score ranking at a chosen MSR (DuoAttention / PruLong family);
  ``static@0.7`` names a static hybrid at a fixed MSR, so several can run side by side;
- ``heads``: a fixed head set given by the caller (for example one `elastic-attention search-heads` found);
  ``heads@0.4`` names the point at MSR 0.4 of a searched path, so several can run side by side;
- ``sparse``: every routed head on sparse attention.
All modes run through the same attached model and backend, so they differ only in routing. Rows come from the suite
that holds each task (:mod:`elastic_attention.evaluation.suites`), which also decodes and scores them; `rows.encode_row` encodes
them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from elastic_attention.errors import InputError
from elastic_attention.evaluation.row_cells import read_cell
from elastic_attention.evaluation.suites import suite_of
from elastic_attention.rows import Row, encode_row
from elastic_attention.integration import force_routing, routing_report

MODES = ("full", "elastic", "static", "sparse", "heads")


def is_static(mode: str) -> bool:
    """Whether ``mode`` is a static hybrid: ``static`` or ``static@MSR``."""
    return mode == "static" or mode.startswith("static@")


def is_heads(mode: str) -> bool:
    """Whether ``mode`` runs a given head set: ``heads`` or ``heads@MSR``."""
    return mode == "heads" or mode.startswith("heads@")


def is_fixed(mode: str) -> bool:
    """Whether ``mode`` runs a fixed head set (``static_routing``): a static hybrid or a given head set."""
    return is_static(mode) or is_heads(mode)


def fixed_msr_of(mode: str) -> float | None:
    """The MSR written in a ``static@MSR`` or ``heads@MSR`` mode; None for ``static`` and ``heads`` (chosen by the
    caller).

    Raises:
        InputError: ``static@`` or ``heads@`` followed by something that is not a number in [0, 1].
    """
    if mode in ("static", "heads"):
        return None
    kind, _, text = mode.partition("@")
    try:
        msr = float(text)
    except ValueError:
        raise InputError(f"mode {mode!r}: write a fixed MSR as {kind}@0.7") from None
    if not 0.0 <= msr <= 1.0:
        raise InputError(f"mode {mode!r}: the MSR must be in [0, 1]")
    return msr


def check_modes(modes: Iterable[str]) -> list[str]:
    """The modes, validated.

    Raises:
        InputError: an unknown mode (the message lists the known ones).
    """
    modes = list(modes)
    unknown = sorted(mode for mode in modes if mode not in MODES and not is_fixed(mode))
    if unknown:
        raise InputError(f"unknown evaluation modes {unknown}; choose from {list(MODES)}, static@MSR (static@0.7) or "
                         f"heads@MSR")
    for mode in filter(is_fixed, modes):
        fixed_msr_of(mode)
    if not modes:
        raise InputError(f"no evaluation modes given; choose from {list(MODES)}")
    return modes


@dataclass(frozen=True)
class CellResult:
    """Quality and sparsity of one (mode, task, length) cell.

    Attributes:
        mode: routing mode.
        task: task name.
        kind: ``"sensitive"`` or ``"robust"``.
        length: prompt length in tokens.
        samples: number of rows.
        accuracy: mean score in [0, 1] (exact match; edit similarity for code completion).
        exact_match: share of rows answered exactly.
        msr: mean model sparsity ratio over the rows.
        esr_last: mean effective sparsity of the last routed layer.
        esr_mean: mean effective sparsity over the routed layers.
        seconds: wall-clock time of the cell.
        head_full_share: [routed layers][Hkv] share of the rows that routed each KV head to full attention.
        predictions: the decoded answer of each row, in row order (for reading the misses).
        row_accuracy: each row's score, in row order.
        set_shares: with a head-set or signal router choosing (elastic mode), the share of the rows that ran each
            of its sets; else None.
        row_sets: with such a router, the set each row ran; else None.
        row_signals: with a `SignalSetRouter`, the retrieval signal each row was routed by; else None.
    """

    mode: str
    task: str
    kind: str
    length: int
    samples: int
    accuracy: float
    exact_match: float
    msr: float
    esr_last: float
    esr_mean: float
    seconds: float
    head_full_share: list[list[float]]
    predictions: list[str] = field(default_factory=list)
    row_accuracy: list[float] = field(default_factory=list)
    set_shares: list[float] | None = None
    row_sets: list[int] | None = None
    row_signals: list[float] | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@torch.no_grad()
def evaluate_rows(model: nn.Module, tokenizer, rows: list[Row], batch_size: int = 8) -> dict[str, list]:
    """Greedy answers for ``rows`` on an attached model, in left-padded batches.

    Every batch is padded to at least the rows' requested length (``metadata["length"]``), so the batches of one
    cell share their shape. Each row gets ``metadata["max_new_tokens"]`` new tokens where its suite sets it, else
    its answer's tokens plus one.

    Returns:
        ``{"accuracy": [...], "exact": [...], "prediction": [...], "msr": [...], "esr_last": [...],
        "esr_mean": [...], "decisions": [...], "sets": [...], "signals": [...]}``, one entry per row (decisions as
        [routed layers, Hkv] bool tensors; the set a head-set or signal router chose and the retrieval signal a signal
        router read, None where there is none).
    """
    device = next(model.parameters()).device
    keys = ("accuracy", "exact", "prediction", "msr", "esr_last", "esr_mean", "decisions", "sets", "signals")
    results: dict[str, list] = {key: [] for key in keys}
    for start in range(0, len(rows), batch_size):
        batch_rows = rows[start : start + batch_size]
        suites = [suite_of(row.task) for row in batch_rows]
        encoded = [encode_row(tokenizer, row) for row in batch_rows]
        width = max([len(ids.prompt_ids) for ids in encoded] + [row.metadata.get("length", 0) for row in batch_rows])
        input_ids = torch.full((len(encoded), width), tokenizer.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for row_index, ids in enumerate(encoded):
            input_ids[row_index, width - len(ids.prompt_ids) :] = torch.tensor(ids.prompt_ids)
            attention_mask[row_index, width - len(ids.prompt_ids) :] = 1
        new_tokens = max(row.metadata.get("max_new_tokens", len(ids.answer_ids) + 1)
                         for row, ids in zip(batch_rows, encoded))
        tokens = model.generate(
            input_ids.to(device),
            attention_mask=attention_mask.to(device),
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        report = routing_report(model)
        for row_index, (suite, row) in enumerate(zip(suites, batch_rows)):
            prediction = suite.decode(tokenizer, tokens[row_index, width:].tolist())
            scored = suite.score(prediction, row)
            results["accuracy"].append(scored.accuracy)
            results["exact"].append(float(scored.exact))
            results["prediction"].append(prediction)
        results["msr"].extend(report.msr.tolist())
        results["esr_last"].extend(report.esr_last.tolist())
        results["esr_mean"].extend(report.esr_mean.tolist())
        results["decisions"].extend(report.decisions.cpu())
        decision = None if report.head_sets is None else report.head_sets.decision
        results["sets"].extend([None] * len(batch_rows) if decision is None else decision.choice.tolist())
        signals = None if decision is None or decision.signal is None else decision.signal.tolist()
        results["signals"].extend([None] * len(batch_rows) if signals is None else signals)
    return results


def suite_rows(tokenizer, tasks: Iterable[str], lengths: Iterable[int], samples: int, seed: int = 0,
               rows_dir: str | Path | None = None) -> dict:
    """``{(task, length): rows}``: ``samples`` rows of each task at each length, read from ``rows_dir`` where it
    holds that cell (`row_cells`, checked against the task, length, seed and tokenizer), else from the task's
    suite."""
    rows = {}
    for task in tasks:
        for length in lengths:
            cell = None if rows_dir is None else read_cell(rows_dir, task=task, length=length, seed=seed,
                                                           samples=samples, tokenizer=tokenizer)
            rows[(task, length)] = cell if cell is not None else suite_of(task).generate(task, length, seed, samples,
                                                                                          tokenizer)
    return rows


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
    rows: dict | None = None,
) -> list[CellResult]:
    """Evaluate an attached model over modes x tasks x lengths.

    Args:
        model: a causal LM with elastic attention attached (trained routers for the ``elastic`` mode).
        tokenizer: the tokenizer the rows are rendered with (the suite's, or the model's own for the code suite).
        modes: `MODES`, ``static@MSR`` or ``heads@MSR`` (the fixed modes take ``static_routing``).
        tasks: task names (of any suite).
        lengths: prompt lengths in tokens.
        samples: rows per (task, length); the same rows for every mode.
        seed: suite seed.
        static_routing: [routed layers, Hkv] bool head set for the fixed modes (True = full attention).
        batch_size: rows per generate call.
        on_cell: called after each cell (progress reporting).
        rows: the rows of every (task, length), as `suite_rows` makes them (generated here when None).

    Returns:
        One `CellResult` per (mode, task, length), in that nesting order.
    """
    modes, tasks, lengths = check_modes(modes), list(tasks), list(lengths)
    if any(is_fixed(mode) for mode in modes) and static_routing is None:
        raise InputError(f"modes {[mode for mode in modes if is_fixed(mode)]} need a head set: pass static_routing "
                         f"(see head_ranking.static_routing)")
    forced = {"full": "full", "sparse": "sparse", "elastic": None}
    if rows is None:
        rows = suite_rows(tokenizer, tasks, lengths, samples, seed)
    results = []
    try:
        for mode in modes:
            force_routing(model, static_routing if is_fixed(mode) else forced[mode])
            for task in tasks:
                for length in lengths:
                    started = time.perf_counter()
                    cell = evaluate_rows(model, tokenizer, rows[(task, length)], batch_size)
                    result = CellResult(
                        mode=mode,
                        task=task,
                        kind=suite_of(task).kind(task),
                        length=length,
                        samples=samples,
                        accuracy=_mean(cell["accuracy"]),
                        exact_match=_mean(cell["exact"]),
                        msr=_mean(cell["msr"]),
                        esr_last=_mean(cell["esr_last"]),
                        esr_mean=_mean(cell["esr_mean"]),
                        seconds=time.perf_counter() - started,
                        head_full_share=torch.stack(cell["decisions"]).float().mean(0).tolist(),
                        predictions=cell["prediction"],
                        row_accuracy=cell["accuracy"],
                        **_set_fields(model, cell),
                    )
                    results.append(result)
                    if on_cell is not None:
                        on_cell(result)
    finally:
        force_routing(model, None)
    return results


def _set_fields(model: nn.Module, cell: dict) -> dict:
    """A cell's ``set_shares``, ``row_sets`` and ``row_signals`` (`CellResult`), from its rows' choices."""
    if not cell["sets"] or cell["sets"][0] is None:
        return {}
    report = routing_report(model).head_sets
    choices = len(report.set_msrs)
    shares = [sum(choice == index for choice in cell["sets"]) / len(cell["sets"]) for index in range(choices)]
    signals = cell["signals"] if cell["signals"][0] is not None else None
    return {"set_shares": shares, "row_sets": cell["sets"], "row_signals": signals}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")
