"""`elastic-attention eval`: load a model (and routers), evaluate the modes, write table, JSON and plot."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

from elastic_attention.adapters import load_router
from elastic_attention.config import ElasticConfig
from elastic_attention.errors import ConfigError, InputError
from elastic_attention.evaluation.head_ranking import retrieval_scores, static_routing
from elastic_attention.evaluation.reporting import command_and_date, write_json, write_table_and_plot
from elastic_attention.evaluation.runner import (
    CellResult,
    check_modes,
    fixed_msr_of,
    is_heads,
    is_static,
    run_evaluation,
    suite_rows,
)
from elastic_attention.evaluation.suites import get_suite, suite_of
from elastic_attention.folders import FolderLock, delete_moved, move_aside
from elastic_attention.head_sets import HeadSets
from elastic_attention.integration import attach, runtime_of, set_compile_decode

logger = logging.getLogger(__name__)

#: Sparse window of the suite's evaluations: much smaller than the contexts (SSA-256 with a 64-token sink).
DEFAULT_EVAL_CONFIG = ElasticConfig(block_size=64, sink_tokens=64, local_tokens=256, xa_stride=16)


def resolve_tasks(names: Sequence[str], suite: str = "synthetic") -> list[str]:
    """Task names of ``suite``, with the groups ``all``, ``sensitive`` and ``robust`` expanded.

    Raises:
        InputError: an unknown suite or task name.
    """
    return get_suite(suite).resolve(names)


def load_backbone(
    model_dir: str | Path, device: str | None = None, dtype: str | None = None
) -> tuple[nn.Module, object]:
    """A causal LM and its tokenizer from a local folder, in eval mode.

    Args:
        model_dir: the model's folder.
        device: ``cpu`` or ``cuda`` (default: cuda when available).
        dtype: ``float32`` or ``bfloat16`` (default: bfloat16 on CUDA, float32 on CPU).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dtype is None:
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    if dtype not in ("float32", "bfloat16"):
        raise InputError(f"`dtype` must be float32 or bfloat16, got {dtype!r}")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return model, tokenizer


def rank_heads(model: nn.Module, tokenizer, tasks: Sequence[str], length: int, samples: int, seed: int) -> torch.Tensor:
    """Retrieval scores [layers, Hkv] over the needle rows (the suite's ranking tasks) at ``length``.

    The rows use another seed than the evaluation's, so the static head set is not chosen on the evaluated rows.
    """
    suite = suite_of(tasks[0])
    if not suite.ranking_tasks:
        raise InputError(f"the {suite.name} suite ranks no heads (it is a held-out test): run the static modes on "
                         f"another suite's tasks, or give a searched set with --head-set")
    rows = [row for task in suite.ranking_tasks
            for row in suite.generate(task, length, seed + 7919, samples, tokenizer)]
    return retrieval_scores(model, tokenizer, rows)


def evaluate_model(
    model: nn.Module,
    tokenizer,
    *,
    router: str | Path | None,
    modes: Sequence[str],
    tasks: Sequence[str],
    lengths: Sequence[int],
    samples: int,
    static_msr: float | None = None,
    head_set: torch.Tensor | HeadSets | None = None,
    head_set_msr: float | None = None,
    config: ElasticConfig = DEFAULT_EVAL_CONFIG,
    seed: int = 0,
    batch_size: int = 8,
    progress: bool = True,
    on_cell: Callable[[list[CellResult], dict], None] | None = None,
    rows_dir: str | Path | None = None,
) -> tuple[list[CellResult], dict]:
    """Evaluate ``modes`` on a plain (not yet attached) model.

    With ``router``, the model is attached with the adapter's configuration (``config`` is then unused); without,
    with ``config`` and untrained routers (fine for the full, static and sparse modes). A static mode keeps the top
    retrieval-score heads on full attention: ``static@0.7`` at MSR 0.7, ``static`` at ``static_msr``, or, when that
    is None and ``elastic`` runs too, at the elastic run's average MSR (the paper's comparison). The head-set modes
    run ``head_set``, fixed sets found elsewhere: a [routed layers, Hkv] bool tensor (True = full attention), or the
    `HeadSets` of a head-set file, whose ``heads@0.4`` is its set at MSR 0.4 (a kept set or a point of its search
    path) and whose ``heads`` is its set at ``head_set_msr``, or, when that is None, the elastic run's average MSR
    (a file with a path, ``elastic`` among the modes) or its only set.

    ``on_cell(results, context)`` is called after each cell with everything so far (to write partial results, so
    a run cut short keeps every cell it finished). ``rows_dir`` holds row cells written beforehand
    (`elastic_attention.evaluation.row_cells`), read instead of generating those cells.

    Returns:
        (results, context): the cells and a dict of what was used (static MSRs and head sets, config).
    """
    modes = check_modes(modes)
    if "static" in modes and static_msr is None and "elastic" not in modes:  # before the ranking's forwards
        raise InputError("the static mode needs --static-msr, or the elastic mode to take its MSR from")
    head_sets = HeadSets.of(head_set) if isinstance(head_set, torch.Tensor) else head_set
    heads_at_elastic = check_head_set_modes(modes, head_sets, head_set_msr)
    context: dict = {}
    scores = None
    if any(is_static(mode) for mode in modes):
        scores = rank_heads(model, tokenizer, tasks, lengths[0], max(4, samples // 2), seed)
        context["retrieval_scores"] = scores.tolist()
    if router is not None:
        load_router(model, router)
    else:
        attach(model, config)
    # Compiled layers round differently: an answer must not depend on how many steps the cells before it decoded.
    set_compile_decode(model, False)
    runtime = runtime_of(model)
    context["elastic_config"] = runtime.config.to_dict()
    routed_shape = (len(runtime.routed_layers), runtime.num_kv_heads)
    if head_sets is not None and tuple(head_sets.shape) != routed_shape:  # force_routing would refuse it later
        raise InputError(f"the head set is {tuple(head_sets.shape)} ([layers, KV heads]) but the model routes "
                         f"{routed_shape}: give a set searched on this model")
    ordered = [mode for mode in ("full", "elastic", "sparse") if mode in modes]
    ordered += [mode for mode in modes if is_heads(mode)] + [mode for mode in modes if is_static(mode)]
    rows = suite_rows(tokenizer, tasks, lengths, samples, seed, rows_dir)
    results: list[CellResult] = []
    bar = _progress(len(ordered) * len(tasks) * len(lengths), progress)

    def elastic_msr() -> float:
        elastic = [r.msr for r in results if r.mode == "elastic"]
        return sum(elastic) / len(elastic)

    for mode in ordered:
        routing = None
        if is_static(mode):
            msr = fixed_msr_of(mode)
            msr = msr if msr is not None else static_msr if static_msr is not None else elastic_msr()
            routing = static_routing(scores[list(runtime.routed_layers)], msr)
            context.setdefault("static", {})[mode] = {"msr": msr, "heads": routing.tolist()}
        elif is_heads(mode):
            msr = elastic_msr() if mode == "heads" and heads_at_elastic else _heads_msr(mode, head_set_msr)
            routing = head_sets.at(msr, msr_option="--head-set-msr")
            context.setdefault("head_sets", {})[mode] = {"msr_asked": msr, "source": head_sets.source,
                                                         "heads": routing.tolist()}

        def finished(cell: CellResult) -> None:
            results.append(cell)
            _advance(bar, cell)
            if on_cell is not None:
                on_cell(results, context)

        run_evaluation(
            model, tokenizer, modes=[mode], tasks=tasks, lengths=lengths, samples=samples, seed=seed,
            static_routing=routing, batch_size=batch_size, on_cell=finished, rows=rows,
        )
    if bar is not None:
        bar.close()
    return results, context


def check_head_set_modes(modes: Sequence[str], head_sets: HeadSets | None, head_set_msr: float | None) -> bool:
    """Check that every head-set mode among ``modes`` has its set (before any forward); returns whether ``heads``
    takes the set at the elastic run's average MSR (known only once the elastic cells ran).

    Raises:
        InputError: a head-set mode without ``head_sets``.
        ConfigError: a set that is neither kept in the file nor reached by its path, or several sets and no MSR.
    """
    heads_at_elastic = ("heads" in modes and head_set_msr is None and "elastic" in modes
                        and head_sets is not None and bool(head_sets.path))
    if any(is_heads(mode) for mode in modes):
        if head_sets is None:
            raise InputError("the heads modes need a head set: --head-set FILE (the --out of "
                             "`elastic-attention search-heads`)")
        for mode in modes:
            if is_heads(mode) and not (mode == "heads" and heads_at_elastic):
                head_sets.at(_heads_msr(mode, head_set_msr), msr_option="--head-set-msr")
    return heads_at_elastic


def _heads_msr(mode: str, head_set_msr: float | None) -> float | None:
    """The MSR of a head-set mode's set: written in ``heads@MSR``, else ``head_set_msr`` (None: the only set)."""
    msr = fixed_msr_of(mode)
    return msr if msr is not None else head_set_msr


def run_eval_command(
    model_dir: str,
    *,
    router: str | None,
    modes: Sequence[str],
    tasks: Sequence[str],
    lengths: Sequence[int],
    samples: int,
    out: str,
    static_msr: float | None,
    seed: int,
    batch_size: int,
    device: str | None,
    dtype: str | None = None,
    head_set: HeadSets | None = None,
    head_set_msr: float | None = None,
    config: ElasticConfig = DEFAULT_EVAL_CONFIG,
    overwrite: bool = False,
    rows_dir: str | None = None,
) -> str:
    """Everything `elastic-attention eval` does; returns the printed table. ``config`` attaches the model when
    there is no ``router``. The ``out`` folder is claimed before the model loads (`claim_eval_folder`)."""
    out_dir = Path(out)
    settings = json.loads(json.dumps({
        "model": str(model_dir), "router": None if router is None else str(router), "modes": list(modes),
        "tasks": list(tasks), "lengths": list(lengths), "samples": samples, "seed": seed, "static_msr": static_msr,
        "head_set": None if head_set is None else head_set.source, "head_set_msr": head_set_msr, "dtype": dtype,
        "config": None if router is not None else config.to_dict(), "rows_dir": rows_dir,
    }))
    lock = claim_eval_folder(out_dir, settings, overwrite)
    try:
        model, tokenizer = load_backbone(model_dir, device, dtype)
        header = {
            **command_and_date(),
            "device": _device_name(next(model.parameters()).device),
            "model": str(model_dir),
            "router": router,
            "seed": seed,
            "settings": settings,
        }

        def save(results: list[CellResult], context: dict) -> None:
            write_json(results, out_dir / "eval.json", **header, **context)

        results, context = evaluate_model(
            model, tokenizer, router=router, modes=modes, tasks=tasks, lengths=lengths, samples=samples,
            static_msr=static_msr, head_set=head_set, head_set_msr=head_set_msr, config=config, seed=seed,
            batch_size=batch_size, on_cell=save, rows_dir=rows_dir,
        )
        return write_table_and_plot(results, out_dir)
    finally:
        lock.release()


#: What `run_eval_command` writes into its folder.
EVAL_OUTPUTS = ("eval.json", "eval.md", "accuracy_vs_msr.png")


def claim_eval_folder(out_dir: Path, settings: dict, overwrite: bool) -> FolderLock:
    """Make ``out_dir`` this evaluation's before any work: writable, held by this process, and cleared of an
    earlier evaluation's files as a whole, so its eval.json, eval.md and plot never describe different runs. An
    earlier evaluation with the same ``settings`` (a rerun, say after a cut) is replaced; one with other settings
    only with ``overwrite``.

    Returns:
        The held lock (release it when the evaluation ends).

    Raises:
        ConfigError: the folder cannot be written, another process holds it, or it holds another evaluation's
            results and ``overwrite`` is False.
    """
    lock = FolderLock(out_dir, "an evaluation").acquire()
    try:
        found = [name for name in EVAL_OUTPUTS if (out_dir / name).exists() or (out_dir / name).is_symlink()]
        if found and not overwrite:
            previous = _settings_of(out_dir / "eval.json")
            if previous != settings:
                differing = sorted(key for key in settings if previous is None or previous.get(key) != settings[key])
                raise ConfigError(f"{out_dir} holds the results of another evaluation ({', '.join(found)}; settings "
                                  f"that differ: {', '.join(differing) if previous else 'unknown'}); pass "
                                  f"--overwrite to replace them, or choose another --out")
        delete_moved(move_aside(out_dir, found))
    except BaseException:
        lock.release()
        raise
    return lock


def _settings_of(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("settings")
    except (OSError, ValueError, AttributeError):
        return None


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="eval", unit="cell", file=sys.stderr)


def _advance(bar, cell: CellResult) -> None:
    if bar is not None:
        peak = ""
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # the cell's peak, to size --batch-size
            peak = f" peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"
            torch.cuda.reset_peak_memory_stats()
        bar.set_postfix_str(f"{cell.mode} {cell.task} {cell.length}: acc {cell.accuracy:.2f} msr {cell.msr:.2f}{peak}")
        bar.update(1)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"
