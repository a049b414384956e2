"""Files shipped with the package: the tiny backbone trained on the synthetic suite (the demo's default model), the
Python standard-library snapshot of the code suite, and router adapters trained here for real models."""

from __future__ import annotations

from pathlib import Path

TINY_BACKBONE = Path(__file__).parent / "backbone_tiny"
#: lm-eval tasks over the synthetic suite for the tiny backbone (`elastic_attention.harness`).
LM_EVAL_TASKS = Path(__file__).parent / "lm_eval_tasks"
#: The folder of the shipped router adapters, one folder per model, named as `shipped_routers` lists them.
ROUTERS = Path(__file__).parent / "routers"
#: Routers for Qwen2.5-Coder-0.5B-Instruct trained on the code suite (configs/qwen2.5_coder_code_slow_multipliers.yaml).
QWEN_CODER_ROUTER = Path(__file__).parent / "routers" / "qwen2.5-coder-0.5b-instruct"
#: The router for Qwen2.5-Coder-1.5B-Instruct: a head-set router (one choice per prompt, from layer 0's keys pooled
#: over the first 40 and last 30 prompt tokens, among full attention, two points of the joint searched head set's
#: path and all-SSA) trained on the code suite with the distillation LM term, on the exact expectation over its sets
#: (configs/qwen2.5_coder_1.5b_code_head_set_router_pattern_held_out.yaml), float32.
QWEN_CODER_1_5B_ROUTER = Path(__file__).parent / "routers" / "qwen2.5-coder-1.5b-instruct"


def shipped_routers() -> list[str]:
    """The names of the router adapters shipped with the package (``qwen2.5-coder-1.5b-instruct``, ...), sorted."""
    return sorted(folder.name for folder in ROUTERS.iterdir() if (folder / "elastic_config.json").is_file())


def router_path(path: str | Path) -> Path:
    """``path`` itself where something exists there, else the shipped router of that name (`shipped_routers`).

    Raises:
        FileNotFoundError: nothing at ``path`` and no shipped router of that name; the message lists the names.
    """
    found = Path(path)
    if found.exists():
        return found
    if str(path) in shipped_routers():
        return ROUTERS / str(path)
    raise FileNotFoundError(
        f"no router adapter at {path}: give an adapter folder (save_router writes one) or a shipped router's name "
        f"({', '.join(shipped_routers())})"
    )
