"""Trainer checkpoints: tensors in safetensors, scalars in JSON, each checkpoint folder published atomically."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from elastic_attention.errors import ConfigError
from elastic_attention.integration import routers_of
from elastic_attention.io import atomic_folder, atomic_write_text
from elastic_attention.training.distributed import copy_into, full_tensor

LATEST = "latest"


def save_checkpoint(directory: Path, step: int, tensors: dict[str, torch.Tensor], scalars: dict[str, Any]) -> Path:
    """Write ``directory/step-NNNNNN`` through a temporary folder and a rename, then point ``latest`` at it."""
    final = directory / f"step-{step:06d}"
    with atomic_folder(final, ".staging-") as staging:
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, staging / "state.safetensors")
        (staging / "state.json").write_text(json.dumps({"step": step, **scalars}, indent=2))
    atomic_write_text(directory / LATEST, final.name)
    return final


def load_latest(directory: Path) -> tuple[int, dict[str, torch.Tensor], dict[str, Any]] | None:
    """(step, tensors, scalars) of the newest checkpoint under ``directory``, or None when there is none.

    Raises:
        ConfigError: the checkpoint that ``latest`` names cannot be read (the message names it and the way out).
    """
    pointer = directory / LATEST
    if not pointer.exists():
        return None
    folder = directory / pointer.read_text().strip()
    try:
        scalars = json.loads((folder / "state.json").read_text())
        tensors = load_file(folder / "state.safetensors")
    except Exception as error:  # a missing, truncated or foreign file: name it
        raise ConfigError(
            f"the latest checkpoint {folder} cannot be read ({error}); remove it and point {pointer} at an earlier "
            "step-NNNNNN folder, or start the run again with --overwrite"
        ) from None
    return int(scalars.pop("step")), tensors, scalars


def flatten_optimizer(state: dict) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """An optimizer state dict as flat tensors plus JSON-able param groups."""
    tensors = {}
    for index, values in state["state"].items():
        for key, value in values.items():
            tensors[f"optimizer.{index}.{key}"] = torch.as_tensor(value)
    return tensors, state["param_groups"]


def unflatten_optimizer(tensors: dict[str, torch.Tensor], param_groups: list[dict]) -> dict:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in tensors.items():
        if name.startswith("optimizer."):
            _, index, key = name.split(".", 2)
            state.setdefault(int(index), {})[key] = value
    return {"state": state, "param_groups": param_groups}


def training_state(model, objective: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """What a router run's checkpoint keeps as tensors: the trainable (router) parameters of ``model`` (whole, when
    sharded), its routers' buffers, the objective's multipliers and the optimizer's state, by name."""
    tensors = {f"router.{name}": full_tensor(p) for name, p in model.named_parameters() if p.requires_grad}
    tensors.update({f"objective.{name}": p.detach() for name, p in objective.named_parameters()})
    tensors.update({f"router_buffer.{name}": b.detach() for name, b in router_buffers(model).items()})
    optimizer_tensors, _ = flatten_optimizer(optimizer.state_dict())
    tensors.update({name: full_tensor(value) for name, value in optimizer_tensors.items()})
    return tensors


def load_training_state(model, objective: torch.nn.Module, optimizer: torch.optim.Optimizer,
                        tensors: dict[str, torch.Tensor], param_groups: list[dict]) -> None:
    """Copy a checkpoint's `training_state` and optimizer param groups back into ``model``, ``objective`` and
    ``optimizer``."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.requires_grad:
                copy_into(parameter, tensors[f"router.{name}"])
        for name, buffer in router_buffers(model).items():
            buffer.copy_(tensors[f"router_buffer.{name}"])
        for name, parameter in objective.named_parameters():
            parameter.copy_(tensors[f"objective.{name}"])
    optimizer.load_state_dict(unflatten_optimizer(tensors, param_groups))


def router_buffers(model) -> dict[str, torch.Tensor]:
    """The routers' buffers (a standardizing router's input statistics), keyed ``{layer}.{name}``."""
    return {f"{index}.{name}": buffer for index, router in routers_of(model).items()
            for name, buffer in router.named_buffers()}
