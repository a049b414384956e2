"""`ElasticConfig`: what an Elastic Attention layer does, validated once on construction."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elastic_attention.errors import ConfigError

FORMAT_VERSION = 1

#: Attention modes a head can run. ``full``: causal attention over every key. ``ssa``: streaming sparse attention,
#: sink blocks plus a local window of blocks. ``xa``: XAttention, key blocks chosen per input by an antidiagonal
#: estimate.
MODES = ("full", "ssa", "xa")

#: Configurations, written {mode of retrieval heads}-{mode of sparse heads} as in the paper.
CONFIGURATIONS = {"fa-ssa": ("full", "ssa"), "fa-xa": ("full", "xa"), "xa-ssa": ("xa", "ssa")}


@dataclass(frozen=True)
class ElasticConfig:
    """Configuration of Elastic Attention for one model.

    Attributes:
        configuration: ``"fa-ssa"`` (main), ``"fa-xa"`` or ``"xa-ssa"``: the mode of heads the router sends to
            retrieval (class 1) and the mode of heads it sends to sparse attention (class 0).
        block_size: tokens per block for queries and keys; every pattern is defined on blocks.
        sink_tokens: SSA sink, the first tokens every query sees; a multiple of ``block_size`` (0 allowed).
        local_tokens: SSA local window; a multiple of ``block_size``, at least one block (the diagonal one).
        xa_stride: XAttention antidiagonal stride; divides ``block_size``.
        xa_threshold: XAttention kept-mass threshold tau in (0, 1].
        pool_first: number of leading prompt tokens the router pools.
        pool_last: number of trailing prompt tokens the router pools.
        router_width: hidden width multiplier of the router MLPs (hidden = router_width * head_dim).
        router_standardize: the router centres and scales its pooled keys per KV head (statistics measured on
            training data before the first step) and adds a learned per-head logit bias. Pooled keys differ far
            more between the heads of a layer than between tasks (about 10x on the shipped tiny backbone), which
            leaves the paper's router deciding per head, not per input; off (the paper's router) by default.
        routed_layers: indices of the decoder layers that carry a router; ``None``: every full-attention layer.
            Unrouted full-attention layers run full attention; a model's sliding-window layers keep its own
            attention.
        head_set_choices: ``None`` (the paper): one router per routed layer decides each KV head. C >= 2: one
            `HeadSetRouter`, in the first routed layer, chooses per prompt which of C head sets runs full attention
            (the sets travel with its weights).
        floor_set: with a head-set router, the safety floor: the index of the sparsest set that a prompt the router
            is unsure of may run (a searched set that keeps retrieval). ``None``: no floor.
        floor_confidence: with ``floor_set``, a prompt whose chosen set is sparser than the floor set and was chosen
            with a probability below this runs the most probable set that is no sparser than the floor set; in
            [0, 1] (0: the floor never acts). Calibrated on validation rows (`router.floor.floor_threshold`).
        signal_layer: with ``head_set_choices`` C, the routed layer whose retrieval signal chooses the set
            (`SignalSetRouter`: no learned weights) instead of a `HeadSetRouter` reading pooled keys; the sets agree
            on the routed layers before it. ``None``: a `HeadSetRouter`.
        signal_thresholds: with ``signal_layer``, the C - 1 thresholds on the signal, strictly decreasing in
            [0, 1]: a prompt with signal >= the first runs set 0 (the densest), ..., one below the last the sparsest
            set. Calibrated on validation rows; the last is the safety floor (a prompt above it never runs the
            sparsest set).
        signal_queries: with ``signal_layer``, how many of the prompt's last queries the signal measures.
        signal_statistic: with ``signal_layer``, ``"mean"`` or ``"max"``: how a KV head's signal summarizes the
            hidden mass of its query heads and measured queries (`router.retrieval_signal`).
    """

    configuration: str = "fa-ssa"
    block_size: int = 128
    sink_tokens: int = 128
    local_tokens: int = 2048
    xa_stride: int = 16
    xa_threshold: float = 0.9
    pool_first: int = 100
    pool_last: int = 100
    router_width: int = 4
    router_standardize: bool = False
    routed_layers: tuple[int, ...] | None = None
    head_set_choices: int | None = None
    floor_set: int | None = None
    floor_confidence: float = 0.0
    signal_layer: int | None = None
    signal_thresholds: tuple[float, ...] | None = None
    signal_queries: int = 64
    signal_statistic: str = "mean"

    def __post_init__(self) -> None:
        if self.configuration not in CONFIGURATIONS:
            raise ConfigError(
                f"`configuration` must be one of {sorted(CONFIGURATIONS)}, got {self.configuration!r}"
            )
        _require_int("block_size", self.block_size, minimum=1)
        _require_int("sink_tokens", self.sink_tokens, minimum=0)
        _require_int("local_tokens", self.local_tokens, minimum=self.block_size)
        for name in ("sink_tokens", "local_tokens"):
            value = getattr(self, name)
            if value % self.block_size:
                raise ConfigError(
                    f"`{name}` must be a multiple of `block_size` ({self.block_size}), got {value}; "
                    f"use {max(self.block_size, value // self.block_size * self.block_size)} or change `block_size`"
                )
        _require_int("xa_stride", self.xa_stride, minimum=1)
        if self.block_size % self.xa_stride:
            raise ConfigError(
                f"`xa_stride` must divide `block_size` ({self.block_size}), got {self.xa_stride}"
            )
        if isinstance(self.xa_threshold, bool) or not isinstance(self.xa_threshold, (int, float)):
            raise ConfigError(f"`xa_threshold` must be a number in (0, 1], got {self.xa_threshold!r}")
        if not 0.0 < float(self.xa_threshold) <= 1.0:
            raise ConfigError(f"`xa_threshold` must be in (0, 1], got {self.xa_threshold}")
        _require_int("pool_first", self.pool_first, minimum=0)
        _require_int("pool_last", self.pool_last, minimum=0)
        if self.pool_first + self.pool_last == 0:
            raise ConfigError("`pool_first` + `pool_last` must be at least 1, got 0 + 0")
        _require_int("router_width", self.router_width, minimum=1)
        if not isinstance(self.router_standardize, bool):
            raise ConfigError(f"`router_standardize` must be true or false, got {self.router_standardize!r}")
        if self.routed_layers is not None:
            layers = tuple(self.routed_layers)
            for index in layers:
                _require_int("routed_layers[*]", index, minimum=0)
            if len(set(layers)) != len(layers) or not layers:
                raise ConfigError(f"`routed_layers` must be a non-empty list of distinct indices, got {layers}")
            object.__setattr__(self, "routed_layers", tuple(sorted(layers)))
        if self.head_set_choices is not None:
            _require_int("head_set_choices", self.head_set_choices, minimum=2)
        self._check_floor()
        self._check_signal()

    def _check_signal(self) -> None:
        _require_int("signal_queries", self.signal_queries, minimum=1)
        if self.signal_statistic not in ("mean", "max"):
            raise ConfigError(f"`signal_statistic` must be 'mean' or 'max', got {self.signal_statistic!r}")
        if self.signal_layer is None:
            if self.signal_thresholds is not None:
                raise ConfigError("`signal_thresholds` needs `signal_layer`, the layer whose signal they split")
            return
        _require_int("signal_layer", self.signal_layer, minimum=0)
        if self.head_set_choices is None:
            raise ConfigError("`signal_layer` chooses among head sets: set `head_set_choices` too")
        if self.floor_set is not None:
            raise ConfigError("a signal router's last threshold is its safety floor: leave `floor_set` unset")
        thresholds = self.signal_thresholds
        if thresholds is None or isinstance(thresholds, (str, bytes)):
            raise ConfigError(f"`signal_layer` needs `signal_thresholds`: {self.head_set_choices - 1} numbers")
        thresholds = tuple(thresholds)
        if len(thresholds) != self.head_set_choices - 1 or any(
                isinstance(value, bool) or not isinstance(value, (int, float)) for value in thresholds):
            raise ConfigError(f"`signal_thresholds` must be {self.head_set_choices - 1} numbers (one fewer than "
                              f"`head_set_choices`), got {list(thresholds)!r}")
        values = tuple(float(value) for value in thresholds)
        if any(not 0.0 <= value <= 1.0 for value in values) or any(
                later >= earlier for earlier, later in zip(values, values[1:])):
            raise ConfigError(f"`signal_thresholds` must be strictly decreasing values in [0, 1], got {list(values)}")
        object.__setattr__(self, "signal_thresholds", values)

    def _check_floor(self) -> None:
        if isinstance(self.floor_confidence, bool) or not isinstance(self.floor_confidence, (int, float)) \
                or not 0.0 <= float(self.floor_confidence) <= 1.0:
            raise ConfigError(f"`floor_confidence` must be a number in [0, 1], got {self.floor_confidence!r}")
        if self.floor_set is None:
            if self.floor_confidence:
                raise ConfigError("`floor_confidence` needs `floor_set`, the set an unsure prompt falls back to")
            return
        if self.head_set_choices is None:
            raise ConfigError("`floor_set` is the safety floor of a head-set router: set `head_set_choices` too")
        _require_int("floor_set", self.floor_set, minimum=0)
        if self.floor_set >= self.head_set_choices:
            raise ConfigError(f"`floor_set` must index one of the {self.head_set_choices} head sets "
                              f"(0 to {self.head_set_choices - 1}), got {self.floor_set}")

    @property
    def retrieval_mode(self) -> str:
        """Mode of heads routed to class 1 (``"full"`` or ``"xa"``)."""
        return CONFIGURATIONS[self.configuration][0]

    @property
    def sparse_mode(self) -> str:
        """Mode of heads routed to class 0 (``"ssa"`` or ``"xa"``)."""
        return CONFIGURATIONS[self.configuration][1]

    @property
    def sink_blocks(self) -> int:
        return self.sink_tokens // self.block_size

    @property
    def local_blocks(self) -> int:
        return self.local_tokens // self.block_size

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form with a ``format_version`` key."""
        data = dataclasses.asdict(self)
        for name in ("routed_layers", "signal_thresholds"):
            if data[name] is not None:
                data[name] = list(data[name])
        return {"format_version": FORMAT_VERSION, **data}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ElasticConfig:
        """Inverse of `to_dict`; unknown keys and other format versions are errors."""
        data = dict(data)
        version = data.pop("format_version", None)
        if version != FORMAT_VERSION:
            raise ConfigError(
                f"elastic config format_version {version!r} is not supported (this release reads {FORMAT_VERSION})"
            )
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown elastic config fields {unknown}; known fields are {sorted(known)}")
        for name in ("routed_layers", "signal_thresholds"):
            if isinstance(data.get(name), list):
                data[name] = tuple(data[name])
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ElasticConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ConfigError(f"elastic config is not valid JSON: {error}") from error
        if not isinstance(data, dict):
            raise ConfigError(f"elastic config JSON must be an object, got {type(data).__name__}")
        return cls.from_dict(data)

    @classmethod
    def load(cls, path: str | Path) -> ElasticConfig:
        return cls.from_json(Path(path).read_text())


def _require_int(name: str, value: Any, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"`{name}` must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"`{name}` must be at least {minimum}, got {value}")
