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
Metadata: ``tasks`` (per saved pack, its samples' tasks), ``digests`` (per saved pack, the SHA-256 of its input_ids),
``set_msrs`` and ``set_digests`` (per set, the SHA-256 of its [R, Hkv] full-attention mask), which a reading run
checks against its own packs and sets (two sets of one MSR can hold other heads: files written before the sets'
digests were recorded are checked by MSR alone, with a warning), and ``router_pooling`` ([pool_first, pool_last] of
the router inputs; files written before it was recorded lack it, and a reading run treats their inputs as unknown).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import torch

from elastic_attention.errors import ConfigError
from elastic_attention.io import atomic_write_bytes

FORMAT = "elastic-attention set losses 1"

logger = logging.getLogger(__name__)


def save_set_losses(path: str | Path, packs: list, set_losses: dict[int, tuple], head_sets: torch.Tensor,
                    router_pooling: tuple[int, int]) -> Path:
    """Write the entries of ``set_losses`` (id(pack) -> (losses, router_input, tokens)) of the packs in ``packs``,
    by each pack's index there, atomically; ``head_sets`` [C, R, Hkv] are the sets the losses were computed under
    (nonzero = full attention), ``router_pooling`` the (pool_first, pool_last) of the inputs."""
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
                "set_msrs": json.dumps(_set_msrs(head_sets)), "set_digests": json.dumps(_set_digests(head_sets)),
                "router_pooling": json.dumps([int(span) for span in router_pooling])}
    atomic_write_bytes(path, save(tensors, metadata=metadata))
    return Path(path)


def load_set_losses(path: str | Path, packs: list, head_sets: torch.Tensor) -> tuple[dict[int, tuple], tuple | None]:
    """(id(pack) -> (losses, router_input, tokens) for each pack of ``packs`` that the file at ``path`` holds,
    the (pool_first, pool_last) its router inputs were pooled with, None where the file does not say), for a run
    whose sets are ``head_sets`` [C, R, Hkv].

    Raises:
        ConfigError: not such a file, or one written for other packs (their tasks or tokens differ: another data
            config or tokenizer) or other sets (their MSRs differ, or, where the file records them, their heads).
    """
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
        if metadata.get("format") != FORMAT:
            raise ConfigError(f"set_losses_file {path} is not a set_losses.safetensors of a head-set run")
        written_msrs, set_msrs = json.loads(metadata["set_msrs"]), _set_msrs(head_sets)
        if len(written_msrs) != len(set_msrs) or any(abs(a - b) > 1e-6 for a, b in zip(written_msrs, set_msrs)):
            raise ConfigError(f"set_losses_file {path} holds losses under sets of MSR {written_msrs}, this run's sets "
                              f"have {[round(float(msr), 6) for msr in set_msrs]}: give the file of a run with the "
                              "same head_set_choices_msrs (and extra sets)")
        if "set_digests" not in metadata:
            logger.warning("set_losses_file %s records no digests of its head sets (written before they were): its "
                           "sets are checked by MSR alone, so sets of the same MSRs with other heads would pass", path)
        else:
            differ = [index for index, (written, ours) in enumerate(zip(json.loads(metadata["set_digests"]),
                                                                         _set_digests(head_sets))) if written != ours]
            if differ:
                raise ConfigError(f"set_losses_file {path} holds losses under other head sets than this run's at "
                                  f"set{'s' if len(differ) > 1 else ''} {differ} (same MSRs, other heads): give the "
                                  "file of a run with the same sets (initial_full_heads, head_set_choices_msrs and "
                                  "extra sets)")
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


def _set_msrs(head_sets: torch.Tensor) -> list[float]:
    return (1.0 - (head_sets != 0).double().mean(dim=(1, 2))).tolist()


def _set_digests(head_sets: torch.Tensor) -> list[str]:
    return [_tensor_digest(mask) for mask in head_sets != 0]


def _digest(pack) -> str:
    return _tensor_digest(pack.input_ids)


def _tensor_digest(tensor: torch.Tensor) -> str:
    """SHA-256 of a tensor's shape and values."""
    values = tensor.cpu().contiguous()
    return hashlib.sha256(str(tuple(values.shape)).encode() + values.numpy().tobytes()).hexdigest()
