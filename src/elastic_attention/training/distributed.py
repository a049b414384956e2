"""Process-group setup and FSDP2 helpers of the router trainer (torchrun: DDP-style or FSDP2-sharded backbone)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def distributed_rank() -> tuple[int, int]:
    """(rank, world size); joins the process group under torchrun (gloo on CPU, NCCL on CUDA)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return 0, 1
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() and os.environ.get("ELASTIC_DEVICE") != "cpu" else "gloo"
        dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size()


def training_device(name: str, rank: int) -> torch.device:
    """The device of this process: CPU, or the CUDA device of its local rank."""
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    index = int(os.environ.get("LOCAL_RANK", rank)) if torch.cuda.device_count() > 1 else 0
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def shard_backbone(model, reshard_after_forward: bool = True) -> None:
    """FSDP2: shard every decoder layer (routers included) and the root over the process group.

    ``reshard_after_forward=False`` keeps each layer's gathered weights from its forward to its backward.
    """
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer, reshard_after_forward=reshard_after_forward)
    fully_shard(model, reshard_after_forward=reshard_after_forward)


def is_sharded(parameter: torch.Tensor) -> bool:
    """True for an FSDP2 (DTensor) parameter, whose gradient FSDP reduces itself."""
    return type(parameter).__name__ == "DTensor" or type(getattr(parameter, "data", None)).__name__ == "DTensor"


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a possibly sharded one (a collective for DTensors: call it on every process)."""
    tensor = tensor.detach()
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def copy_into(parameter: torch.Tensor, value: torch.Tensor) -> None:
    """Copy a whole tensor into a parameter, sharding it first when the parameter is a DTensor."""
    if hasattr(parameter, "full_tensor"):
        from torch.distributed.tensor import distribute_tensor

        parameter.copy_(distribute_tensor(value.to(parameter.dtype), parameter.device_mesh, parameter.placements))
    else:
        parameter.copy_(value)
