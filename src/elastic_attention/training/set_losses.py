"""The losses of a head-set router's training packs under each of its sets, kept in a file (safetensors).

Under ``head_set_objective: expected`` a pack runs once under each of the C sets, without gradients, and every later
step reads only these numbers and what the router reads (the pooled keys of layer 0). The backbone is frozen and the
sets are fixed, so a run with the same model, data and sets would compute the same numbers again: a run writes them
(`save_set_losses`, ``set_losses.safetensors`` in its folder) and a later run given the file (``set_losses_file``)
starts from them, so that trying other targets, temperatures or learning rates costs only the router's steps: no
forward of the backbone at all when every pack is in the file (the routers' input statistics come from the file
too), on a CPU as well. A run under ``distributed: ddp`` writes the packs of its first process only; a run reading
the file runs the others' forwards. The losses do not depend on what the router reads: a run that pools other spans
than the file's (``pool_first``, ``pool_last``) keeps the losses and reads its router's inputs again, each pack's
forward stopping at layer 0's keys.

Tensors, for the i-th pack of the run's pack list: ``{i}.losses`` [N, C] float32 (each sample's summed token loss
under each set), ``{i}.router_input`` [N, Hkv, D] float32, ``{i}.tokens`` [N] int64 (supervised tokens per sample).
Metadata: ``tasks`` (per saved pack, its samples' tasks), ``digests`` (per saved pack, the SHA-256 of its input_ids)
and ``set_msrs``, which a reading run checks against its own packs and sets, and ``router_pooling`` ([pool_first,
pool_last] of the router inputs; files written before it was recorded lack it, and a reading run treats their inputs
as unknown).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from elastic_attention.errors import ConfigError
from elastic_attention.io import atomic_write_bytes

FORMAT = "elastic-attention set losses 1"


def save_set_losses(path: str | Path, packs: list, set_losses: dict[int, tuple], set_msrs: list[float],
                    router_pooling: tuple[int, int]) -> Path:
    """Write the entries of ``set_losses`` (id(pack) -> (losses, router_input, tokens)) of the packs in ``packs``,
    by each pack's index there, atomically; ``router_pooling`` is the (pool_first, pool_last) of the inputs."""
    from safetensors.torch import save

    tensors, tasks, digests = {}, {}, {}
    for index, pack in enumerate(packs):
        if id(pack) not in set_losses:
            continue
        losses, router_input, tokens = set_losses[id(pack)]
        tensors.update({f"{index}.losses": losses.float().contiguous(),
                        f"{index}.router_input": router_input.float().contiguous(),
                        f"{index}.tokens": tokens.long().contiguous()})
        tasks[index], digests[index] = list(pack.tasks), _digest(pack)
    metadata = {"format": FORMAT, "tasks": json.dumps(tasks), "digests": json.dumps(digests),
                "set_msrs": json.dumps([float(msr) for msr in set_msrs]),
                "router_pooling": json.dumps([int(span) for span in router_pooling])}
    atomic_write_bytes(path, save(tensors, metadata=metadata))
    return Path(path)


def load_set_losses(path: str | Path, packs: list, set_msrs: list[float]) -> tuple[dict[int, tuple], tuple | None]:
    """(id(pack) -> (losses, router_input, tokens) for each pack of ``packs`` that the file at ``path`` holds,
    the (pool_first, pool_last) its router inputs were pooled with, None where the file does not say).

    Raises:
        ConfigError: not such a file, or one written for other packs (their tasks or tokens differ: another data
            config or tokenizer) or other sets (their MSRs differ).
    """
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
        if metadata.get("format") != FORMAT:
            raise ConfigError(f"set_losses_file {path} is not a set_losses.safetensors of a head-set run")
        written_msrs = json.loads(metadata["set_msrs"])
        if len(written_msrs) != len(set_msrs) or any(abs(a - b) > 1e-6 for a, b in zip(written_msrs, set_msrs)):
            raise ConfigError(f"set_losses_file {path} holds losses under sets of MSR {written_msrs}, this run's sets "
                              f"have {[round(float(msr), 6) for msr in set_msrs]}: give the file of a run with the "
                              "same head_set_choices_msrs (and extra sets)")
        tasks, digests = json.loads(metadata["tasks"]), json.loads(metadata["digests"])
        found = {}
        for key in tasks:
            index = int(key)
            if index >= len(packs) or tasks[key] != list(packs[index].tasks) or digests[key] != _digest(packs[index]):
                raise ConfigError(f"set_losses_file {path} was written for other packs (pack {index} differs): give "
                                  "the file of a run with the same model, data settings and tokenizer")
            found[id(packs[index])] = tuple(handle.get_tensor(f"{index}.{name}")
                                            for name in ("losses", "router_input", "tokens"))
    pooling = metadata.get("router_pooling")
    return found, None if pooling is None else tuple(json.loads(pooling))


def _digest(pack) -> str:
    ids = pack.input_ids.cpu().contiguous()
    return hashlib.sha256(str(tuple(ids.shape)).encode() + ids.numpy().tobytes()).hexdigest()
