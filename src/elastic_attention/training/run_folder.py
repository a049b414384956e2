"""A training run owns its output folder: a new run never mixes with an old one, a resumed run is the same run."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

from elastic_attention.errors import ConfigError
from elastic_attention.folders import FolderLock, delete_moved, move_aside
from elastic_attention.training.checkpoint import load_latest

logger = logging.getLogger(__name__)

#: What a router-training run writes into its folder.
RUN_ENTRIES = ("checkpoints", "metrics.csv", "summary.json", "router", "tensorboard", "training.png")

#: Settings of a router-training run that may change when it is resumed (where and how it runs, not what it
#: computes).
RESUMABLE_CHANGES = frozenset({"output_dir", "checkpoint_every", "device", "distributed", "gradient_checkpointing",
                               "fsdp_reshard_after_forward", "teacher_cache"})

#: Prefix of the staging folder a model is written into before it is renamed into the run folder.
MODEL_STAGING = ".staging-model-"


def claim_run_folder(folder: Path, *, resume: bool, overwrite: bool, is_main: bool,
                     entries: tuple[str, ...] = RUN_ENTRIES) -> FolderLock | None:
    """Make ``folder`` this run's: writable, held by this process alone (the main process holds the lock until
    the returned lock is released or the process ends), not holding another run (any of ``entries``, what a run
    writes) unless ``overwrite``, and cleared of the half-written folders (checkpoints, a saved model) a killed run
    left. An overwritten run's files are moved aside together (links moved, never followed) and deleted once this
    run holds the folder.

    Returns:
        The held lock on the main process, None on the others.

    Raises:
        ConfigError: the folder cannot be written, another process holds it, another run is there (and neither
            ``resume`` nor ``overwrite``), or both were asked.
    """
    if resume and overwrite:
        raise ConfigError("--resume continues the run in the folder and --overwrite replaces it: choose one")
    lock = FolderLock(folder, "a training run").acquire() if is_main else None
    try:
        found = [name for name in entries if (folder / name).exists() or (folder / name).is_symlink()]
        if found and not resume and not overwrite:
            raise ConfigError(
                f"{folder} holds another run ({', '.join(found)}); pass --overwrite to replace it, --resume to "
                "continue it, or choose another output_dir"
            )
        if is_main:
            if found and overwrite:
                delete_moved(move_aside(folder, found))
                logger.warning("--overwrite: removed the previous run's %s from %s", ", ".join(found), folder)
            for leftover in [*(folder / "checkpoints").glob(".staging-*"), *folder.glob(MODEL_STAGING + "*")]:
                shutil.rmtree(leftover, ignore_errors=True)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return lock


def check_resumable(saved: dict[str, Any], current: dict[str, Any], source: Path,
                    resumable: frozenset[str] = RESUMABLE_CHANGES) -> None:
    """Raise ConfigError naming every setting in which ``current`` differs from the checkpoint's ``saved`` config,
    except those in ``resumable`` (top-level keys)."""
    current = json.loads(json.dumps(current))  # tuples as lists, as the checkpoint holds them
    differences = [
        f"{name}: checkpoint {saved.get(name)!r}, now {current.get(name)!r}"
        for name in sorted(set(saved) | set(current))
        if name not in resumable and saved.get(name) != current.get(name)
    ]
    if differences:
        raise ConfigError(
            f"--resume: the checkpoint at {source} was made with other settings ({'; '.join(differences)}); resume "
            "with the run's settings, or start a new run in another output_dir"
        )


def load_for_resume(output_dir: Path, current: dict[str, Any], resumable: frozenset[str] = RESUMABLE_CHANGES):
    """(step, tensors, scalars) of a run folder's newest checkpoint (under ``checkpoints/``) once its config is
    checked against ``current`` (`check_resumable`); None, with a warning, when there is none."""
    found = load_latest(output_dir / "checkpoints")
    if found is None:
        logger.warning("--resume: no checkpoint under %s; starting from step 0", output_dir)
        return None
    check_resumable(found[2]["config"], current, output_dir / "checkpoints", resumable)
    return found
