"""Head-set files: a fixed choice of full-attention KV heads, as `scripts/head_set_search.py` writes them.

A file holds ``{"sets": [{"msr_asked": float, "full_heads": [[bool]]}, ...]}`` (one entry per MSR searched; each
``full_heads`` is [routed layers][KV heads], True = full attention). Training starts routers from one
(``initial_full_heads``) and `elastic-attention eval --modes heads --head-set FILE` evaluates one.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from elastic_attention.errors import ConfigError


def load_head_set(path: str | Path, msr: float | None = None, *, option: str = "head set",
                  msr_option: str = "msr") -> torch.Tensor:
    """One head set from a head-set file.

    Args:
        path: the JSON file.
        msr: the ``msr_asked`` of the set to return; ``None`` when the file holds exactly one set.
        option, msr_option: how the caller names the file and the MSR choice (in error messages).

    Returns:
        [routed layers, Hkv] bool tensor, True = full attention.

    Raises:
        ConfigError: no such file, not a head-set file, or no (single) set matching ``msr``.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"`{option}`: no file at {path} (give the --out file of scripts/head_set_search.py)")
    try:
        sets = json.loads(path.read_text(encoding="utf-8"))["sets"]
        asked = [float(entry["msr_asked"]) for entry in sets]
    except (ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"`{option}`: {path} is not a head_set_search result with a `sets` list "
                          f"({error!r})") from None
    if msr is None and len(sets) != 1:
        raise ConfigError(f"`{option}`: {path} holds the sets of MSR {asked}: pick one with `{msr_option}`")
    chosen = [entry for entry, value in zip(sets, asked) if msr is None or abs(value - msr) < 1e-9]
    if not chosen:
        raise ConfigError(f"`{msr_option}` {msr} is not among the sets of {path} (MSR {asked})")
    heads = torch.tensor(chosen[0]["full_heads"])
    if heads.dtype != torch.bool or heads.ndim != 2:
        raise ConfigError(f"`{option}`: the set of {path} must be a [layers][KV heads] list of booleans")
    return heads
