"""Head-set files: fixed choices of full-attention KV heads, as `elastic-attention search-heads` writes them.

A file holds ``{"sets": [{"msr_asked": float, "full_heads": [[bool]]}, ...]}`` (one entry per MSR kept; each
``full_heads`` is [routed layers][KV heads], True = full attention) and, from a greedy search, the path it took:
``"path": [[layer, head], ...]``, every KV head in the order the search moved it to sparse attention (files written
before the path was recorded carry it as their ``rounds``' ``moved`` lists). Any point of the path is a head set:
at MSR m, the first round(m * layers * Hkv) heads of the path are sparse. Training starts routers from a set
(``initial_full_heads``); `elastic-attention eval --modes heads,heads@0.4 --head-set FILE` evaluates them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from elastic_attention.errors import ConfigError


@dataclass(frozen=True)
class HeadSets:
    """The head sets of one file (or one given set).

    Attributes:
        shape: (routed layers, Hkv).
        sets: MSR asked -> [layers, Hkv] bool set, True = full attention.
        path: (layer, KV head) pairs in the order a greedy search made them sparse; empty when unknown.
        source: how errors name where the sets came from.
    """

    shape: tuple[int, int]
    sets: dict[float, torch.Tensor]
    path: tuple[tuple[int, int], ...] = ()
    source: str = "the head set"

    @classmethod
    def of(cls, head_set: torch.Tensor) -> HeadSets:
        """One given [layers, Hkv] bool set, at the MSR its sparse heads make."""
        msr = float((~head_set).float().mean())
        return cls(shape=tuple(head_set.shape), sets={msr: head_set.clone()})

    @property
    def max_path_msr(self) -> float:
        """The largest MSR a point of the path reaches (0.0 without a path)."""
        return len(self.path) / (self.shape[0] * self.shape[1])

    def at(self, msr: float | None, msr_option: str = "msr") -> torch.Tensor:
        """The set at ``msr``: the kept set of that MSR, else the path's point with the nearest whole number of
        sparse heads; ``None`` when there is a single set.

        Raises:
            ConfigError: ``None`` with several sets, or an MSR that is neither kept nor reached by the path.
        """
        asked = sorted(self.sets)
        if msr is None:
            if len(self.sets) != 1:
                raise ConfigError(f"{self.source} holds the sets of MSR {asked}: pick one with `{msr_option}`")
            return next(iter(self.sets.values())).clone()
        for value, head_set in self.sets.items():
            if abs(value - msr) < 1e-9:
                return head_set.clone()
        total = self.shape[0] * self.shape[1]
        sparse = round(msr * total)
        if not self.path or sparse > len(self.path):
            reach = f" and the path's points up to MSR {self.max_path_msr:.3f}" if self.path else ""
            raise ConfigError(f"`{msr_option}` {msr} is not among the sets of {self.source} (MSR {asked}{reach})")
        head_set = torch.ones(self.shape, dtype=torch.bool)
        for layer, head in self.path[:sparse]:
            head_set[layer, head] = False
        return head_set


def read_head_sets(path: str | Path, *, option: str = "head set") -> HeadSets:
    """Every set of a head-set file, and its search path when it has one.

    Args:
        path: the JSON file.
        option: how the caller names the file (in error messages).

    Raises:
        ConfigError: no such file, not a head-set file, sets of different shapes, or a path that names a head
            twice or outside the sets' shape.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"`{option}`: no file at {path} (give the --out file of `elastic-attention search-heads`)")
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        sets = {float(entry["msr_asked"]): torch.tensor(entry["full_heads"]) for entry in document["sets"]}
        steps = document.get("path") or [head for record in document.get("rounds", []) for head in record["moved"]]
        order = tuple((int(layer), int(head)) for layer, head in steps)
    except (ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"`{option}`: {path} is not a head-set file (search-heads result) with a `sets` list "
                          f"({error!r})") from None
    shapes = {tuple(head_set.shape) for head_set in sets.values()}
    if not sets or any(head_set.dtype != torch.bool or head_set.ndim != 2 for head_set in sets.values()) \
            or len(shapes) != 1:
        raise ConfigError(f"`{option}`: each set of {path} must be a [layers][KV heads] list of booleans, all of "
                          f"one shape")
    (shape,) = shapes
    if len(set(order)) != len(order) or any(not (0 <= l < shape[0] and 0 <= h < shape[1]) for l, h in order):
        raise ConfigError(f"`{option}`: the path of {path} names a head twice or outside the sets' shape {shape}")
    return HeadSets(shape=shape, sets=sets, path=order, source=str(path))


def split_set_reference(entry: str, *, option: str) -> tuple[str, float]:
    """``"FILE@MSR"`` -> (FILE, MSR): one set of a head-set file, as configs and scripts name it.

    Raises:
        ConfigError: ``entry`` is not of that form (``option`` names where it was given).
    """
    file, separator, text = str(entry).rpartition("@")
    try:
        msr = float(text)
    except ValueError:
        separator = ""
    if not separator or not file:
        raise ConfigError(f"`{option}` entry {entry!r} is not FILE@MSR (e.g. search_multikey.json@0.5)")
    return file, msr


def load_head_set(path: str | Path, msr: float | None = None, *, option: str = "head set",
                  msr_option: str = "msr") -> torch.Tensor:
    """One head set from a head-set file: the set kept at ``msr``, a point of the file's path, or (``msr`` None)
    its only set.

    Returns:
        [routed layers, Hkv] bool tensor, True = full attention.

    Raises:
        ConfigError: see `read_head_sets` and `HeadSets.at`.
    """
    return read_head_sets(path, option=option).at(msr, msr_option=msr_option)
