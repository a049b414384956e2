"""`elastic-attention eval`: load a model (and routers), evaluate the modes, write table, JSON and plot."""

from __future__ import annotations

import datetime
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from elastic_attention.adapters import load_router
from elastic_attention.config import ElasticConfig
from elastic_attention.errors import InputError
from elastic_attention.evaluation.head_ranking import retrieval_scores, static_routing
from elastic_attention.evaluation.reporting import format_table, plot_accuracy_vs_msr, write_json
from elastic_attention.evaluation.runner import CellResult, run_evaluation
from elastic_attention.evaluation.tasks import ROBUST_TASKS, SENSITIVE_TASKS, TASKS, generate
from elastic_attention.integration import attach, runtime_of

logger = logging.getLogger(__name__)

#: Sparse window of the suite's evaluations: much smaller than the contexts (SSA-256 with a 64-token sink).
DEFAULT_EVAL_CONFIG = ElasticConfig(block_size=64, sink_tokens=64, local_tokens=256, xa_stride=16)


def resolve_tasks(names: Sequence[str]) -> list[str]:
    """Task names, with the groups ``all``, ``sensitive`` and ``robust`` expanded.

    Raises:
        InputError: an unknown task name.
    """
    groups = {"all": SENSITIVE_TASKS + ROBUST_TASKS, "sensitive": SENSITIVE_TASKS, "robust": ROBUST_TASKS}
    tasks = [task for name in names for task in groups.get(name, (name,))]
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown:
        raise InputError(f"unknown tasks {unknown}; known: {sorted(TASKS)} or all / sensitive / robust")
    return list(dict.fromkeys(tasks))


def load_backbone(model_dir: str | Path, device: str | None = None) -> tuple[nn.Module, object]:
    """A causal LM and its tokenizer from a local folder, float32 on CPU and bfloat16 on CUDA, eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return model, tokenizer


def rank_heads(model: nn.Module, tokenizer, length: int, samples: int, seed: int) -> torch.Tensor:
    """Retrieval scores [layers, Hkv] over needle rows of every sensitive needle task at ``length``."""
    rows = [row for task in SENSITIVE_TASKS if task.startswith("needle")
            for row in generate(task, length, seed + 7919, samples)]
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
    config: ElasticConfig = DEFAULT_EVAL_CONFIG,
    seed: int = 0,
    batch_size: int = 8,
    progress: bool = True,
) -> tuple[list[CellResult], dict]:
    """Evaluate ``modes`` on a plain (not yet attached) model.

    With ``router``, the model is attached with the adapter's configuration (``config`` is then unused); without,
    with ``config`` and untrained routers (fine for the full, static and sparse modes). The static mode keeps the top
    retrieval-score heads on full attention at ``static_msr``; when that is None and ``elastic`` runs too, the static
    hybrid takes the elastic run's average MSR (the paper's comparison).

    Returns:
        (results, context): the cells and a dict of what was used (static MSR, head set, config).
    """
    context: dict = {}
    scores = None
    if "static" in modes:
        scores = rank_heads(model, tokenizer, lengths[0], max(4, samples // 2), seed)
        context["retrieval_scores"] = scores.tolist()
    if router is not None:
        load_router(model, router)
    else:
        attach(model, config)
    context["elastic_config"] = runtime_of(model).config.to_dict()
    ordered = [mode for mode in ("full", "elastic", "sparse", "static") if mode in modes]
    results: list[CellResult] = []
    bar = _progress(len(ordered) * len(tasks) * len(lengths), progress)
    for mode in ordered:
        routing = None
        if mode == "static":
            if static_msr is None:
                elastic = [r.msr for r in results if r.mode == "elastic"]
                if not elastic:
                    raise ValueError("the static mode needs --static-msr, or the elastic mode to take its MSR from")
                static_msr = sum(elastic) / len(elastic)
            routed = runtime_of(model).routed_layers
            routing = static_routing(scores[list(routed)], static_msr)
            context["static_msr"] = static_msr
            context["static_heads"] = routing.tolist()
        results += run_evaluation(
            model, tokenizer, modes=[mode], tasks=tasks, lengths=lengths, samples=samples, seed=seed,
            static_routing=routing, batch_size=batch_size, on_cell=lambda cell: _advance(bar, cell),
        )
    if bar is not None:
        bar.close()
    return results, context


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
) -> str:
    """Everything `elastic-attention eval` does; returns the printed table."""
    model, tokenizer = load_backbone(model_dir, device)
    results, context = evaluate_model(
        model, tokenizer, router=router, modes=modes, tasks=tasks, lengths=lengths, samples=samples,
        static_msr=static_msr, seed=seed, batch_size=batch_size,
    )
    out_dir = Path(out)
    write_json(
        results,
        out_dir / "eval.json",
        command=" ".join(sys.argv),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        device=_device_name(next(model.parameters()).device),
        model=str(model_dir),
        router=router,
        **context,
    )
    plot_accuracy_vs_msr(results, out_dir / "accuracy_vs_msr.png")
    return format_table(results) + f"\n\nwrote {out_dir / 'eval.json'} and {out_dir / 'accuracy_vs_msr.png'}"


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="eval", unit="cell", file=sys.stderr)


def _advance(bar, cell: CellResult) -> None:
    if bar is not None:
        bar.set_postfix_str(f"{cell.mode} {cell.task} {cell.length}: acc {cell.accuracy:.2f} msr {cell.msr:.2f}")
        bar.update(1)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"
